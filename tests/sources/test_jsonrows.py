"""JSON rows: the nesting limit checked before any parser that can crash (issue 17, item 1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from lance_async.errors import DecodeError
from lance_async.sources.decoders import NdjsonDecoder
from lance_async.sources.jsonrows import (
    MAX_JSON_DEPTH,
    check_json_depth,
    decode_json_rows,
    json_depth,
)

from ..helpers import KV_SCHEMA


def nested(depth: int, *, sep: str = "") -> str:
    return "[" * depth + sep + "]" * depth


@pytest.mark.parametrize("depth", [200, 3_000])
def test_regression_deep_json_value_is_a_line_numbered_decode_error(depth: int) -> None:
    # 3,000 levels gave an untyped RecursionError (Python's json on the error path)
    data = (
        json.dumps({"id": 1, "value": 1, "name": "a"})
        + "\n"
        + '{"id": 2, "value": '
        + nested(depth)
        + ', "name": "b"}\n'
    ).encode()
    with pytest.raises(DecodeError, match=r"^line 2: JSON nested deeper than 64 levels"):
        decode_json_rows(data, KV_SCHEMA)
    decoder = NdjsonDecoder(KV_SCHEMA)
    with pytest.raises(DecodeError, match=r"line 2: JSON nested deeper"):
        decoder.feed(data)


def test_regression_a_value_nested_across_lines_is_measured_too() -> None:
    # pyarrow's reader parses one value over several lines: depth adds up across them
    data = b'{"id": "1", "value": ' + b"[\n" * 100 + b"\n"
    with pytest.raises(DecodeError, match="JSON nested deeper than 64 levels"):
        decode_json_rows(data, KV_SCHEMA)


def test_regression_20k_levels_do_not_crash_the_process() -> None:
    # pyarrow's JSON reader with inferred types crashed (SIGSEGV) from about 7,000 levels
    code = (
        "from lance_async.sources.jsonrows import decode_json_rows\n"
        "from tests.helpers import KV_SCHEMA\n"
        "from lance_async.errors import DecodeError\n"
        "data = b'{\"id\": \"1\", \"value\": ' + b'[' * 20000 + b']' * 20000 + b'}\\n'\n"
        "try:\n"
        "    decode_json_rows(data, KV_SCHEMA)\n"
        "except DecodeError as exc:\n"
        "    print('DecodeError', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("DecodeError line 1: JSON nested deeper"), out.stdout


def test_depth_counts_brackets_outside_strings_only() -> None:
    assert json_depth(b'{"a": [1, {"b": [2]}]}') == 4
    assert json_depth(b'{"a": "' + b"[" * 500 + b'"}') == 1
    assert json_depth(b'{"a": "\\"' + b"[" * 500 + b'"}') == 1  # an escaped quote stays inside
    assert json_depth(b'{"a": "\\\\"}' + b"[" * 90) == 90  # an escaped backslash does not
    assert json_depth(b"]]]]" + b"[" * 80) == 80  # closers first do not hide openers
    assert json_depth(b'"abc\n' + b"[" * 70) == 70  # an unterminated string ends at its line
    check_json_depth(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)
    with pytest.raises(DecodeError, match="line 3"):
        check_json_depth(b"{}\n{}\n" + b"[" * (MAX_JSON_DEPTH + 1), first_line=1)


def test_values_with_brackets_in_strings_still_decode() -> None:
    name = "[" * 300 + "}" * 300
    data = json.dumps({"id": "7", "value": 1, "name": name}).encode()  # "7": the fallback path
    table = decode_json_rows(data, KV_SCHEMA)
    assert table.to_pylist() == [{"id": 7, "value": 1, "name": name}]
    assert table.schema == KV_SCHEMA
    assert isinstance(table, pa.Table)


def test_regression_json_booleans_are_not_numbers() -> None:
    # Before: {"id": true} became the key 1 and overwrote row 1 (issue 17, item 5)
    for line in (b'{"id": true, "value": 1, "name": "a"}', b'{"id": 1, "value": false}'):
        with pytest.raises(DecodeError, match="JSON true and false are not numbers"):
            decode_json_rows(line, KV_SCHEMA)
    flags = pa.schema([pa.field("id", pa.int64()), pa.field("flag", pa.bool_())])
    with pytest.raises(DecodeError, match="not numbers, nor numbers booleans"):
        decode_json_rows(b'{"id": "1", "flag": 1}', flags)
    assert decode_json_rows(b'{"id": 2.0, "value": "3"}', KV_SCHEMA).to_pylist() == [
        {"id": 2, "value": 3, "name": None}
    ]


WIDE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("u", pa.uint64()),
        pa.field("f", pa.float64()),
    ]
)


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ('{"id": 9223372036854775808}', "id", "9223372036854775808 is out of range for int64"),
        ('{"id": -9223372036854775809}', "id", "-9223372036854775809 is out of range for int64"),
        ('{"id": 1, "u": 18446744073709551616}', "u", "out of range for uint64"),
        ('{"id": 1, "u": -1}', "u", "-1 is out of range for uint64"),
        ('{"id": 1e20}', "id", "does not fit int64 exactly"),
        ('{"id": "0x10"}', "id", "'0x10' is not a decimal integer"),
        ('{"id": 1, "u": "0x10"}', "u", "'0x10' is not a decimal integer"),
        ('{"id": "9223372036854775808"}', "id", "9223372036854775808 is out of range for int64"),
        ('{"id": "-99999999999999999999"}', "id", "out of range for int64"),
        ('{"id": "' + "9" * 5000 + '"}', "id", "out of range for int64"),
    ],
)
def test_regression_integers_outside_their_column_are_decode_errors_naming_line_and_field(
    text: str, field: str, message: str
) -> None:
    # -2**63-1 became -2**63 (read as a float, which casts to the int64 minimum),
    # and "0x10" became 16 (Arrow's string cast reads hex)
    data = ('{"id": 5}\n' + text + "\n").encode()
    with pytest.raises(DecodeError, match=f"^line 2: .*{message}") as caught:
        decode_json_rows(data, WIDE)
    assert caught.value.field == field
    decoder = NdjsonDecoder(WIDE)
    with pytest.raises(DecodeError, match=message):
        decoder.feed(data)
        decoder.finish()


def test_integers_at_the_edges_of_their_columns_still_decode() -> None:
    data = (
        b'{"id": -9223372036854775808, "u": 18446744073709551615, "f": 18446744073709551617}\n'
        b'{"id": 9223372036854775807, "u": "9223372036854775808", "f": 1}\n'
        b'{"id": "-16", "u": 0}\n'
    )
    table = decode_json_rows(data, WIDE)
    assert table.column("id").to_pylist() == [-(2**63), 2**63 - 1, -16]
    assert table.column("u").to_pylist() == [2**64 - 1, 2**63, 0]
    assert table.column("f").to_pylist() == [float(2**64), 1.0, None]  # the nearest float


def test_regression_an_integer_past_2_53_beside_a_float_keeps_its_digits() -> None:
    # the chunk was read with inferred types: one float64 column, so
    # 9007199254740993 became 9007199254740992 without an error
    data = b'{"id": 9007199254740993}\n{"id": 2.0}\n'
    assert decode_json_rows(data, WIDE).column("id").to_pylist() == [2**53 + 1, 2]


def test_regression_python_rows_with_integers_past_int64() -> None:
    from lance_async.errors import SchemaMismatchError
    from lance_async.sources.jsonrows import rows_table

    for value in (2**63, -(2**63) - 1, 10**5000):  # were an untyped OverflowError
        with pytest.raises(SchemaMismatchError, match="out of range for int64") as caught:
            rows_table([{"id": value}], WIDE)
        assert caught.value.field == "id"
    with pytest.raises(SchemaMismatchError, match="not a decimal integer"):
        rows_table([{"id": "0x10"}], WIDE)
    table = rows_table([{"id": 1, "u": 2**64 - 1}, {"id": 2, "u": 3}], WIDE)
    assert table.column("u").to_pylist() == [2**64 - 1, 3]
    assert rows_table({"id": [1], "f": [2**70]}, WIDE).column("f").to_pylist() == [float(2**70)]


def test_regression_vectors_decode_into_fixed_size_list_columns() -> None:
    # Before: ArrowNotImplementedError (pyarrow's JSON reader has no fixed-size lists)
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("emb", pa.list_(pa.float32(), 2))])
    table = decode_json_rows(b'{"id": 1, "emb": [1, 2.5]}\n{"id": 2, "emb": null}\n', schema)
    assert table.schema == schema
    assert table.to_pylist() == [{"id": 1, "emb": [1.0, 2.5]}, {"id": 2, "emb": None}]
    with pytest.raises(DecodeError, match="line 4: field 'emb' holds 3 values") as caught:
        decode_json_rows(
            b'{"id": 1, "emb": [1, 2]}\n\n{"id": 2, "emb": [1, 2, 3]}\n', schema, first_line=2
        )
    assert caught.value.field == "emb"


def test_a_large_text_is_read_in_blocks_and_a_line_longer_than_a_block_still_decodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JSON text is parsed a block at a time (one chunk per block, no copy of
    the whole text); a row longer than a block is read again with larger
    blocks, so block size never changes what decodes."""
    from lance_async.sources import jsonrows

    rows = [{"id": i, "value": i, "name": "x" * (200_000 if i == 40 else 50)} for i in range(3_000)]
    text = "\n".join(json.dumps(r) for r in rows).encode()
    short = [r for r in rows if r["id"] != 40]
    monkeypatch.setattr(jsonrows, "BLOCK_BYTES", 1 << 16)
    monkeypatch.setattr(jsonrows, "COMBINE_BYTES", 0)  # keep the chunks to count them
    blocks = decode_json_rows("\n".join(json.dumps(r) for r in short).encode(), KV_SCHEMA)
    assert blocks.column("id").num_chunks > 1  # one chunk per block
    assert blocks.to_pylist() == short
    table = decode_json_rows(text, KV_SCHEMA)  # row 40 is longer than a block
    assert table.to_pylist() == rows
    assert table.schema.equals(KV_SCHEMA, check_metadata=True)
    monkeypatch.setattr(jsonrows, "COMBINE_BYTES", 8 << 20)
    assert decode_json_rows(text, KV_SCHEMA).column("id").num_chunks == 1  # small: one chunk
