"""Routing in bulk: a run of queued sends cut into one part per shard.

The :class:`~lance_async.ShardRouter` queues every send whole, in an
:class:`~lance_async.memwal.accumulator.Accumulator` of its own (the same
room, backpressure and coalescing as a shard writer's queue, and the only
queue of the path: a send keeps its room there until it is written). Its
routing task takes what queued while it routed the previous run (paced as
the commit policy paces puts) and assigns every row of the run to its shard
in *one* evaluation of the sharding spec (:func:`cut_run`, :func:`split_run`;
a large run on a worker thread, see ``router.ROUTE_INLINE_ROWS``), then
hands each shard one :class:`RoutedPart` straight to its committer
(``handoff.py``): one engine put. Per message the event loop does what a
shard writer's send does (a schema check and a queue entry); the spec, the
sort and the cuts are paid once per run.

A part carries the rows of many sends. Its ack (:class:`FanOut`) settles
every send with its own rows once the put holding them is durable, so a
send's ack resolves when the puts of every shard its rows went to have. If
the engine rejects a part, the shard's committer retries it send by send
(:meth:`RoutedPart.split`) in place, before the next put of that shard, so
only the send with the rejected row fails and the order of the shard's rows
is kept.

The idea is Kafka's producer (records accumulate per partition, batches go
out per broker) and Fluss's client-side bucketing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._schema import TableFit
from .._threads import run_sync
from ..errors import InvalidInputError
from .accumulator import Entry, Item, Kind
from .acks import Ack
from .sharding import Sharding

__all__ = ["FanOut", "RoutedPart", "RunCuts", "ShardCut", "cut_part", "cut_run", "split_run"]


class FanOut(Ack):
    """The ack of a :class:`RoutedPart`: settles each member send with its own rows.

    The committer settles a part like any entry (``part_done`` /
    ``part_failed``); this passes the outcome on to the ack of every send
    with rows in the part (one of each such ack's parts). Nobody awaits a
    ``FanOut`` itself.

    Parameters
    ----------
    kind : Kind
        PUT or DELETE (deleted keys are counted as ``deletes``).
    acks : list of Ack
        The member sends' acks, in the part's row order.
    rows, batches, starts : list of int
        Per member: its rows in the part, its batches with rows in the part,
        and where its rows start (they are contiguous).
    """

    __slots__ = ("acks", "batch_counts", "kind", "row_counts", "starts")

    def __init__(
        self,
        kind: Kind,
        acks: list[Ack],
        rows: list[int],
        batches: list[int],
        starts: list[int],
    ) -> None:
        super().__init__(None)
        self.kind = kind
        self.acks = acks
        self.row_counts = rows
        self.batch_counts = batches
        self.starts = starts

    def part_done(
        self,
        *,
        rows: int = 0,
        batches: int = 0,
        put_id: Any = None,
        deletes: int = 0,
        put_ids: Iterable[Any] = (),
    ) -> None:
        # the hot path of a routed feed: one pass, attribute updates inline;
        # each part is one put of its own shard, so it is counted, not named
        deleting = self.kind is Kind.DELETE
        for ack, n, b in zip(self.acks, self.row_counts, self.batch_counts, strict=True):
            ack.counted_part_done(n, b, deleting)
        self.acks = []

    def part_failed(self, error: BaseException) -> None:
        for ack in self.acks:
            ack.part_failed(error)
        self.acks = []


class RoutedPart(Item):
    """One shard's rows of a routed run: one queue entry of that shard's writer.

    Its ``batch`` is one record batch under the table schema, the rows of
    each member send contiguous and in send order; its ``ack`` is the
    :class:`FanOut` of the members.
    """

    __slots__ = ()

    ack: FanOut

    def split(self) -> list[Item]:
        """One entry per member send (what the committer retries after the
        engine rejected the whole part); each settles its own send's ack.
        Room is divided by rows, the last entry taking the remainder."""
        batch, fan = self.batch, self.ack
        if not isinstance(batch, pa.RecordBatch) or len(fan.acks) <= 1:
            return [self]
        members = list(zip(fan.acks, fan.row_counts, fan.batch_counts, fan.starts, strict=True))
        fan.acks = []
        self.batch = None
        out: list[Item] = []
        left = self.nbytes
        for i, (ack, rows, batches, start) in enumerate(members):
            share = left if i == len(members) - 1 else self.nbytes * rows // max(1, self.rows)
            left -= share
            one = FanOut(self.kind, [ack], [rows], [batches], [0])
            out.append(Item(self.kind, batch.slice(start, rows), one, rows, share, self.queued_at))
        return out


def cut_part(kind: Kind, cut: ShardCut, acks: list[Ack], limit: int) -> list[FanOut]:
    """The :class:`FanOut` of each piece of at most ``limit`` rows of a shard's
    cut (one piece when it fits; a writer never puts more than its
    ``max_put_rows``). A send whose rows span two pieces gets one more part
    of its ack per extra piece (added here, before any piece is queued).
    Piece ``i`` holds rows ``[i * limit, (i + 1) * limit)`` of ``cut.batch``.
    """
    total = cut.batch.num_rows
    if total <= limit:
        return [FanOut(kind, acks, cut.rows, cut.batches, cut.starts)]
    out: list[FanOut] = []
    for lo in range(0, total, limit):
        hi = min(total, lo + limit)
        fan_acks: list[Ack] = []
        rows: list[int] = []
        batches: list[int] = []
        starts: list[int] = []
        for ack, n, b, start in zip(acks, cut.rows, cut.batches, cut.starts, strict=True):
            a, z = max(start, lo), min(start + n, hi)
            if a >= z:
                continue
            if a > start:  # a later piece of this send: one more part of its ack
                ack.add_part()
            fan_acks.append(ack)
            rows.append(z - a)
            batches.append(b if a == start else 0)
            starts.append(a - lo)
        out.append(FanOut(kind, fan_acks, rows, batches, starts))
    return out


class ShardCut(NamedTuple):
    """One shard's rows of a run (made by :func:`split_run`, which touches no ack).

    Attributes
    ----------
    shard_id : str
    batch : pa.RecordBatch
        The rows, under the table schema (the key columns for deletes).
    entries, rows, batches, starts : list of int
        For each entry of the run with rows in this shard, in run order: its
        index in the run, its rows here, its batches with rows here, and
        where its rows start in ``batch``.
    nbytes : int
        The bytes its rows hold room for: the run's share by rows (the
        rows are a slice of one taken batch; measuring a slice's bytes
        walks its buffers).
    """

    shard_id: str
    batch: pa.RecordBatch
    entries: list[int]
    rows: list[int]
    batches: list[int]
    starts: list[int]
    nbytes: int


class RunCuts(NamedTuple):
    """A run cut per shard: the cuts, and for each entry of the run the
    number of shards its rows went to."""

    cuts: list[ShardCut]
    touched: list[int]


def _run_batches(entries: Sequence[Entry]) -> tuple[list[pa.RecordBatch], list[int], list[int]]:
    """The run's non-empty batches, the entry each belongs to, and their rows."""
    batches: list[pa.RecordBatch] = []
    owner: list[int] = []
    lengths: list[int] = []
    for index, entry in enumerate(entries):
        batch = entry.batch
        if batch is None:
            continue
        for b in batch if isinstance(batch, list) else (batch,):
            n = b.num_rows
            if n:
                batches.append(b)
                owner.append(index)
                lengths.append(n)
    return batches, owner, lengths


def _concat_run(fit: TableFit, batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The run's batches as one batch under the table schema (``fit``'s).

    Checked batches have the table's columns, in its order, with its types:
    one concatenation (``pa.concat_batches`` ignores metadata), relabelled
    once. Batches it refuses (a nullability flag that differs) go through
    :meth:`TableFit.relabel`, batch by batch.
    """
    whole: pa.RecordBatch | None = batches[0]
    if len(batches) > 1:
        try:
            whole = pa.concat_batches(batches)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            whole = None
    if whole is None:
        return fit.relabel(batches).combine_chunks().to_batches()[0]
    if whole.schema.equals(fit.schema, check_metadata=True):
        return whole
    return pa.RecordBatch.from_arrays(whole.columns, schema=fit.schema)


def _codes(values: pa.Array) -> tuple[np.ndarray, list[Any] | None]:
    """Each row's shard value as an integer to sort by, and the values by that
    integer (None when the integers are the values: buckets)."""
    if pa.types.is_integer(values.type) and values.null_count == 0:
        return values.to_numpy(), None
    encoded = pc.dictionary_encode(values, null_encoding="encode")
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary.to_pylist()


def _narrow(codes: np.ndarray) -> np.ndarray:
    """``codes`` as 16-bit integers when they fit (bucket numbers do): numpy's
    stable sort of them is then a radix sort, about twice as fast."""
    if codes.dtype.itemsize > 2 and codes.min() >= 0 and codes.max() < 2**15:
        return codes.astype(np.int16)
    return codes


PIECEWISE_BYTES = 8 << 20
"""A run of at least this many bytes, in batches of :data:`PIECEWISE_BATCH_BYTES`
or more on average, is cut without concatenating it: each shard's rows are
taken batch by batch and joined once, so a large send costs one copy of its
rows here, not two (the concatenated run and the sorted take of it)."""

PIECEWISE_BATCH_BYTES = 256 << 10


def _piecewise(sharding: Sharding, batches: Sequence[pa.RecordBatch], nbytes: int) -> bool:
    """Whether to cut this run shard by shard, batch by batch (large batches;
    ``nbytes``: the room its entries hold, their batches' size as queued)."""
    column = sharding.column
    if len(batches) < 2 or column is None or sharding.kind == "unsharded":
        return False
    if nbytes < PIECEWISE_BYTES or nbytes < PIECEWISE_BATCH_BYTES * len(batches):
        return False  # small batches, the common run: nothing more to look at
    # a slice's room counts its whole buffer: the batches' own bytes decide
    total = sum(int(b.nbytes) for b in batches)
    if total < PIECEWISE_BYTES or total < PIECEWISE_BATCH_BYTES * len(batches):
        return False
    # the whole run's check names a missing column
    return all(b.schema.get_field_index(column) >= 0 for b in batches)


def _take_pieces(
    fit: TableFit,
    batches: Sequence[pa.RecordBatch],
    lengths: Sequence[int],
    rows: np.ndarray,
    row_batch: np.ndarray,
) -> pa.RecordBatch:
    """One shard's rows of a run, in run order, as one batch under the table
    schema: ``rows`` (run positions, ascending) taken from the batch each
    lies in (``row_batch``), the pieces joined once."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    cuts = [0, *(np.flatnonzero(row_batch[1:] != row_batch[:-1]) + 1).tolist(), len(rows)]
    pieces = []
    for a, z in itertools.pairwise(cuts):
        i = int(row_batch[a])
        local = rows[a:z] - starts[i]
        whole = z - a == lengths[i]  # every row of the batch: no take
        pieces.append(batches[i] if whole else batches[i].take(pa.array(local)))
    return _concat_run(fit, pieces)


def split_run(sharding: Sharding, fit: TableFit, entries: Sequence[Entry]) -> RunCuts:
    """Cut a run of queued entries (one kind) into one part per shard (blocking).

    Concatenates the run's batches under the table schema (``fit``: the
    table's for puts, the key columns' for deletes), evaluates the sharding
    spec once on all of them, and sorts the rows stably by shard: each
    shard's rows are one slice, each entry's rows a contiguous piece of it,
    in run order. The per-shard lists come from one pass over the sorted
    rows (segments: the rows of one entry in one shard). CPU only.

    Raises
    ------
    InvalidInputError
        The rows lack the sharded column.
    Exception
        The engine's error evaluating the spec (the caller then routes the
        run entry by entry, to fail only the entry that caused it).
    """
    batches, owner, lengths = _run_batches(entries)
    if not batches:
        return RunCuts([], [0] * len(entries))
    piecewise = _piecewise(sharding, batches, sum(e.nbytes for e in entries))
    table: pa.RecordBatch | None = None
    if piecewise:  # large batches: only the sharded column is concatenated
        column = sharding.column
        assert column is not None
        keyed = pa.RecordBatch.from_arrays(
            [pa.concat_arrays([b.column(column) for b in batches])], names=[column]
        )
        n = keyed.num_rows
        total_bytes = sum(b.nbytes for b in batches)
        codes, values = _codes(sharding.values(keyed))
    else:
        table = _concat_run(fit, batches)
        n = table.num_rows
        total_bytes = table.get_total_buffer_size()
        codes, values = _codes(sharding.values(table))

    def value(code: Any) -> Any:
        return int(code) if values is None else values[int(code)]

    row_batch = np.repeat(np.arange(len(batches), dtype=np.int64), lengths)
    row_entry = np.asarray(owner, dtype=np.int64)[row_batch]
    order: np.ndarray | None = None
    if (codes == codes[0]).all():  # one shard: no sort, no take
        ranked = codes
        taken = table if table is not None else _concat_run(fit, batches)
    else:  # one stable sort: each shard's rows a slice, in run order within it
        order = np.argsort(_narrow(codes), kind="stable")
        ranked = codes[order]
        taken = table.take(pa.array(order)) if table is not None else None
        row_batch = row_batch[order]
        row_entry = row_entry[order]
    # segments: the rows of one entry in one shard (contiguous, in run order)
    new_shard = np.empty(n, dtype=bool)
    new_shard[0] = True
    np.not_equal(ranked[1:], ranked[:-1], out=new_shard[1:])
    new_batch = np.empty(n, dtype=bool)
    new_batch[0] = True
    np.not_equal(row_batch[1:], row_batch[:-1], out=new_batch[1:])
    new_batch |= new_shard
    segment = new_shard.copy()
    segment[1:] |= row_entry[1:] != row_entry[:-1]
    seg = np.flatnonzero(segment)
    seg_entry = row_entry[seg]
    seg_rows = np.diff(np.append(seg, n))
    seg_batches = np.add.reduceat(new_batch.astype(np.int64), seg)
    shard_starts = np.flatnonzero(new_shard)
    shard_first_seg = np.searchsorted(seg, shard_starts)
    # each entry's rows in a shard are one segment: its segments count its shards
    touched = np.bincount(seg_entry, minlength=len(entries))
    seg_entry_l, seg_rows_l, seg_batches_l = (
        seg_entry.tolist(),
        seg_rows.tolist(),
        seg_batches.tolist(),
    )
    seg_l = seg.tolist()
    firsts = [*shard_first_seg.tolist(), len(seg_l)]
    bounds = [*shard_starts.tolist(), n]
    out: list[ShardCut] = []
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        lo, hi = firsts[k], firsts[k + 1]
        if taken is not None:
            rows = taken.slice(a, b - a)
        else:  # this shard's rows taken batch by batch, then joined once
            assert order is not None
            rows = _take_pieces(fit, batches, lengths, order[a:b], row_batch[a:b])
        out.append(
            ShardCut(
                sharding.shard_id(value(ranked[a])),
                rows,
                seg_entry_l[lo:hi],
                seg_rows_l[lo:hi],
                seg_batches_l[lo:hi],
                [x - a for x in seg_l[lo:hi]],
                total_bytes * (b - a) // n,
            )
        )
    return RunCuts(out, touched.tolist())


async def cut_run(
    sharding: Sharding, fit: TableFit, run: list[Entry], inline_rows: int
) -> list[tuple[list[Entry], ShardCut]]:
    """A run of queued entries (one kind) cut per shard: each cut with the
    entries it indexes. One :func:`split_run` of the whole run, on the event
    loop up to ``inline_rows`` rows, else on a worker thread; when the spec
    cannot be evaluated on it, entry by entry, so only the entry at fault
    fails (an :class:`InvalidInputError`). Each entry's own part of its ack
    becomes one per shard its rows went to (an entry with no rows resolves).
    """
    rows = sum(e.rows for e in run)
    try:
        if rows <= inline_rows:  # cheaper than the thread hop it would take
            groups = [(run, split_run(sharding, fit, run))]
        else:
            groups = [(run, await run_sync(partial(split_run, sharding, fit, run)))]
    except Exception:  # route entry by entry: only the entry at fault fails
        groups = []
        for entry in run:
            try:
                one = await run_sync(partial(split_run, sharding, fit, [entry]))
            except Exception as exc:
                _refuse(entry, exc)
            else:
                groups.append(([entry], one))
    for entries, cut in groups:
        for entry, shards in zip(entries, cut.touched, strict=True):
            # the entry's own part (held while it was routed) becomes one per shard
            entry.batch = None
            entry.ack.add_parts(shards - 1)
            if not shards:
                entry.ack.maybe_resolve()
    return [(entries, shard_cut) for entries, cut in groups for shard_cut in cut.cuts]


def _refuse(entry: Entry, exc: Exception) -> None:
    """Fail an entry whose rows the sharding spec could not be evaluated on."""
    error = (
        exc
        if isinstance(exc, InvalidInputError)
        else InvalidInputError(f"the sharding spec could not be evaluated on these rows: {exc}")
    )
    if error is not exc:
        error.__cause__ = exc
    entry.batch = None
    entry.ack.part_failed(error)
