"""Response encoding (Arrow-native NDJSON / JSON) and Accept negotiation."""

from __future__ import annotations

import datetime
import decimal
import json
import subprocess
import sys

import pyarrow as pa
import pytest
from starlette.requests import Request

from lance_async.web.errors import NotAcceptableError
from lance_async.web.responses import json_rows_bytes, ndjson_bytes, negotiate_format

IPC = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"


def request(accept: str | None) -> Request:
    headers = [] if accept is None else [(b"accept", accept.encode())]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, "ndjson"),
        ("", "ndjson"),
        ("*/*", "ndjson"),
        (NDJSON, "ndjson"),
        ("application/jsonl", "ndjson"),
        (IPC, "ipc"),
        (f"{NDJSON};q=0.5, {IPC}", "ipc"),
        (f"{NDJSON}, {IPC};q=0.9", "ndjson"),
        (f"{NDJSON};q=0, */*", "ipc"),  # q=0 excludes NDJSON, whatever the wildcard says
        (f"{NDJSON};q=0, application/*;q=0.3", "ipc"),
        (f"{IPC};q=0, */*", "ndjson"),
        ("text/html, */*;q=0.1", "ndjson"),
        (f"APPLICATION/X-NDJSON;q=0.2, {IPC};q=0.1", "ndjson"),
    ],
)
def test_accept_negotiation(accept: str | None, expected: str) -> None:
    assert negotiate_format(request(accept)) == expected


@pytest.mark.parametrize(
    "accept", ["text/html", f"{NDJSON};q=0, {IPC};q=0", f"*/*;q=0, {NDJSON};q=0", "image/*"]
)
def test_nothing_acceptable_is_406(accept: str) -> None:
    with pytest.raises(NotAcceptableError):
        negotiate_format(request(accept))


def test_override_and_default() -> None:
    assert negotiate_format(request("text/html"), override="arrow") == "ipc"
    assert negotiate_format(request(None), default="ipc") == "ipc"
    assert negotiate_format(request("*/*"), default="ipc") == "ipc"
    with pytest.raises(NotAcceptableError):
        negotiate_format(request(None), override="xml")


def test_ndjson_is_valid_json_with_iso_timestamps() -> None:
    table = pa.table(
        {
            "id": pa.array([1, None, 3], pa.int64()),
            "f": [0.5, float("nan"), float("inf")],
            "s": ['a"b\\c\n\t', "é\x01", None],
            "ts": pa.array(
                [
                    datetime.datetime(2013, 1, 1, 5, 17),
                    None,
                    datetime.datetime(2013, 1, 1, 5, 17, 0, 5),
                ],
                pa.timestamp("us"),
            ),
            "tz": pa.array([0, 1, 2], pa.timestamp("s", tz="UTC")),
            "d": [datetime.date(2013, 1, 2)] * 3,
            "b": [True, False, None],
            "l": [[1, 2], None, []],
            "bin": [b"xy", None, b""],
            "dec": pa.array([decimal.Decimal("1.25")] * 3),
            "dur": pa.array([1500, None, 0], pa.duration("ms")),
            "dict": pa.array(["x", "y", "x"]).dictionary_encode(),
        }
    )
    lines = ndjson_bytes(table).decode().splitlines()
    rows = [json.loads(line) for line in lines]
    assert rows[0] == {
        "id": 1,
        "f": 0.5,
        "s": 'a"b\\c\n\t',
        "ts": "2013-01-01T05:17:00.000000",
        "tz": "1970-01-01T00:00:00Z",
        "d": "2013-01-02",
        "b": True,
        "l": [1, 2],
        "bin": "eHk=",
        "dec": "1.25",
        "dur": 1.5,
        "dict": "x",
    }
    assert rows[1]["id"] is None and rows[1]["f"] is None and rows[1]["s"] == "é\x01"
    assert rows[2]["f"] is None and rows[2]["ts"] == "2013-01-01T05:17:00.000005"
    for row in rows:
        for key in ("ts", "tz"):
            if row[key] is not None:
                datetime.datetime.fromisoformat(row[key].replace("Z", "+00:00"))
    assert json.loads(json_rows_bytes(table)) == rows
    assert ndjson_bytes(table.slice(0, 0)) == b"" and json_rows_bytes(table.slice(0, 0)) == b"[]"
    sliced = ndjson_bytes(table.slice(1, 1)).decode()
    assert json.loads(sliced) == rows[1]


def test_import_loads_the_engine_but_not_the_optional_parts() -> None:
    code = (
        "import sys, lance_async\n"
        "assert {'lance', 'pyarrow', 'lance_async.dataset'} <= set(sys.modules)\n"
        "assert not {'nats', 'redis', 'confluent_kafka', 'fastapi'} & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
