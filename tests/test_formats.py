"""Incremental decoders: any chunking gives the same rows; bad bytes are typed errors."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest

from lance_async import DecodeError
from lance_async.formats import csv_record_cut, decode_json_rows, ipc_message_cut, make_decoder

from .helpers import KV_SCHEMA, kv_table

TABLE = kv_table(range(50))


def encoded(fmt: str) -> bytes:
    if fmt == "ndjson":
        return "".join(f'{{"id": {i}, "value": 0, "name": "n{i}"}}\n' for i in range(50)).encode()
    if fmt == "csv":
        return ("value,name,id\n" + "".join(f'0,"n{i}",{i}\n' for i in range(50))).encode()
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, KV_SCHEMA) as w:
        for b in TABLE.to_batches(max_chunksize=7):
            w.write_batch(b)
    return sink.getvalue()


def decode(fmt: str, data: bytes, chunk: int) -> pa.Table:
    decoder = make_decoder(fmt, KV_SCHEMA)
    batches = []
    for i in range(0, len(data), chunk):
        batches.extend(decoder.feed(data[i : i + chunk]))
    batches.extend(decoder.finish())
    return pa.Table.from_batches(batches, schema=KV_SCHEMA)


@pytest.mark.parametrize("fmt", ["ndjson", "csv", "ipc"])
@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
def test_any_chunking_gives_the_same_rows(fmt: str, chunk: int) -> None:
    assert decode(fmt, encoded(fmt), chunk).equals(TABLE)


def test_ipc_file_format_is_read_as_a_stream() -> None:
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, KV_SCHEMA) as w:
        w.write_table(TABLE)
    assert decode("ipc", sink.getvalue(), 5).equals(TABLE)


def test_cut_helpers() -> None:
    assert csv_record_cut(b'a,"x\ny"\nb,c') == len(b'a,"x\ny"\n')
    assert csv_record_cut(b"no newline") == -1
    data = encoded("ipc")
    cut, ended, count = ipc_message_cut(data, True)
    assert ended and cut == len(data) and count == 1 + 8  # schema + 8 batches
    cut, ended, count = ipc_message_cut(data[:-20], True)
    assert not ended and cut < len(data) - 20


def test_csv_with_quoted_newlines_and_coercion() -> None:
    data = b'id,value,name\n1,2,"line one\nline two"\n3,4,plain\n'
    table = decode("csv", data, 4)
    assert table.column("name").to_pylist() == ["line one\nline two", "plain"]


def test_json_values_are_coerced_to_the_schema() -> None:
    table = decode_json_rows(b'{"id": "7", "value": 8, "name": "x"}\n', KV_SCHEMA)
    assert table.to_pylist() == [{"id": 7, "value": 8, "name": "x"}]


@pytest.mark.parametrize(
    ("fmt", "data"),
    [
        ("ndjson", b'{"id": 1, "value": }\n'),
        ("ndjson", b'{"id": 1, "value": "abc", "name": "x"}\n'),
        ("ndjson", b'{"value": 1, "name": "x"}\n'),
        ("ndjson", b'{"id": 1, "value": 1, "name": "x", "extra": 1}\n'),
        ("csv", b"value,name\n1,x\n"),
        ("csv", b"id,value,name\nabc,1,x\n"),
        ("ipc", b"not arrow at all, definitely not"),
    ],
)
def test_bad_bytes_raise_decode_error(fmt: str, data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(fmt, data, 1 << 20)


def test_regression_a_stray_quote_in_an_unquoted_csv_field_is_literal() -> None:
    rows = "".join(f"{i},0,n{i}\n" for i in range(2, 500))
    data = ('id,value,name\n1,1,5 inch"\n' + rows).encode()
    assert csv_record_cut(data) == len(data)
    table = decode("csv", data, 64)
    assert table.num_rows == 499
    assert table.column("name")[0].as_py() == '5 inch"'


def test_regression_invalid_utf8_in_json_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode_json_rows(b'{"id": 1, "value": 1, "name": "\xff\xfe"}\n', KV_SCHEMA)


def test_regression_csv_header_with_a_byte_order_mark() -> None:
    table = decode("csv", "\ufeffid,value,name\n1,2,x\n".encode(), 1 << 20)
    assert table.to_pylist() == [{"id": 1, "value": 2, "name": "x"}]
