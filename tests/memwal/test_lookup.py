"""Batched and coalesced point lookups (lookup.py): each caller gets its own row."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.lsm.keyindex import KeyIndex
from lance_async.lsm.lookup import LookupCoalescer, split_rows

from ..helpers import PK, kv_table


@pytest.mark.asyncio
async def test_coalesced_lookups_return_each_caller_its_own_row(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(500)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=50) as w:
        await w.put(kv_table(range(0, 500, 3), 1))  # several generations flush
        await w.delete({"id": list(range(0, 500, 9))})
        await w.put(kv_table(range(600, 620), 2))  # keys only in the memtable
        expected: dict[int, Any] = {i: 0 for i in range(500)}
        expected.update({i: 1 for i in range(0, 500, 3)})
        for i in range(0, 500, 9):
            expected.pop(i)
        expected.update({i: 2 for i in range(600, 620)})
        keys = [*range(0, 640, 2), 7, 7, 7]  # absent, deleted, repeated keys too
        got: dict[int, list[int]] = {}

        async def caller(key: int) -> None:
            table = await w.lsm.point_lookup(key, columns=["value", "id"])
            assert table.column_names == ["value", "id"]
            got.setdefault(key, []).extend(table.column("value").to_pylist())
            if table.num_rows:
                assert table.column("id").to_pylist() == [key]

        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(caller, key)
        for key in set(keys):
            want = [expected[key]] * keys.count(key) if key in expected else []
            assert got.get(key, []) == want, key
        stats = w.lsm.lookup_stats()
        assert stats.lookups == len(keys) and stats.batches < len(keys), stats
        # the batch form: found rows in the order of the keys, a key twice answered twice
        many = await w.lsm.point_lookups([610, 3, 9, 999, 3])
        assert many.column("id").to_pylist() == [610, 3, 3]
        assert many.column("value").to_pylist() == [2, 1, 1]
    # the dataset's own lookups (flushed levels), coalesced the same way
    async with anyio.create_task_group() as tg:
        for key in (1, 3, 9, 610):

            async def one(k: int = key) -> None:
                rows = (await ds.lsm.point_lookup(k)).column("value").to_pylist()
                assert rows == ([expected[k]] if k in expected else []), k

            tg.start_soon(one)
    by_table = await ds.lsm.point_lookups(pa.table({"id": [1, 610, 9]}))
    assert by_table.column("id").to_pylist() == [1, 610]


@pytest.mark.asyncio
async def test_lookups_by_string_and_composite_keys(table_uri: str) -> None:
    schema = pa.schema(
        [
            pa.field("user", pa.string(), nullable=False, metadata=PK),
            pa.field("day", pa.int32(), nullable=False, metadata=PK),
            pa.field("score", pa.float64()),
        ]
    )

    def table(users: list[str], day: int, score: float) -> pa.Table:
        return pa.table(
            {"user": users, "day": [day] * len(users), "score": [score] * len(users)},
            schema=schema,
        )

    users = [f"u{i:03d}" for i in range(100)] + ["", 'q"uo\\te', "é"]
    ds = await la.write_dataset(table(users, 1, 0.0), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=20) as w:
        await w.put(table(users[:50], 1, 1.0))
        await w.put(table(["", "é"], 2, 2.0))
        await w.delete(pa.table({"user": ["u001"], "day": pa.array([1], pa.int32())}))
        cases: list[tuple[Any, list[float]]] = [
            (("u000", 1), [1.0]),
            ({"user": "u099", "day": 1}, [0.0]),
            (("u001", 1), []),
            (("", 2), [2.0]),
            (("", 1), [0.0]),
            (('q"uo\\te', 1), [0.0]),
            (("é", 2), [2.0]),
            (("nobody", 1), []),
        ]
        results = await w.lsm.point_lookups([k for k, _ in cases])
        assert results.num_rows == sum(len(v) for _, v in cases)
        for key, want in cases:
            got = await w.lsm.point_lookup(key)
            assert got.column("score").to_pylist() == want, key
        with pytest.raises(la.InvalidInputError):
            await w.lsm.point_lookup("u000")  # a composite key needs both columns


def test_key_index_verifies_hash_hits_and_resolves_shared_codes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    words = pa.array(["b", "a", "b", "c", ""])
    index = KeyIndex([words])
    assert not index.exact
    assert index.find([pa.array(["b", "c", "a", "z", ""])]).tolist() == [0, 3, 1, -1, 4]
    # fault injection: every key hashes to one code; positions still come out right
    import lance_async.lsm.keyindex as ki

    monkeypatch.setattr(ki, "key_codes", lambda cols: (np.zeros(len(cols[0]), np.int64), False))
    crowded = KeyIndex([words])
    assert crowded.find([pa.array(["c", "b", "z", "a"])]).tolist() == [3, 0, -1, 1]
    monkeypatch.undo()
    ints = KeyIndex([pa.array([10**15, 3, 3, -(2**62)], pa.int64())])
    assert ints.exact and ints.find([pa.array([3, -(2**62), 4], pa.int64())]).tolist() == [1, 3, -1]


@pytest.mark.asyncio
async def test_a_cancelled_leader_hands_the_batch_to_the_others() -> None:
    release = anyio.Event()
    calls: list[list[int]] = []
    scopes: dict[int, tuple[int, anyio.CancelScope]] = {}
    cancelled: list[int] = []

    async def run(probe: list[pa.Array], columns: list[str] | None) -> tuple[pa.Table, Any]:
        calls.append(probe[0].to_pylist())
        if len(calls) == 1:
            await release.wait()  # the first batch holds the coalescer while 1, 2, 3 queue
        elif len(calls) == 2:  # the batch of 1, 2 and 3: cancel the caller running it
            key, scope = scopes[anyio.get_current_task().id]
            cancelled.append(key)
            scope.cancel()
            await anyio.sleep(5)
        ids = probe[0]
        return pa.table({"id": ids}), np.arange(len(ids))

    co = LookupCoalescer(run)
    got: dict[int, list[int]] = {}

    async def caller(key: int) -> None:
        with anyio.CancelScope() as scope:
            scopes[anyio.get_current_task().id] = (key, scope)
            table = await co.lookup([pa.array([key])], None)
            got[key] = table.column("id").to_pylist()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller, 0)
            while not calls:  # noqa: ASYNC110 - polling a list
                await anyio.sleep(0.001)
            for key in (1, 2, 3):
                tg.start_soon(caller, key)
            await anyio.sleep(0.01)
            release.set()
    assert sorted(calls[1]) == [1, 2, 3] and len(cancelled) == 1
    assert got == {k: [k] for k in (0, 1, 2, 3) if k not in cancelled}
    assert sorted(calls[2]) == sorted(k for k in (1, 2, 3) if k not in cancelled)
    assert co.stats().pending == 0
    assert split_rows(pa.table({"id": [5]}), np.array([1]), 2)[0].num_rows == 0


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@pytest.mark.asyncio
async def test_the_int64_extremes_are_keys_like_any_other(table_uri: str) -> None:
    """Lance SQL reads ``-9223372036854775808`` as a float64; the filters built
    for lookups must still find the row of the smallest int64 key."""
    ds = await la.write_dataset(kv_table([INT64_MIN, 0, INT64_MAX], value=1), table_uri)
    await ds.initialize_mem_wal()

    async def values(*keys: int) -> list[int | None]:
        table = await ds.lsm.point_lookups(list(keys), columns=["value"])
        found: list[int | None] = table.column("value").to_pylist()
        return found

    assert await values(INT64_MIN, INT64_MAX) == [1, 1]  # the base table
    assert (await ds.lsm.point_lookup(INT64_MIN)).column("id").to_pylist() == [INT64_MIN]
    for bad in (INT64_MAX + 1, INT64_MIN - 1, "0x10", "16"):  # never wrapped, never parsed
        with pytest.raises(la.InvalidInputError, match="does not fit 'id'"):
            await ds.lsm.point_lookup(bad)
    async with ds.mem_wal_writer() as router:
        await router.put(kv_table([INT64_MIN, INT64_MAX], value=2))
        got = await router.lsm.point_lookup(INT64_MIN, columns=["value"])
        assert got.column("value").to_pylist() == [2]
    assert await values(INT64_MIN, INT64_MAX) == [2, 2]  # flushed generations
    await ds.compact_mem_wal()
    assert await values(INT64_MIN, INT64_MAX) == [2, 2]  # compacted into the base
    async with ds.mem_wal_writer() as router:
        await router.delete(kv_table([INT64_MIN]))
    await ds.compact_mem_wal()
    assert (await ds.lsm.point_lookup(INT64_MIN)).num_rows == 0
    assert await values(INT64_MAX) == [2]
    assert (await ds.to_table()).column("id").to_pylist() == [0, INT64_MAX]
