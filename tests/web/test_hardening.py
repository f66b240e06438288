"""The example server against hostile bodies and slow clients (issue 17), on a real uvicorn.

One module-scoped server with 2 engine threads, at most 4 uploads at once and
a 2 s body idle timeout (``python -m tests.web.app``, see ``app.py``).
"""

from __future__ import annotations

import contextlib
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
    """Pauses shorter than the idle timeout are fine within the rate's grace
    (10 s by default) and, past it, at 1 KiB/s or more."""
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
        for key in ("٣", "１", "0x1"):  # int("٣") is 3: only ASCII digits are a key
            assert client.get(f"/tables/kv/lookup/{key}").status_code == 422, key
    assert contents(guarded.table("kv"))[1] == before


# -- slow uploads: a minimum body rate and a maximum body time --------------------

RATE = 200.0  # bytes/s, averaged from the first body bytes
GRACE = 1.0
MAX_TIME = 4.0


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with small slow-body limits, so that tricklers are cut off in seconds."""
    base = tmp_path_factory.mktemp("paced")
    root = base / "tables"
    root.mkdir()
    make_table(root / "kv.lance", kv_block(0, 100, 0))
    srv = launch(
        root,
        base / "server.log",
        "--max-uploads",
        "2",
        "--idle-timeout",
        "3",
        "--min-body-rate",
        str(RATE),
        "--body-rate-grace",
        str(GRACE),
        "--max-body-time",
        str(MAX_TIME),
    )
    try:
        yield srv
    finally:
        srv.stop()
    srv.assert_clean_shutdown()


def trickle(
    server: Server, payload: bytes, step: int, pause: float, limit: float
) -> tuple[int, bytes]:
    """Upload ``payload`` ``step`` bytes at a time, ``pause`` s apart, until the
    server answers (``limit`` s stops a hung test); the status and the whole answer."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=limit)
    start = time.monotonic()
    try:
        sock.sendall(
            (
                "POST /tables/kv/merge?on=id HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: {NDJSON}\r\nContent-Length: {len(payload)}\r\n\r\n"
            ).encode()
        )
        sock.setblocking(False)
        sent = 0
        while time.monotonic() - start < limit:
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break  # the server answered before the body ended
            except BlockingIOError:
                pass
            if sent < len(payload):
                try:
                    sent += sock.send(payload[sent : sent + step])
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass
            time.sleep(pause)
        sock.setblocking(True)
        answer = b""
        with contextlib.suppress(OSError):  # read to the close, or to the timeout
            while chunk := sock.recv(65536):
                answer += chunk
                if answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"}"):
                    break  # a kept-alive 200: its JSON body is complete
        assert answer.startswith(b"HTTP/1.1 "), answer[:200]
        return int(answer.split()[1]), answer
    finally:
        sock.close()


def test_regression_a_trickling_upload_is_a_408_once_below_the_minimum_rate(
    paced: Server,
) -> None:
    # Before: one byte every second never tripped the idle timeout, so the
    # client held an upload slot for as long as it liked
    before = version(paced.table("kv"))
    payload = ndjson({"id": i, "value": 7, "name": "t"} for i in range(1000, 1100))
    status, answer = trickle(paced, payload, step=1, pause=0.5, limit=30)
    assert status == 408
    # the rate tripped, not another limit (when: tests/web/test_body_clock.py, on a mock clock)
    assert b"min_body_rate" in answer, answer
    log = paced.log_tail()
    assert version(paced.table("kv")) == before, log
    with paced.client() as client:
        assert paced.health()["uploads_in_flight"] == 0
        assert client.get("/tables/kv/lookup/1000").status_code == 404


def test_regression_a_steady_upload_longer_than_the_maximum_time_is_a_408(
    paced: Server,
) -> None:
    # 400 bytes/s passes the rate, but the body would take ~15 s in all
    before = version(paced.table("kv"))
    payload = ndjson({"id": i, "value": 7, "name": "steady"} for i in range(2000, 2200))
    assert len(payload) > 15 * 400
    status, answer = trickle(paced, payload, step=100, pause=0.25, limit=30)
    assert status == 408
    # the time tripped, not another limit (when: tests/web/test_body_clock.py, on a mock clock)
    assert b"max_body_time" in answer, answer
    assert version(paced.table("kv")) == before


def test_an_upload_above_the_rate_and_within_the_time_goes_through(paced: Server) -> None:
    payload = ndjson({"id": i, "value": 8, "name": "ok"} for i in range(3000, 3040))
    status, answer = trickle(paced, payload, step=400, pause=0.25, limit=30)
    assert status == 200, answer
    assert contents(paced.table("kv"))[3000] == (8, "ok")


def test_the_slow_body_limits_are_serve_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from lance_async.fastapi import BodyLimits
    from lance_async.web.settings import ServeSettings

    assert ServeSettings().body_limits() is None  # every limit at its default
    defaults = BodyLimits()
    assert (defaults.min_body_rate, defaults.body_rate_grace, defaults.max_body_time) == (
        1024.0,
        10.0,
        3600.0,
    )
    monkeypatch.setenv("LANCE_ASYNC_SERVE_MIN_BODY_RATE", "4096")
    monkeypatch.setenv("LANCE_ASYNC_SERVE_MAX_BODY_TIME", "600")
    limits = ServeSettings.load(None, body_rate_grace=5.0).body_limits()
    assert limits is not None
    assert (limits.min_body_rate, limits.body_rate_grace, limits.max_body_time) == (
        4096.0,
        5.0,
        600.0,
    )
    assert limits.body_idle_timeout == defaults.body_idle_timeout
    with pytest.raises(ValueError):
        ServeSettings.load(None, min_body_rate=-1)
    with pytest.raises(ValueError):
        BodyLimits(max_body_time=float("nan"))


# -- malformed CSV ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'id,value,name\n1,1,a\n2,2,"unterminated\n3,3,c\n', "CSV line 3: a quoted field"),
        (b"id,value,name\n1,1,a\n\xff\xfe\x00garbage\n3,3,c\n", "CSV line 3: expected 3 columns"),
        (b"id,value,name\n1,1,a\n2,2,\xff\n", "CSV line 3: column 'name'"),
    ],
)
def test_regression_malformed_csv_bodies_are_a_line_numbered_422(
    guarded: Server, body: bytes, message: str
) -> None:
    # the unterminated quote was a 200 that wrote the rest of the body into one value
    before = version(guarded.table("kv"))
    with guarded.client() as client:
        for response in (
            merge(client, "kv", body, "text/csv"),
            ingest(client, "events", body, "text/csv"),
        ):
            assert response.status_code == 422, response.text
            assert response.json()["error"] == "DecodeError"
            assert response.json()["detail"].startswith(message), response.json()
        for key in (1, 2, 3):  # the rows before the bad line were not ingested either
            assert client.get(f"/tables/events/lookup/{key}").json()["row"]["value"] == 0
    assert version(guarded.table("kv")) == before


# -- merge keys, query integers, error names ------------------------------------------


def test_regression_merge_on_a_column_other_than_the_primary_key_is_a_422(
    guarded: Server,
) -> None:
    # Before: a 200 that joined on 'name', and a row whose name was new was
    # inserted beside the row holding its id
    before = version(guarded.table("kv"))
    body = ndjson([{"id": 7, "value": 70, "name": "not-n7"}])
    with guarded.client() as client:
        for on in ("name", "value", ["id", "name"]):
            response = merge(client, "kv", body, NDJSON, on=on)
            assert response.status_code == 422, response.text
            assert response.json()["error"] == "InvalidInputError"
            assert "must be the table's primary key ['id']" in response.json()["detail"]
        unknown = merge(client, "kv", body, NDJSON, on="nope")
        assert unknown.status_code == 422
        assert unknown.json()["field"] == "nope"
    assert version(guarded.table("kv")) == before


@pytest.mark.parametrize(
    "params",
    [{"limit": 2**64}, {"offset": 2**70}, {"limit": 2**63}, {"batch_size": 2**64}],
)
def test_regression_query_integers_past_int64_are_a_422(
    guarded: Server, params: dict[str, int]
) -> None:
    # Before: an OverflowError inside the engine call, answered 500
    with guarded.client() as client:
        for table in ("kv", "events"):
            response = client.get(f"/tables/{table}/rows", params=params)
            assert response.status_code == 422, response.text
            assert next(iter(params)) in response.text
        assert client.get("/tables/kv/rows", params={"limit": 2**63 - 1}).status_code == 200
    assert guarded.health()["status"] == "ok"


def test_regression_error_bodies_name_public_error_types(guarded: Server) -> None:
    # Before: a deep first NDJSON line answered {"error": "_LineError"}
    deep = b'{"id": ' + b"[" * 100 + b"]" * 100 + b"}\n"
    with guarded.client() as client:
        response = merge(client, "kv", deep, NDJSON)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "DecodeError"


def test_error_payloads_never_carry_private_class_names() -> None:
    from lance_async.errors import DecodeError
    from lance_async.web.handlers import error_payload

    class _Internal(DecodeError):
        pass

    assert error_payload(_Internal("x"))["error"] == "DecodeError"
    assert error_payload(DecodeError("x"))["error"] == "DecodeError"
