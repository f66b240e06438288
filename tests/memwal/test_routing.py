"""Routing in bulk (issue 25): a run of sends cut once per shard, acks per send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest

import lance_async as la
from lance_async._schema import TableFit
from lance_async.memwal import router as router_module
from lance_async.memwal import routing as routing_module
from lance_async.memwal.accumulator import BatchAck, Item, Kind
from lance_async.memwal.acks import Ack
from lance_async.memwal.routing import RoutedPart, ShardCut, _concat_run, cut_part, split_run

from ..helpers import KV_SCHEMA, kv_table


async def keyed(uri: str, **init: Any) -> la.AsyncDataset:
    ds = await la.write_dataset(kv_table([]), uri, schema=KV_SCHEMA)
    return await ds.initialize_mem_wal(**init)


async def ids_by_shard(ds: la.AsyncDataset, ids: range) -> dict[str, list[int]]:
    sharding = await ds.sharding()
    out: dict[str, list[int]] = {}
    for shard, part in sharding.split(kv_table(ids).to_batches()[0]):
        out[shard] = part.column("id").to_pylist()
    return out


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "inline_rows", [router_module.ROUTE_INLINE_ROWS, 0], ids=["loop", "thread"]
)
async def test_sends_queued_together_are_routed_in_one_evaluation_and_one_put_per_shard(
    table_uri: str, monkeypatch: pytest.MonkeyPatch, inline_rows: int
) -> None:
    ds = await keyed(table_uri)
    runs: list[int] = []
    monkeypatch.setattr(router_module, "ROUTE_INLINE_ROWS", inline_rows)  # where the run is cut

    def counted(sharding: Any, fit: Any, entries: Any) -> Any:
        runs.append(len(entries))
        return split_run(sharding, fit, entries)

    monkeypatch.setattr(routing_module, "split_run", counted)  # cut_run calls it
    async with ds.mem_wal_writer(commit="throughput") as router:
        # send_nowait queues without a checkpoint: all 100 wait for one run
        acks = [
            router.send_nowait(kv_table(range(i * 10, i * 10 + 10), value=i).to_batches()[0])
            for i in range(100)
        ]
        assert all(isinstance(a, BatchAck) for a in acks)
        summaries = [await a for a in acks]
        assert runs == [100]
        assert [s.rows for s in summaries] == [10] * 100
        writers = router.writers
        assert len(writers) == 4
        assert {w.stats().entries for w in writers.values()} == {1}
        assert sum(w.stats().engine_puts for w in writers.values()) == 4
        # each message's ack counts the shard puts that carried its rows
        spread = await ids_by_shard(ds, range(0, 10))
        assert summaries[0].engine_puts == len(spread)
    table = await ds.lsm.scan(columns=["id", "value"]).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(1_000))
    assert {r["id"]: r["value"] for r in table.to_pylist()} == {k: k // 10 for k in range(1_000)}


@pytest.mark.asyncio
async def test_puts_and_deletes_through_the_router_keep_their_order_per_key(
    table_uri: str,
) -> None:
    ds = await keyed(table_uri)
    async with ds.mem_wal_writer() as router:
        acks = [
            router.send_nowait(kv_table(range(50), value=1)),
            router.send_nowait(kv_table(range(50), value=2)),
        ]
        deleted = await router.delete(kv_table(range(0, 50, 2)))
        assert deleted.deletes == 25
        again = router.send_nowait(kv_table(range(0, 10), value=3))
        for ack in [*acks, again]:
            await ack
    table = await ds.lsm.scan(columns=["id", "value"]).to_table()
    expected = {k: 3 if k < 10 else 2 for k in range(50) if k < 10 or k % 2}
    assert {r["id"]: r["value"] for r in table.to_pylist()} == expected


@pytest.mark.asyncio
async def test_a_shard_put_limit_cuts_parts_and_every_ack_still_counts_its_rows(
    table_uri: str,
) -> None:
    ds = await keyed(table_uri, num_buckets=2, max_memtable_rows=7)
    async with ds.mem_wal_writer() as router:
        acks = [router.send_nowait(kv_table(range(i * 6, i * 6 + 6), value=i)) for i in range(20)]
        acks.append(await router.send(kv_table(range(500, 540), value=99)))
        summaries = [await a for a in acks]
        assert [s.rows for s in summaries] == [6] * 20 + [40]
        assert all(w.max_put_rows <= 7 for w in router.writers.values())
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert sorted(table.column("id").to_pylist()) == [*range(120), *range(500, 540)]


@pytest.mark.asyncio
async def test_a_fenced_shard_fails_only_the_sends_with_rows_in_it(table_uri: str) -> None:
    ds = await keyed(table_uri)
    spread = await ids_by_shard(ds, range(200))
    fenced, healthy = sorted(spread)[:2]
    async with ds.mem_wal_writer() as router:
        await router.put(kv_table(range(200)))  # every shard's writer is open
        other = await la.open_dataset(table_uri)
        async with other.mem_wal_writer(fenced) as owner:
            await owner.put(kv_table(spread[fenced][:1], value=7))  # claims the shard
            bad = router.send_nowait(kv_table(spread[fenced][1:3], value=8))
            good = router.send_nowait(kv_table(spread[healthy][:2], value=8))
            mixed = router.send_nowait(kv_table([spread[fenced][3], spread[healthy][2]], value=8))
            assert (await good).rows == 2
            for ack in (bad, mixed):
                with pytest.raises(la.errors.FencedError):
                    await ack
            # the router goes on routing to its healthy shards
            assert (await router.put(kv_table(spread[healthy][3:5], value=9))).rows == 2
    table = await ds.lsm.scan(columns=["id", "value"]).to_table()
    values = {r["id"]: r["value"] for r in table.to_pylist()}
    assert values[spread[healthy][0]] == 8 and values[spread[healthy][3]] == 9
    assert values[spread[fenced][0]] == 7 and values[spread[fenced][1]] == 0


@pytest.mark.asyncio
async def test_a_full_router_queue_times_out_and_stays_usable(table_uri: str) -> None:
    ds = await keyed(table_uri)
    async with ds.mem_wal_writer(max_queue_rows=10, max_put_rows=10) as router:
        first = router.send_nowait(kv_table(range(10)))
        with pytest.raises(anyio.WouldBlock):
            router.send_nowait(kv_table(range(10, 20)))
        await first
        await router.flush()
        assert (await router.put(kv_table(range(10, 20)))).rows == 10
        assert router.stats().queue_rows == 0


@pytest.mark.asyncio
async def test_num_buckets_alone_buckets_on_the_primary_key(table_uri: str) -> None:
    ds = await keyed(table_uri, num_buckets=3)
    sharding = await ds.sharding()
    assert (sharding.kind, sharding.column, sharding.num_buckets) == ("bucket", "id", 3)
    keyless = await la.write_dataset(
        pa.table({"x": [1]}), table_uri.replace(".lance", "-keyless.lance")
    )
    with pytest.raises(ValueError, match="primary key"):
        await keyless.initialize_mem_wal(num_buckets=3)


def _ack() -> Ack:
    ack = Ack()
    ack.add_part()  # the part a routed run holds until it is cut
    return ack


def _ids(item: Item) -> list[int]:
    """The keys of an entry that holds one record batch (a piece of a split)."""
    assert isinstance(item.batch, pa.RecordBatch)
    ids: list[int] = item.batch.column(0).to_pylist()
    return ids


def test_a_rejected_part_splits_into_one_entry_per_send_each_settling_its_own_ack() -> None:
    batch = kv_table(range(9)).to_batches()[0]
    acks = [_ack() for _ in range(3)]
    cut = ShardCut("s", batch, [0, 1, 2], [2, 3, 4], [1, 1, 1], [0, 2, 5], batch.nbytes)
    (fan,) = cut_part(Kind.PUT, cut, acks, limit=100)
    for ack in acks:
        ack.seal()
    part = RoutedPart(Kind.PUT, batch, fan, 9, 900, 0.0)
    pieces = part.split()
    assert [_ids(p) for p in pieces] == [[0, 1], [2, 3, 4], [5, 6, 7, 8]]
    assert sum(p.nbytes for p in pieces) == 900
    pieces[0].ack.part_done(rows=2, put_id=("s", 1))
    pieces[1].ack.part_failed(la.InvalidInputError("rejected"))
    pieces[2].ack.part_done(rows=4, put_id=("s", 2))
    assert acks[0].result().rows == 2
    with pytest.raises(la.InvalidInputError):
        acks[1].result()
    assert acks[2].result().rows == 4


def test_cutting_a_part_at_the_put_limit_gives_a_send_across_two_pieces_two_parts() -> None:
    batch = kv_table(range(10)).to_batches()[0]
    acks = [_ack() for _ in range(2)]
    cut = ShardCut("s", batch, [0, 1], [6, 4], [1, 1], [0, 6], batch.nbytes)
    fans = cut_part(Kind.PUT, cut, acks, limit=4)
    assert [f.row_counts for f in fans] == [[4], [2, 2], [2]]
    assert [f.starts for f in fans] == [[0], [0, 2], [0]]
    for ack in acks:
        ack.seal()
    for i, fan in enumerate(fans):
        fan.part_done(put_id=("s", i))
    assert acks[0].result().rows == 6 and acks[0].result().engine_puts == 2
    assert acks[1].result().rows == 4 and acks[1].result().engine_puts == 2


@pytest.mark.asyncio
async def test_cancelling_the_router_while_it_opens_shard_writers_resolves_every_ack(
    table_uri: str,
) -> None:
    ds = await keyed(table_uri, num_buckets=16)
    acks: list[Ack] = []
    with anyio.CancelScope() as outer:
        async with ds.mem_wal_writer() as router:
            for i in range(16):
                acks.append(await router.send(kv_table(range(i * 100, i * 100 + 100), value=i)))
            outer.cancel()  # the routing task is opening the 16 shards' writers
            await anyio.sleep(10)
    assert outer.cancelled_caught
    for ack in acks:
        with anyio.fail_after(30):  # only stops a hung test
            try:
                await ack
            except la.ClosedError:
                pass


@pytest.mark.asyncio
async def test_deletes_route_by_a_non_key_identity_column(tmp_path: Any) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=KV_SCHEMA.field("id").metadata),
            pa.field("region", pa.string()),
            pa.field("v", pa.int64()),
        ]
    )
    ds = await la.write_dataset(schema.empty_table(), str(tmp_path / "t.lance"), schema=schema)
    await ds.initialize_mem_wal(identity_column="region")
    async with ds.mem_wal_writer() as router:
        await router.put(
            pa.table({"id": [1, 2], "region": ["eu", "us"], "v": [1, 2]}, schema=schema)
        )
        with pytest.raises(la.SchemaMismatchError, match="region"):
            await router.delete({"id": [1]})  # which shard? the region says
        assert (await router.delete({"id": [1], "region": ["eu"]})).deletes == 1
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert table.column("id").to_pylist() == [2]


_ROOT = str(Path(__file__).resolve().parents[2])
"""The repository root (the claiming process imports ``tests.helpers``)."""

_CLAIM = """
import sys, anyio, lance_async as la
from tests.helpers import kv_table
async def main():
    ds = await la.open_dataset(sys.argv[1])
    async with ds.mem_wal_writer(sys.argv[2]) as w:
        await w.put(kv_table([int(sys.argv[3])], value=7))
anyio.run(main)
"""


@pytest.mark.asyncio
async def test_a_writer_in_another_process_fences_only_its_shard_of_the_router(
    table_uri: str,
) -> None:
    import subprocess
    import sys

    ds = await keyed(table_uri)
    spread = await ids_by_shard(ds, range(200))
    fenced, healthy = sorted(spread)[:2]
    async with ds.mem_wal_writer() as router:
        await router.put(kv_table(range(200)))  # every shard's writer is open here
        claim = [sys.executable, "-c", _CLAIM, table_uri, fenced, str(spread[fenced][0])]
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(claim, cwd=_ROOT, capture_output=True, text=True, timeout=120)
        )
        assert done.returncode == 0, done.stderr
        bad = router.send_nowait(kv_table(spread[fenced][1:3], value=8))
        good = router.send_nowait(kv_table(spread[healthy][:2], value=8))
        assert (await good).rows == 2
        with pytest.raises(la.errors.FencedError):
            await bad
        assert (await router.put(kv_table(spread[healthy][3:5], value=9))).rows == 2
    values = {
        r["id"]: r["value"]
        for r in (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
    }
    assert values[spread[fenced][0]] == 7  # the other process's row
    assert values[spread[fenced][1]] == 0  # nothing of the fenced send
    assert values[spread[healthy][0]] == 8 and values[spread[healthy][3]] == 9


@pytest.mark.asyncio
@pytest.mark.parametrize("piecewise", [False, True], ids=["concatenated", "piecewise"])
async def test_split_run_cuts_match_each_entrys_rows_shard_by_shard(
    table_uri: str, piecewise: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """split_run against a row-by-row reference: entries of one batch, of a
    group of batches (one of them empty), of one row, and one holding no
    rows; each shard's cut lists its entries in run order with their rows,
    batches and starts, and each entry counts the shards it touched. The
    same whether the run is concatenated or (large batches) cut batch by
    batch."""
    if piecewise:
        monkeypatch.setattr(routing_module, "PIECEWISE_BYTES", 0)
        monkeypatch.setattr(routing_module, "PIECEWISE_BATCH_BYTES", 0)
    ds = await keyed(table_uri)
    sharding = await ds.sharding()
    fit = TableFit(KV_SCHEMA, ["id"])

    def rows(ids: Any) -> pa.RecordBatch:
        return kv_table(ids).to_batches(max_chunksize=1_000)[0] if ids else _empty()

    groups: list[list[pa.RecordBatch]] = [
        [rows(range(0, 10))],
        [rows(range(10, 13)), _empty(), rows(range(13, 20))],
        [rows([7])],
        [],
        [rows(range(100, 140, 3))],
    ]
    entries: list[Any] = []
    for batches in groups:
        n = sum(b.num_rows for b in batches)
        if len(batches) == 1:
            entries.append(BatchAck(None, batches[0], n, batches[0].nbytes))
        else:
            entries.append(Item(Kind.PUT, batches or None, _ack(), n, 0, 0.0))
    cuts = split_run(sharding, fit, entries)

    def shard_of(batch: pa.RecordBatch) -> list[str]:
        return [sharding.shard_id(v) for v in sharding.values(batch).to_pylist()]

    expected: dict[str, list[tuple[int, list[int], int]]] = {}
    for index, batches in enumerate(groups):
        seen: dict[str, tuple[list[int], int]] = {}
        for batch in batches:
            ids = batch.column("id").to_pylist()
            mine: dict[str, list[int]] = {}
            for key, shard in zip(ids, shard_of(batch), strict=True):
                mine.setdefault(shard, []).append(key)
            for shard, keys in mine.items():
                before, count = seen.get(shard, ([], 0))
                seen[shard] = (before + keys, count + 1)
        for shard, (keys, count) in seen.items():
            expected.setdefault(shard, []).append((index, keys, count))
    assert {c.shard_id for c in cuts.cuts} == set(expected)
    for cut in cuts.cuts:
        ids = cut.batch.column("id").to_pylist()
        got = [
            (entry, ids[start : start + n], batches)
            for entry, n, batches, start in zip(
                cut.entries, cut.rows, cut.batches, cut.starts, strict=True
            )
        ]
        assert got == expected[cut.shard_id]
        assert cut.batch.schema.equals(KV_SCHEMA, check_metadata=True)
    assert cuts.touched == [
        sum(1 for members in expected.values() if any(m[0] == i for m in members))
        for i in range(len(groups))
    ]
    run = [b for g in groups for b in g]
    # the room the cuts hold: the run's bytes (measured on its concatenation,
    # or batch by batch when it was never concatenated), shared by rows
    whole = (
        sum(b.nbytes for b in run) if piecewise else pa.concat_batches(run).get_total_buffer_size()
    )
    assert whole - len(cuts.cuts) <= sum(c.nbytes for c in cuts.cuts) <= whole


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=KV_SCHEMA)


def test_a_run_of_batches_whose_schemas_differ_is_cut_under_the_table_schema() -> None:
    """Checked batches may differ from the table's schema in a nullability
    flag (and then from each other): one concatenation refuses them, so
    they are relabelled batch by batch."""
    fit = TableFit(KV_SCHEMA, ["id"])
    first = kv_table(range(3)).to_batches()[0]
    strict = pa.schema([pa.field(f.name, f.type, nullable=False) for f in KV_SCHEMA])
    second = fit.check(kv_table(range(3, 5)).to_batches()[0].cast(strict))
    whole = _concat_run(fit, [first, second])
    assert whole.column("id").to_pylist() == [0, 1, 2, 3, 4]
    assert whole.schema.equals(KV_SCHEMA, check_metadata=True)


@pytest.mark.asyncio
async def test_a_run_is_cut_batch_by_batch_only_when_its_queued_bytes_say_large(
    table_uri: str,
) -> None:
    """The choice reads the bytes the entries hold room for (counted once, at
    the send), not each batch's size again: a run of many small sends is
    concatenated; one of large batches is cut batch by batch, unless a batch
    lacks the sharded column (the concatenated run's check then names it)."""
    from lance_async.memwal.routing import PIECEWISE_BATCH_BYTES, PIECEWISE_BYTES, _piecewise

    ds = await keyed(table_uri)
    sharding = await ds.sharding()
    small = [kv_table(range(i, i + 10)).to_batches()[0] for i in range(0, 1_000, 10)]
    assert not _piecewise(sharding, small, sum(b.nbytes for b in small))
    two = [kv_table(range(i, i + 200_000)).to_batches()[0] for i in (0, 200_000)]
    large = sum(b.nbytes for b in two)
    assert large >= max(PIECEWISE_BYTES, 2 * PIECEWISE_BATCH_BYTES)
    assert _piecewise(sharding, two, large)
    assert not _piecewise(sharding, two, PIECEWISE_BYTES - 1)  # the entries say small
    # slices of one large buffer hold room for all of it: their own bytes decide
    buffer = kv_table(range(200_000)).to_batches()[0]
    slices = [buffer.slice(i, 10) for i in range(0, 1_000, 10)]
    queued = sum(b.get_total_buffer_size() for b in slices)
    assert queued >= PIECEWISE_BYTES and not _piecewise(sharding, slices, queued)
    keyless = pa.RecordBatch.from_pydict({"value": [1]})
    assert not _piecewise(sharding, [two[0], keyless], large)
    assert not _piecewise(sharding, two[:1], large)  # one batch: nothing to join
