"""JSON text (an array of objects) decoded as it arrives, by the one JSON rule."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.errors import DecodeError, SchemaMismatchError
from lance_async.sources.decoders import make_decoder
from lance_async.sources.jsonrows import decode_json_rows, rows_table

from ..helpers import KV_SCHEMA

TRICKY = [{"id": i, "value": i * 3, "name": f'n "q" \\ {i} [x], {{y}} \u00e9'} for i in range(300)]


def decode(text: bytes, size: int, schema: pa.Schema = KV_SCHEMA) -> list[dict[str, object]]:
    decoder = make_decoder("json", schema)
    batches = []
    for i in range(0, len(text), size):
        batches += decoder.feed(text[i : i + size])
    batches += decoder.finish()
    rows: list[dict[str, object]] = pa.Table.from_batches(batches, schema=schema).to_pylist()
    return rows


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("size", [1, 2, 5, 64, 4096, 1 << 20])
def test_an_array_decodes_whatever_the_chunk_cuts(indent: int | None, size: int) -> None:
    text = json.dumps(TRICKY, indent=indent).encode()
    assert decode(text, size) == TRICKY


def test_objects_one_per_line_and_a_single_object_decode_too() -> None:
    lines = b"".join(json.dumps(r).encode() + b"\n" for r in TRICKY[:5])
    assert decode(lines, 7) == TRICKY[:5]
    pretty = json.dumps(TRICKY[0], indent=2).encode()
    assert decode(pretty, 3) == TRICKY[:1]
    assert decode(b"[]", 1) == [] and decode(b"\xef\xbb\xbf[ ]\n", 2) == []


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            b'[{"id": 1, "value": 1, "name": "a"}, 5]',
            "object 2 of the array: expected a JSON object",
        ),
        (b'[{"id": 1}, {"id": "x"}]', "object 2 of the array: field 'id'"),
        (b'[{"id": 1}] [{"id": 2}]', "after the end of the JSON array"),
        (b'[{"id": 1}', "not closed"),
        (b'"rows"', "expected a JSON array of objects"),
        (b'[{"id": 1, "value": ' + b"[" * 100 + b"]" * 100 + b"}]", "nested deeper than 64"),
    ],
)
def test_bad_json_text_is_a_decode_error_naming_the_element(text: bytes, words: str) -> None:
    for size in (3, len(text)):
        with pytest.raises(DecodeError, match=words.replace("[", r"\[")):
            decode(text, size)


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({"id": 1, "name": 5}, "name", "a number is not a string"),
        ({"id": 1, "value": True}, "value", "not numbers"),
        ({"id": 1.5}, "id", "truncated"),
        ({"id": 1, "colour": "red"}, "colour", "unknown field"),
    ],
)
def test_one_rule_for_json_text_and_python_rows(
    row: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(DecodeError, match=words) as text_error:
        decode_json_rows(json.dumps(row).encode(), KV_SCHEMA)
    assert text_error.value.field == field
    with pytest.raises(SchemaMismatchError, match=words) as rows_error:
        rows_table([row], KV_SCHEMA)
    assert rows_error.value.field == field


def test_what_fits_fits_the_same_way_on_both_paths() -> None:
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("x", pa.float64())])
    for row, expected in (
        ({"id": 2.0, "x": 5}, {"id": 2, "x": 5.0}),
        ({"id": "3", "x": "2.5"}, {"id": 3, "x": 2.5}),
    ):
        assert decode_json_rows(json.dumps(row).encode(), schema).to_pylist() == [expected]
        assert rows_table([row], schema).to_pylist() == [expected]


@pytest.mark.asyncio
async def test_a_writer_takes_an_integer_into_a_float_column(tmp_path: Path) -> None:
    # Before: writer.put({"value": [5]}) into float64 was a SchemaMismatchError
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False, {b"lance-schema:unenforced-primary-key": b"true"}),
            pa.field("value", pa.float64()),
        ]
    )
    ds = await la.write_dataset(
        pa.table({"id": [1], "value": [0.5]}, schema=schema), str(tmp_path / "f.lance")
    )
    await ds.initialize_mem_wal(unsharded=True)
    async with ds.mem_wal_writer() as writer:
        await writer.put({"id": [2], "value": [5]})
        await writer.put([{"id": 3, "value": 7}])
        with pytest.raises(la.SchemaMismatchError, match="not numbers") as bad:
            await writer.put({"id": [4], "value": [True]})
        assert bad.value.field == "value"
        found = await writer.lsm.point_lookup(2)
    assert found.to_pylist()[0]["value"] == 5.0
    await anyio.lowlevel.checkpoint()


@pytest.mark.asyncio
async def test_a_json_file_source_reads_an_array(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(TRICKY, indent=1))
    source = la.file_source(path, schema=KV_SCHEMA, chunk_size=100)
    got = []
    async for batch in source.open():
        got += batch.to_pylist()
    assert got == TRICKY
    inferred = la.file_source(path)
    assert (await inferred.resolve_schema()).names == ["id", "value", "name"]


def test_a_feed_message_may_be_a_json_array() -> None:
    from lance_async.feeds import Message
    from lance_async.feeds.base import decode_json

    async def ack() -> None:
        return None

    messages = [
        Message(1, json.dumps(TRICKY[:3]).encode(), {}, _ack=ack),
        Message(2, json.dumps(TRICKY[3]).encode(), {}, _ack=ack),
    ]
    assert decode_json(messages, KV_SCHEMA).to_pylist() == TRICKY[:4]
    with pytest.raises(DecodeError, match="not closed"):
        decode_json([Message(3, b'[{"id": 1}', {}, _ack=ack)], KV_SCHEMA)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_a_large_message_array_is_cut_in_chunks_with_the_same_result(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JSON-array payload is cut to NDJSON a chunk at a time (strings,
    escaped quotes and backslashes straddling the cuts), into one buffer:
    the same rows as cut whole, in order."""
    from lance_async.feeds import Message
    from lance_async.feeds.base import decode_json
    from lance_async.sources import jsonarray

    text = b"  \n" + json.dumps(TRICKY, indent=1).encode() + b" \n"
    whole = jsonarray.JsonTextSplitter().feed(text)
    monkeypatch.setattr(jsonarray, "NDJSON_CHUNK", chunk)
    cut = jsonarray.to_ndjson(text)
    assert bytes(cut) == whole
    assert decode_json([Message(0, text)], KV_SCHEMA).to_pylist() == TRICKY
    with pytest.raises(DecodeError, match="after the end"):
        jsonarray.to_ndjson(json.dumps(TRICKY[:2]).encode() + b" [1]")
