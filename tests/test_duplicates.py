"""lance_async._duplicates: duplicate keys found, named, or kept newest-wins (issue 17)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import lance_async as la
from lance_async._duplicates import KeyTracker, check_unique_keys, find_duplicate_key, keep_last

from .helpers import kv_table


def test_find_duplicate_key_names_the_first_repeat() -> None:
    assert find_duplicate_key(kv_table(range(1000)), ["id"]) is None  # sorted: one pass
    assert find_duplicate_key(kv_table([3, 1, 2]), ["id"]) is None
    assert find_duplicate_key(kv_table([3, 1, 3, 2, 1, 3]), ["id"]) == ({"id": 3}, 3, 2)
    composite = pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"]})
    assert find_duplicate_key(composite, ["a", "b"]) is None
    assert find_duplicate_key(composite, ["a"]) == ({"a": 1}, 2, 1)
    nulls = pa.table({"k": pa.array([None, 1, None], pa.int64())})
    assert find_duplicate_key(nulls, ["k"]) == ({"k": None}, 2, 1)
    with pytest.raises(la.SchemaMismatchError):
        find_duplicate_key(composite, ["c"])


def test_check_unique_keys_raises_a_typed_error() -> None:
    check_unique_keys(kv_table([1, 2]), ["id"])
    with pytest.raises(la.DuplicateKeyError, match=r"the send repeats key \{'id': 2\}") as err:
        check_unique_keys(kv_table([2, 1, 2]).to_batches(), ["id"], what="the send")
    assert isinstance(err.value, la.InvalidInputError)
    assert (err.value.key, err.value.count) == ({"id": 2}, 2)


def test_keep_last_keeps_each_keys_last_row_in_order() -> None:
    table = pa.concat_tables([kv_table([1, 2, 3], value=1), kv_table([2, 1], value=2)])
    kept = keep_last(table, ["id"])
    assert [(r["id"], r["value"]) for r in kept.to_pylist()] == [(3, 1), (2, 2), (1, 2)]
    unique = kv_table([1, 2])
    assert keep_last(unique, ["id"]) is unique


def test_key_tracker_finds_repeats_within_and_across_batches() -> None:
    tracker = KeyTracker(["id"])
    tracker.add(kv_table([1, 2]).to_batches()[0])
    tracker.add(kv_table([3]).to_batches()[0])
    tracker.check()
    tracker.add(kv_table([2]).to_batches()[0])
    with pytest.raises(la.DuplicateKeyError, match="'id': 2"):
        tracker.check()
    with pytest.raises(la.DuplicateKeyError, match="'id': 7"):
        KeyTracker(["id"]).add(kv_table([7, 7]).to_batches()[0])


def test_key_tracker_keeps_copies_of_the_keys_not_the_batches() -> None:
    # an Arrow IPC message decodes into one buffer for all columns: a zero-copy
    # key column would keep the whole body in memory (found by the 100 MiB test)
    rows = 200_000
    batch = kv_table(range(rows)).to_batches()[0]
    body = batch.serialize()
    size = body.size
    decoded = pa.ipc.read_record_batch(body, batch.schema)
    tracker = KeyTracker(["id"])
    before = pa.total_allocated_bytes()
    tracker.add(decoded)
    kept = pa.total_allocated_bytes() - before
    assert 0 < kept < rows * 8 + 4096  # the key column, copied
    del body, decoded
    # the message's one buffer is freed: nothing the tracker keeps points into it
    freed = before + kept - pa.total_allocated_bytes()
    assert freed >= size, (freed, size)
    tracker.add(kv_table([5]).to_batches()[0])  # no longer increasing: checked in full
    with pytest.raises(la.DuplicateKeyError, match="'id': 5"):
        tracker.check()
