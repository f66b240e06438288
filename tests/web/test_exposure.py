"""``lance-async serve`` exposed (issue 27): request heads, slow heads, a root that holds, TLS,
and no listening beyond loopback without authentication. Real uvicorn, httpx and raw sockets.

One module-scoped server without keys (it listens on 127.0.0.1) and a 4 s
head timeout (long enough to open 1,000 connections before the first one
times out, short enough for the tests that wait for it); its root holds a
link that leads out of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lance_async.web.auth import ApiKey, new_token
from lance_async.web.settings import ServeSettings, is_loopback

from .serving import Serve, entry_point, serve
from .test_fastapi import NDJSON, contents, kv_block, make_table, ndjson, version

HEAD_TIMEOUT = 4.0
MAX_HEAD = 32 * 1024  # the default
MiB = 1 << 20


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    base = tmp_path_factory.mktemp("exposed")
    root = base / "tables"
    root.mkdir()
    make_table(root / "kv.lance", kv_block(0, 10, 0))
    (base / "outside").mkdir()
    make_table(base / "outside" / "hidden.lance", kv_block(0, 10, 0))
    os.symlink("../outside/hidden.lance", root / "link.lance")
    os.symlink("kv.lance", root / "alias.lance")  # a link that stays inside: served
    srv = serve(root, base / "server.log", "--head-timeout", str(HEAD_TIMEOUT))
    try:
        yield srv
    finally:
        srv.stop()


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def status_of(data: bytes) -> int:
    assert data.startswith(b"HTTP/1.1 "), data[:200]
    return int(data.split()[1])


# -- header limits -----------------------------------------------------------------


def test_a_1_mb_header_is_a_431(exposed: Serve) -> None:
    with exposed.client() as client:
        response = client.get("/tables", headers={"x-big": "a" * 1_000_000})
        assert response.status_code == 431
        assert "larger than 32768 bytes" in response.json()["detail"]
        assert response.headers["connection"] == "close"
        just_under = client.get("/tables", headers={"x-pad": "a" * (MAX_HEAD - 512)})
        assert just_under.status_code == 200
    # the same on a raw socket that goes on sending after the refusal
    with socket.create_connection(("127.0.0.1", exposed.port), timeout=30) as sock:
        sock.sendall(b"GET /tables HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000)
        assert status_of(read_until_closed(sock)) == 431


@pytest.mark.parametrize("count", [101, 20_000])
def test_too_many_headers_are_a_431(exposed: Serve, count: int) -> None:
    head = b"GET /tables HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"x-%d: 1\r\n" % i for i in range(count)
    )
    with socket.create_connection(("127.0.0.1", exposed.port), timeout=30) as sock:
        sock.sendall(head + b"\r\n")
        data = read_until_closed(sock)
    assert status_of(data) == 431
    assert b"more than 100 header lines" in data or b"larger than 32768" in data
    with exposed.client() as client:  # 99 headers (and httpx's own) are fine
        ok = client.get("/tables", headers=[(f"x-{i}", "1") for i in range(90)])
        assert ok.status_code == 200


def test_keep_alive_and_pipelined_requests_still_work(exposed: Serve) -> None:
    with socket.create_connection(("127.0.0.1", exposed.port), timeout=30) as sock:
        request = b"GET /tables/kv/lookup/1 HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.sendall(request * 3)
        data = b""
        while data.count(b"HTTP/1.1 200") < 3:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk


# -- slow heads ----------------------------------------------------------------------


def test_heads_that_stall_are_a_408_and_closed(exposed: Serve) -> None:
    partials = [
        b"",  # a connection that sends nothing
        b"GET /tables HTTP/1.1\r\nHost: x\r\nX-Pad: abc",  # half a head
        # a first request answered, then half of a second one on the same connection
        b"GET /tables/kv/lookup/1 HTTP/1.1\r\nHost: x\r\n\r\nGET /tab",
    ]
    socks = []
    for partial in partials:  # all at once: one wait for all of them
        sock = socket.create_connection(("127.0.0.1", exposed.port), timeout=30)
        sock.sendall(partial)
        socks.append(sock)
    # a body the app never reads, trickled after its 200 one byte at a time:
    # uvicorn's keep-alive timer restarts on every byte, the head timeout does not
    trickled = socket.create_connection(("127.0.0.1", exposed.port), timeout=30)
    trickled.sendall(b"GET /tables/kv/lookup/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n")
    stop = threading.Event()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            while not stop.wait(0.25):
                trickled.sendall(b"x")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        with trickled:
            data = read_until_closed(trickled)
    finally:
        stop.set()
        thread.join()
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    assert status_of(data[data.index(b"HTTP/1.1 408") :]) == 408
    # the head timeout answered (when it does, never before its time, is
    # tests/web/test_head_clock.py's, on a virtual clock)
    for partial, sock in zip(partials, socks, strict=True):
        with sock:
            data = read_until_closed(sock)
        if partial.endswith(b"GET /tab"):
            assert data.startswith(b"HTTP/1.1 200"), data[:200]
            data = data[data.index(b"HTTP/1.1 408") :]
        assert status_of(data) == 408, data
        assert b"not complete within 4 s" in data


def open_half_sent(port: int, head: bytes, n: int) -> list[tuple[socket.socket, float]]:
    """``n`` connections, opened together (non-blocking connects), each sending
    ``head``; each with the time of its connect (the server's head timer starts
    no earlier: on a loaded machine the send came up to half a second later)."""
    socks = []
    for _ in range(n):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        connected = time.monotonic()
        sock.connect_ex(("127.0.0.1", port))
        socks.append((sock, connected))
    opened = []
    for sock, connected in socks:
        # poll, not select: descriptors past 1024 (a long test session holds many)
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        poller.poll(30_000)
        sock.setblocking(True)
        sock.settimeout(60)
        sock.sendall(head)
        opened.append((sock, connected))
    return opened


def test_1000_half_sent_requests_are_each_closed_and_memory_stays_flat(exposed: Serve) -> None:
    baseline_rss = exposed.rss()
    baseline_conns = exposed.connections()
    head = b"POST /tables/kv/merge HTTP/1.1\r\nHost: x\r\nContent-Type: " + NDJSON.encode()
    socks: list[tuple[socket.socket, float]] = []
    try:
        socks = open_half_sent(exposed.port, head + b"\r\nX-Pad: " + b"p" * 1024, 1000)
        # every one of them open on the server at once, before the first is answered
        first = select.poll()
        first.register(socks[0][0], select.POLLIN)
        while (open_now := exposed.connections()) < baseline_conns + 1000:
            assert not first.poll(0), (
                f"only {open_now - baseline_conns} of 1,000 connections were open on the "
                f"server before the first one timed out"
            )
            time.sleep(0.01)
        time.sleep(0.2)  # the heads they sent read too
        growth = exposed.rss() - baseline_rss
        statuses = []
        waits = []
        for sock, sent in socks:
            statuses.append(status_of(read_until_closed(sock)))
            waits.append(time.monotonic() - sent)
    finally:
        for sock, _ in socks:
            sock.close()
    print(
        f"\n1,000 half-sent heads: {open_now - baseline_conns} open at once, RSS growth "
        f"{growth / MiB:.1f} MiB, closed {min(waits):.2f}-{max(waits):.2f} s after connecting "
        f"(head timeout {HEAD_TIMEOUT} s)"
    )
    assert statuses == [408] * 1000
    assert growth < 50 * MiB
    with exposed.client() as client:
        assert client.get("/health").status_code == 200
    deadline = time.monotonic() + 30
    while exposed.connections() > baseline_conns + 5:  # all of them gone on the server too
        assert time.monotonic() < deadline, exposed.connections()
        time.sleep(0.1)


# -- the root ------------------------------------------------------------------------


def test_a_link_out_of_the_root_is_404_and_nothing_is_written_outside(exposed: Serve) -> None:
    hidden = exposed.root.parent / "outside" / "hidden.lance"
    before = version(hidden)
    files_before = sorted(p.relative_to(hidden) for p in hidden.rglob("*"))
    body = ndjson([{"id": 1, "value": 99, "name": "escaped"}])
    with exposed.client() as client:
        assert "link" not in client.get("/tables").json()
        assert client.get("/tables/link/rows").status_code == 404
        assert client.get("/tables/link/lookup/1").status_code == 404
        merged = client.post("/tables/link/merge", content=body, headers={"content-type": NDJSON})
        assert merged.status_code == 404
        assert merged.json()["error"] == "UnknownTableError"
        # a link inside the root is a table like any other
        assert client.get("/tables/alias/lookup/1").json()["row"]["value"] == 0
    assert version(hidden) == before
    assert sorted(p.relative_to(hidden) for p in hidden.rglob("*")) == files_before
    assert contents(hidden)[1] == (0, "n1")
    assert "leads out of the root" in exposed.log_text()


# -- TLS -----------------------------------------------------------------------------


def test_tls_from_the_settings_with_keys(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    token = new_token()
    keys = tmp_path / "keys.txt"
    keys.write_text(ApiKey.from_token("tls", "read", token).line() + "\n")
    root = tmp_path / "tables"
    root.mkdir()
    make_table(root / "kv.lance", kv_block(0, 3, 0))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    srv = serve(
        root,
        tmp_path / "server.log",
        "--api-keys-file",
        str(keys),
        "--ssl-certfile",
        str(cert_file),
        "--ssl-keyfile",
        str(key_file),
        scheme="https",
        verify=context,
    )
    try:
        with srv.client(token) as client:
            assert client.get("/tables/kv/lookup/2").json()["row"]["name"] == "n2"
        with srv.client() as anonymous:
            assert anonymous.get("/tables").status_code == 401
        with pytest.raises(httpx.HTTPError):  # plain http is not served
            httpx.get(f"http://127.0.0.1:{srv.port}/health", timeout=5)
    finally:
        srv.stop()
    assert f"https://127.0.0.1:{srv.port}; API keys required (1: tls)" in srv.log_text()


# -- binding beyond loopback -----------------------------------------------------------


def run_serves(*runs: tuple[list[str], dict[str, str] | None]) -> list[tuple[int, str]]:
    """``lance-async serve ARGS`` for each run, side by side: (exit code, stderr) of each."""
    procs = [
        subprocess.Popen(
            [entry_point(), "serve", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        for args, env in runs
    ]
    results = []
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        results.append((proc.returncode, err))
    return results


def test_a_public_address_without_auth_exits_2_with_one_line(tmp_path: Path) -> None:
    root = ["--root", str(tmp_path)]
    bad_keys = tmp_path / "keys.txt"
    bad_keys.write_text("ci write md5:abc\n")
    public, from_env, half_tls, keys = run_serves(
        ([*root, "--host", "0.0.0.0", "--allow-raw-sql"], None),
        (root, {"LANCE_ASYNC_SERVE_HOST": "0.0.0.0"}),
        ([*root, "--ssl-certfile", str(tmp_path / "c.pem")], None),
        ([*root, "--api-keys-file", str(bad_keys)], None),
    )
    for code, err in (public, from_env):
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "refusing to serve 0.0.0.0 without authentication" in lines[0]
        assert "--api-keys-file" in lines[0] and "--dangerously-serve-without-auth" in lines[0]
    assert half_tls[0] == 2 and "both --ssl-certfile and --ssl-keyfile" in half_tls[1]
    assert keys[0] == 2 and "line 1: expected 'ID SCOPE sha256:HEX'" in keys[1]


def test_what_counts_as_loopback_and_what_a_start_says() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.0.0.2") and is_loopback("::1")
    assert is_loopback("localhost") and is_loopback("[::1]")
    for host in ("0.0.0.0", "::", "", "10.1.2.3", "2001:db8::1"):
        assert not is_loopback(host), host
    ServeSettings(host="0.0.0.0", dangerously_serve_without_auth=True).check_exposure()
    key = {"id": "k", "scope": "read", "token": new_token()}
    ServeSettings(host="0.0.0.0", api_keys=[key]).check_exposure()  # type: ignore[list-item]
    loud = ServeSettings(host="0.0.0.0", dangerously_serve_without_auth=True, allow_raw_sql=True)
    said = " ".join(line for _, line in loud.exposure_report(None))
    assert "NO AUTHENTICATION" in said and "anyone who reaches the port" in said
    assert "raw SQL" in said
    keyed = ServeSettings(host="0.0.0.0", api_keys=[key])  # type: ignore[list-item]
    said = " ".join(line for _, line in keyed.exposure_report(keyed.auth()))
    assert "API keys required (1: k)" in said and "clear text" in said
    quiet = ServeSettings()
    assert [line for _, line in quiet.exposure_report(None)] == [
        "lance_async.serve: http://127.0.0.1:8000; NO AUTHENTICATION"
    ]
    with pytest.raises(ValueError):
        ServeSettings(head_timeout=-1)
    assert json.loads(ServeSettings(max_headers=7).model_dump_json())["max_headers"] == 7
