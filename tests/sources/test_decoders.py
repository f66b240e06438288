"""Incremental decoders: any chunking gives the same rows; bad bytes are typed errors."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pyarrow as pa
import pytest

from lance_async import DecodeError
from lance_async.sources.decoders import csv_record_cut, make_decoder
from lance_async.sources.ipc import ipc_message_cut
from lance_async.sources.jsonrows import decode_json_rows

from ..helpers import KV_SCHEMA, kv_table

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


# -- JSON values that are not objects ------------------------------------------------

NULLABLE = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
GOOD = b'{"id": 1, "value": 1, "name": "a"}'


@pytest.mark.parametrize(
    ("data", "line", "kind"),
    [
        (b"null\n", 1, "null"),
        (b"  null  \n", 1, "null"),
        (b"\n\n\tnull\n" + GOOD + b"\n", 3, "null"),
        (b"\xef\xbb\xbfnull\n", 1, "null"),
        (b"nullx\n", 1, "null"),
        (GOOD + b"\nnull\n" + GOOD + b"\n", 2, "null"),
        (GOOD + b" null\n", 1, "null"),
        (GOOD + b"null\n", 1, "null"),
        (b"3\n", 1, "a number"),
        (GOOD + b"\n-1.5\n", 2, "a number"),
        (b'"x"\n', 1, "a string"),
        (GOOD + b'\n"x"\n', 2, "a string"),
        (b"[1]\n", 1, "an array"),
        (b"[]\n", 1, "an array"),
        (GOOD + b"\n[" + GOOD + b"]\n", 2, "an array"),
        (b"true\n", 1, "a boolean"),
        (GOOD + b"\nfalse", 2, "a boolean"),
    ],
)
@pytest.mark.parametrize("schema", [KV_SCHEMA, NULLABLE], ids=["required-key", "all-nullable"])
def test_regression_a_json_value_that_is_not_an_object_is_a_line_numbered_decode_error(
    data: bytes, line: int, kind: str, schema: pa.Schema
) -> None:
    # pyarrow's JSON reader crashed the process (SIGSEGV) on a leading null and
    # turned a later one into a row of nulls
    with pytest.raises(DecodeError, match=f"^line {line}: expected a JSON object, got {kind}$"):
        decode_json_rows(data, schema, extra_fields="ignore")
    decoder = make_decoder("ndjson", schema, extra_fields="ignore")
    with pytest.raises(DecodeError, match=f"^line {line}: expected a JSON object, got {kind}$"):
        for i in range(len(data)):
            decoder.feed(data[i : i + 1])
        decoder.finish()


def test_a_null_first_in_a_later_chunk_is_refused_with_its_line() -> None:
    decoder = make_decoder("ndjson", KV_SCHEMA)
    assert decoder.feed(GOOD + b"\n" + GOOD + b"\n")[0].num_rows == 2
    with pytest.raises(DecodeError, match=r"^line 3: expected a JSON object, got null$"):
        decoder.feed(b"null\n" + GOOD + b"\n")


def test_objects_that_look_like_null_rows_still_decode() -> None:
    # an empty object, all-null fields and "} null" inside a string are rows, not nulls
    data = b'{}\n{"id": null, "name": null}\n{"id": 3, "name": "} null"}\n{"id": 4} {"id": 5}\n'
    table = decode_json_rows(data, NULLABLE)
    assert table.to_pylist() == [
        {"id": None, "name": None},
        {"id": None, "name": None},
        {"id": 3, "name": "} null"},
        {"id": 4, "name": None},
        {"id": 5, "name": None},
    ]


# -- cutting CSV at record ends --------------------------------------------------------


def reference_record_ends(data: bytes, delimiter: int = ord(",")) -> list[int]:
    """Record ends read one byte at a time: the rules csv_record_cut documents."""
    ends: list[int] = []
    in_quotes = False
    i = 0
    while i < len(data):
        byte = data[i]
        if in_quotes:
            if byte == ord('"'):
                if i + 1 < len(data) and data[i + 1] == ord('"'):
                    i += 2
                    continue
                in_quotes = False
        elif byte == ord("\n"):
            ends.append(i + 1)
        elif byte == ord('"') and (i == 0 or data[i - 1] in (delimiter, ord("\n"), ord("\r"))):
            in_quotes = True
        i += 1
    return ends


@pytest.mark.parametrize("delimiter", [",", ";"])
def test_csv_record_ends_match_a_byte_by_byte_reading_in_any_chunking(delimiter: str) -> None:
    import random

    from lance_async.sources.decoders import _csv_scan

    rng = random.Random(7)
    alphabet = f'a{delimiter}"\n\r""'.encode()
    for _ in range(3_000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        ends = reference_record_ends(data, ord(delimiter))
        assert csv_record_cut(data, delimiter.encode()) == (ends[-1] if ends else -1), data
        # resumed scans over a growing buffer, cut as CsvDecoder cuts it
        buf, base, scanned, in_quotes, cuts = bytearray(), 0, 0, False, []
        for start in range(0, len(data), step := rng.randint(1, 9)):
            buf += data[start : start + step]
            last, scanned, in_quotes = _csv_scan(buf, scanned, in_quotes, ord(delimiter))
            if last > 0:
                cuts.append(base + last)
                del buf[:last]
                scanned -= last
                base += last
        assert set(cuts) <= set(ends), data
        assert (cuts[-1] if cuts else None) == (ends[-1] if ends else None), data


def test_a_csv_record_arriving_in_many_chunks_is_decoded_whole() -> None:
    from lance_async.sources.decoders import CsvDecoder

    field = ('x\n""' * 50_000).encode()  # one quoted field: newlines and escaped quotes
    data = b'id,value,name\n1,2,"' + field + b'"\n3,4,"y"\n'
    decoder = CsvDecoder(KV_SCHEMA)
    batches = []
    for i in range(0, len(data), 4096):
        batches.extend(decoder.feed(data[i : i + 4096]))
        assert decoder.pending < len(data)
    batches.extend(decoder.finish())
    table = pa.Table.from_batches(batches)
    assert table.column("id").to_pylist() == [1, 3]
    assert table.column("name")[0].as_py() == 'x\n"' * 50_000
    assert decoder.pending == 0


def test_decoders_report_the_bytes_they_hold_back() -> None:
    ndjson = make_decoder("ndjson", KV_SCHEMA)
    assert ndjson.feed(GOOD + b"\n" + GOOD[:10]) and ndjson.pending == 10
    csv_decoder = make_decoder("csv", KV_SCHEMA)
    assert csv_decoder.feed(b"id,value,name\n1,2,x\n3,4") and csv_decoder.pending == 3
    data = encoded("ipc")
    ipc = make_decoder("ipc", KV_SCHEMA)
    rows = sum(b.num_rows for b in ipc.feed(data[:-30]))
    assert 0 < ipc.pending < len(data) and not ipc.ended
    rows += sum(b.num_rows for b in ipc.feed(data[-30:]))
    assert rows == 50 and ipc.pending == 0 and ipc.ended


MALFORMED_CSV = [
    # (body, line, text in the message)
    (b'id,value,name\n1,1,a\n2,2,"unterminated\n3,3,c\n', 3, "never closed (unterminated quote)"),
    (b'id,value,name\n1,1,a\n2,2,"abc', 3, "never closed (unterminated quote)"),
    (b"id,value,name\n1,1,a\n\xff\xfe\x00garbage\n3,3,c\n", 3, "expected 3 columns, got 1"),
    (b"id,value,name\n1,1,a\n2,2,\xff\xfe\n", 3, "column 'name': cannot convert to string"),
    (b'id,value,name\n1,1,a\n\n4,4,"x\ny"\n6,x,b\n', 6, "column 'value': cannot convert"),
    (b"id,value,name\n1,1,a\n2,2\n", 3, "expected 3 columns, got 2"),
    (b'id,value,name\n1,1,"a\nb"\n,2,b\n', 4, "field 'id' is not nullable"),
]


@pytest.mark.parametrize(("data", "line", "text"), MALFORMED_CSV)
@pytest.mark.parametrize("chunk", [1 << 20, 7, 1])
def test_regression_malformed_csv_is_a_decode_error_naming_the_body_line(
    data: bytes, line: int, text: str, chunk: int
) -> None:
    # an unterminated quote swallowed the rest of the input into one value;
    # pyarrow's errors counted rows from the start of each chunk
    decoder = make_decoder("csv", KV_SCHEMA)
    with pytest.raises(DecodeError, match=rf"^CSV line {line}: .*{re.escape(text)}"):
        for i in range(0, len(data), chunk):
            decoder.feed(data[i : i + chunk])
        decoder.finish()


@pytest.mark.asyncio
async def test_regression_malformed_csv_files_merge_and_ingest_nothing(tmp_path: Path) -> None:
    import lance_async as la

    path = tmp_path / "bad.csv"
    path.write_bytes(b'id,value,name\n1,9,a\n2,9,"unterminated\n3,9,c\n')
    ds = await la.write_dataset(kv_table(range(5)), tmp_path / "t.lance")
    version = ds.version
    builder = ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    with pytest.raises(DecodeError, match=r"CSV line 3: .*unterminated quote"):
        await builder.execute(la.file_source(path, schema=KV_SCHEMA))
    assert (await la.open_dataset(ds.uri)).version == version
    assert (await ds.count_rows("value = 9")) == 0
    await ds.initialize_mem_wal()
    async with ds.mem_wal_writer() as router:
        with pytest.raises(DecodeError, match="CSV line 3"):  # a streamed put: rows before it land
            await router.put(la.file_source(path, schema=KV_SCHEMA))
