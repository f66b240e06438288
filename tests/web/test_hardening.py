"""The example server against hostile bodies and slow clients (issue 17), on a real uvicorn.

One module-scoped server with 2 engine threads, at most 4 uploads at once and
a 2 s body idle timeout (``python -m tests.web.app``, see ``app.py``).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from .test_fastapi import (
    NDJSON,
    Server,
    contents,
    ingest,
    kv_block,
    launch,
    make_table,
    merge,
    ndjson,
    version,
)

MAX_UPLOADS = 4
IDLE_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("hardening")
    root = base / "tables"
    root.mkdir()
    for name in ("kv", "deep", "stall"):
        make_table(root / f"{name}.lance", kv_block(0, 100, 0))
    make_table(root / "events.lance", kv_block(0, 10, 0), mem_wal=True)
    srv = launch(
        root,
        base / "server.log",
        "--threads",
        "2,4,4",
        "--max-uploads",
        str(MAX_UPLOADS),
        "--idle-timeout",
        str(IDLE_TIMEOUT),
    )
    try:
        yield srv
    finally:
        srv.stop()
    srv.assert_clean_shutdown()


# -- item 1: deeply nested JSON --------------------------------------------------


@pytest.mark.parametrize("depth", [3_000, 20_000])
def test_regression_deeply_nested_ndjson_is_a_422_and_the_server_lives(
    guarded: Server, depth: int
) -> None:
    # 20,000 levels crashed the server (SIGSEGV); 3,000 were an untyped HTTP 500
    deep = (
        json.dumps({"id": 1, "value": 1, "name": "a"})
        + '\n{"id": "2", "value": '
        + "[" * depth
        + "]" * depth
        + ', "name": "b"}\n'
    ).encode()
    before = version(guarded.table("deep"))
    with guarded.client() as client:
        for response in (
            merge(client, "deep", deep, NDJSON),
            ingest(client, "events", deep, NDJSON),
        ):
            assert response.status_code == 422, response.text
            assert response.json()["error"] == "DecodeError"
            assert "JSON nested deeper than 64 levels" in response.json()["detail"]
        first_line = ('{"id": ' + "[" * depth + "]" * depth + "}\n").encode()
        response = merge(client, "deep", first_line, NDJSON)
        assert response.status_code == 422, response.text
    assert guarded.proc.poll() is None, guarded.log_tail()
    assert guarded.health()["status"] == "ok"
    assert version(guarded.table("deep")) == before


# -- item 2: stalled uploads -----------------------------------------------------


def stalled_upload(server: Server, table: str, head: bytes, announced: int) -> socket.socket:
    """A merge upload that announces ``announced`` bytes, sends ``head`` and goes silent."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(
        (
            f"POST /tables/{table}/merge?on=id HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: {NDJSON}\r\nContent-Length: {announced}\r\n\r\n"
        ).encode()
        + head
    )
    return sock


def read_status(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 "), data[:200]
    return int(data.split()[1])


def test_regression_stalled_uploads_never_starve_reads_and_time_out(guarded: Server) -> None:
    # Before: each stalled merge held an engine thread, waiting on its client,
    # until the client left: with 2 engine threads, lookups and scans hung.
    before = version(guarded.table("stall"))
    head = ndjson({"id": i, "value": 1, "name": "s"} for i in range(1000, 1050))
    socks = [stalled_upload(guarded, "stall", head, 10 << 20) for _ in range(MAX_UPLOADS)]
    try:
        deadline = time.monotonic() + 20
        while guarded.health()["uploads_in_flight"] < MAX_UPLOADS:
            assert time.monotonic() < deadline, guarded.health()
            time.sleep(0.05)
        with guarded.client(timeout=IDLE_TIMEOUT * 5) as client:
            # reads go through while every upload slot is held by a silent client
            assert client.get("/tables/kv/lookup/5").json()["row"]["id"] == 5
            rows = client.get("/tables/kv/rows", params={"filter": "id<3"})
            assert rows.status_code == 200
            assert len(rows.text.splitlines()) == 3
            # one more upload is refused at once, with Retry-After
            busy = merge(client, "kv", ndjson([{"id": 1, "value": 9, "name": "x"}]), NDJSON)
            assert busy.status_code == 503, busy.text
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["error"] == "ServerBusyError"
        # the silent clients get a 408 after the idle timeout; nothing was written
        statuses = [read_status(sock) for sock in socks]
        assert statuses == [408] * MAX_UPLOADS
    finally:
        for sock in socks:
            sock.close()
    assert version(guarded.table("stall")) == before
    with guarded.client() as client:
        done = merge(client, "kv", ndjson([{"id": 1, "value": 9, "name": "x"}]), NDJSON)
        assert done.status_code == 200, done.text
    assert contents(guarded.table("kv"))[1] == (9, "x")


def test_a_slow_but_steady_upload_is_not_cut_off(guarded: Server) -> None:
    """Pauses shorter than the idle timeout are fine, however long the body takes."""
    rows = [{"id": 2000 + i, "value": i, "name": "slow"} for i in range(6)]

    def body() -> Iterator[bytes]:
        for row in rows:
            yield ndjson([row])
            time.sleep(IDLE_TIMEOUT / 3)

    with guarded.client() as client:
        response = merge(client, "kv", body(), NDJSON)
    assert response.status_code == 200, response.text
    assert response.json()["num_inserted_rows"] == 6


# -- item 3: duplicate keys in one body ------------------------------------------


def test_regression_a_body_repeating_a_new_key_is_a_422_and_writes_nothing(
    guarded: Server,
) -> None:
    # Before: HTTP 200, and the new key inserted twice
    body = ndjson([{"id": 500, "value": 1, "name": "a"}, {"id": 500, "value": 2, "name": "b"}])
    before = version(guarded.table("kv"))
    with guarded.client() as client:
        for response in (merge(client, "kv", body, NDJSON), ingest(client, "events", body, NDJSON)):
            assert response.status_code == 422, response.text
            assert response.json()["error"] == "DuplicateKeyError"
            assert "repeats key {'id': 500}" in response.json()["detail"]
        assert client.get("/tables/events/lookup/500").status_code == 404
    assert version(guarded.table("kv")) == before
    assert 500 not in contents(guarded.table("kv"))


# -- item 5: loose key types -----------------------------------------------------


def test_regression_a_json_true_key_is_a_422_not_row_1(guarded: Server) -> None:
    # Before: {"id": true} became the key 1 and overwrote row 1
    before = contents(guarded.table("kv"))[1]
    body = b'{"id": true, "value": 77, "name": "t"}\n'
    with guarded.client() as client:
        response = merge(client, "kv", body, NDJSON)
        assert response.status_code == 422, response.text
        assert "not numbers" in response.json()["detail"]
        assert client.get("/tables/kv/lookup/1.5").status_code == 422
    assert contents(guarded.table("kv"))[1] == before
