"""One key, one shard: a table's sharding spec, and the shard id of every row.

Lance's MemWAL resolves "newest row per primary key" inside a shard only;
across shards there is no order (the MemWAL spec: every row with a given
primary key must map to the same shard). pylance 14 leaves the mapping to the
caller: ``initialize_mem_wal`` records a sharding spec (bucket, identity or
unsharded), ``lance.mem_wal.evaluate_sharding_spec`` gives a row's shard
value, and any writer accepts any row. :class:`Sharding` closes the loop:

* every shard value has one shard id, ``uuid5(SHARD_NAMESPACE,
  "{spec_id}/{value}")`` (with the MemWAL epoch mixed in after a
  re-initialization; see ``retired.py``), the same in every process;
* :meth:`Sharding.split` groups a batch's rows by shard id, and
  :meth:`Sharding.check` refuses rows that do not belong to a shard, with
  :class:`~lance_async.errors.WrongShardError`, before anything is queued.

A table initialized without a spec has *manual* shards: callers name shard
ids themselves and lance_async cannot tell which shard a key belongs to. The
rule is then the caller's to keep (one key, one shard id, always);
``lance-async check`` finds keys that broke it.

The idea is Fluss's client-side bucketing and Paimon's one writer per bucket:
the bucket is computed where the row enters, never guessed later.
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import evaluate_sharding_spec

from .._args import check_int
from .._table import Table
from .._threads import run_sync
from ..errors import InvalidInputError, WrongShardError
from ..lsm.keyvalues import key_values
from .retired import derived_shard_id, mem_wal_epoch

__all__ = [
    "DEFAULT_NUM_BUCKETS",
    "MAX_NUM_BUCKETS",
    "SHARD_NAMESPACE",
    "Sharding",
    "default_shard_id",
    "read_sharding",
    "sharding_of",
    "sharding_options",
]

SHARD_NAMESPACE = uuid.UUID("6c616e63-655f-6173-796e-635f73686172")
"""The UUID namespace of the shard ids lance_async derives from shard values."""

DEFAULT_NUM_BUCKETS = 4
"""Buckets of a keyed table's MemWAL when ``initialize_mem_wal`` is given no
sharding mode: bucket sharding on the (first) primary-key column. Each bucket
is a shard with one writer; this many workers can ingest one table at once."""


_SHARDING_OPTIONS = ("bucket_column", "num_buckets", "identity_column", "unsharded")

MAX_NUM_BUCKETS = 1024
"""The most buckets a bucket-sharded MemWAL may have (what pylance 14 enforces)."""


def sharding_options(
    schema: pa.Schema, options: Mapping[str, Any], manual_shards: bool
) -> dict[str, Any]:
    """``initialize_mem_wal`` options with lance_async's default sharding filled in.

    With no sharding option given and ``manual_shards`` False: bucket sharding
    on the first primary-key column into :data:`DEFAULT_NUM_BUCKETS` buckets
    (every row of a key, composite or not, shares that column's value, so a
    key has one bucket). ``num_buckets`` alone buckets on that column too.
    A keyless table keeps pylance's default (its MemWAL is refused later for
    having no key).

    Raises
    ------
    TypeError, ValueError
        ``manual_shards`` together with a sharding option; ``num_buckets``
        not an int from 1 to :data:`MAX_NUM_BUCKETS`; ``num_buckets`` alone on
        a table without a primary key.
    """
    out = dict(options)
    if out.get("num_buckets") is not None:
        out["num_buckets"] = check_int(
            "num_buckets", out["num_buckets"], minimum=1, maximum=MAX_NUM_BUCKETS
        )
    given = [k for k in _SHARDING_OPTIONS if out.get(k) not in (None, False)]
    if manual_shards:
        if given:
            raise ValueError(f"manual_shards=True cannot be combined with {given[0]}=")
        return out
    only_buckets = given == ["num_buckets"]
    if not given or only_buckets:
        from .._schema import primary_key

        keys = primary_key(schema)
        if keys:
            out["bucket_column"] = keys[0]
            out.setdefault("num_buckets", DEFAULT_NUM_BUCKETS)
        elif only_buckets:
            raise ValueError(
                "num_buckets= without bucket_column= buckets on the primary key, and the "
                "table has none: name the column (bucket_column=...)"
            )
    return out


def default_shard_id(spec_id: int, value: Any, epoch: str | None = None) -> str:
    """The shard UUID of a shard value (deterministic, the same in every process).

    ``epoch`` is the table's MemWAL epoch (set when the MemWAL was
    initialized again over retired shards; see ``retired.py``): it gives the
    new MemWAL fresh shard ids. None for a first MemWAL.
    """
    return derived_shard_id(SHARD_NAMESPACE, f"{spec_id}/{value}", epoch)


#: Shard ids of recent shard values (a uuid5 is about 3 us; a bucket table
#: has a handful of values). ``typed``: 1, 1.0 and True name other shards.
_cached_shard_id = functools.lru_cache(maxsize=4096, typed=True)(default_shard_id)


@functools.lru_cache(maxsize=256)
def _value_of(spec_id: int, values: int, epoch: str | None, shard_id: str) -> int | None:
    """The shard value in ``range(values)`` whose shard id is ``shard_id``, or None."""
    try:
        canonical = str(uuid.UUID(shard_id))
    except ValueError:
        return None
    for value in range(values):
        if _cached_shard_id(spec_id, value, epoch) == canonical:
            return value
    return None


@dataclass(frozen=True)
class Sharding:
    """How a MemWAL table maps rows to shards.

    Obtain it with :meth:`AsyncDataset.sharding` (or :func:`read_sharding`).

    Attributes
    ----------
    kind : {"bucket", "identity", "unsharded", "manual"}
        The spec's transform; "manual" when the MemWAL has no spec (shard
        ids are the callers' choice and nothing can be checked).
    spec_id : int
        The spec's id (0 for manual).
    column : str or None
        The sharded column (bucket and identity).
    num_buckets : int or None
        Buckets (bucket sharding).
    epoch : str or None
        The MemWAL epoch mixed into derived shard ids.
    spec : dict or None
        The engine's spec, as ``mem_wal_index_details()`` gives it.

    Notes
    -----
    :meth:`values`, :meth:`split` and :meth:`check` evaluate the spec in the
    engine (``evaluate_sharding_spec``): blocking CPU work of a few
    microseconds for a small batch, about 80 us for 10,000 rows.
    """

    kind: str
    spec_id: int
    column: str | None
    num_buckets: int | None
    epoch: str | None
    spec: Mapping[str, Any] | None
    lance_schema: Any = None

    @property
    def sharded(self) -> bool:
        """True unless the shards are manual."""
        return self.kind != "manual"

    # -- shard ids --------------------------------------------------------------
    def shard_id(self, value: Any) -> str:
        """The shard id of a shard value (a bucket number, an identity value, 0).

        Raises
        ------
        InvalidInputError
            The table has manual shards.
        """
        if not self.sharded:
            raise InvalidInputError(
                "this MemWAL has manual shards: shard ids are the caller's choice. "
                "Initialize the MemWAL with a sharding spec (bucket sharding on the key is "
                "lance_async's default) to route rows"
            )
        return _cached_shard_id(self.spec_id, value, self.epoch)

    def default_shard(self) -> str:
        """The shard lance_async's own tools write a table with *manual* shards
        through (``lance-async ingest``, the example server): one shard per
        table, so their writes never split a key (fresh per MemWAL epoch)."""
        return derived_shard_id(SHARD_NAMESPACE, "manual-default", self.epoch)

    def shard_ids(self) -> list[str]:
        """Every shard id of a bucket (or unsharded) table, by bucket number.

        Raises
        ------
        InvalidInputError
            Identity sharding (one shard per value: they cannot be listed
            ahead) or manual shards.
        """
        if self.kind == "bucket":
            assert self.num_buckets is not None
            return [self.shard_id(b) for b in range(self.num_buckets)]
        if self.kind == "unsharded":
            return [self.shard_id(0)]
        raise InvalidInputError(f"a table with {self.kind} sharding has no fixed list of shards")

    def value_of(self, shard_id: str) -> Any:
        """The shard value whose shard id is ``shard_id`` (bucket and
        unsharded tables), or None when it is none of them."""
        if self.kind not in ("bucket", "unsharded"):
            return None
        return _value_of(self.spec_id, self.num_buckets or 1, self.epoch, str(shard_id))

    # -- rows ----------------------------------------------------------------------
    def values(self, batch: pa.RecordBatch) -> pa.Array:
        """Each row's shard value (blocking; the engine evaluates the spec).

        Raises
        ------
        InvalidInputError
            Manual shards, or the batch lacks the sharded column.
        """
        if not self.sharded or self.spec is None:
            raise InvalidInputError("a table with manual shards has no shard values")
        if self.column is not None and self.column not in batch.schema.names:
            raise InvalidInputError(f"the rows lack the sharded column {self.column!r}")
        if self.kind == "unsharded":
            return pa.array([0] * batch.num_rows, pa.int32())
        out = evaluate_sharding_spec(batch, dict(self.spec), self.lance_schema).column(0)
        return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out

    def split(self, batch: pa.RecordBatch) -> list[tuple[str, pa.RecordBatch]]:
        """The batch's rows grouped by shard id, in row order within each (blocking)."""
        if batch.num_rows == 0:
            return []
        values = self.values(batch)
        if pa.types.is_integer(values.type) and values.null_count == 0:
            # buckets: one stable sort, one take, zero-copy slices per shard
            ints = values.to_numpy()
            first = ints[0]
            if (ints == first).all():
                return [(self.shard_id(int(first)), batch)]
            order = np.argsort(ints, kind="stable")
            ranked = ints[order]
            cuts = [0, *(np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist(), len(ranked)]
            taken = batch.take(pa.array(order))
            return [
                (self.shard_id(int(ranked[a])), taken.slice(a, b - a))
                for a, b in itertools.pairwise(cuts)
            ]
        uniques = pc.unique(values)
        if len(uniques) == 1:
            return [(self.shard_id(uniques[0].as_py()), batch)]
        return [
            (self.shard_id(value.as_py()), batch.filter(pc.equal(values, value)))
            for value in uniques
        ]

    def check(self, batch: pa.RecordBatch, shard_id: str) -> None:
        """Refuse rows that do not map to ``shard_id`` (blocking).

        Raises
        ------
        WrongShardError
            A row belongs to another shard; the error names its key and both
            shards.
        """
        if not self.sharded or batch.num_rows == 0:
            return
        values = self.values(batch)
        expected = self.value_of(shard_id)
        if (
            expected is not None
            and values.null_count == 0
            and (values.to_numpy(zero_copy_only=False) == expected).all()
        ):
            return  # the common case: one comparison, no shard ids computed
        uniques = pc.unique(values)
        for value in uniques:
            owner = self.shard_id(value.as_py())
            if owner != shard_id:
                row = pc.index(values, value).as_py()
                key = self.column or "row"
                example = batch.column(key)[row].as_py() if self.column else row
                raise WrongShardError(
                    f"the row with {key}={example!r} belongs to shard {owner} "
                    f"({self.kind} value {value.as_py()!r}), not to shard {shard_id}: "
                    "every key has one shard. Nothing of this batch was queued; send it "
                    "through a routing writer (dataset.mem_wal_writer() with no shard id)",
                    shard_id=owner,
                )

    def shard_of_key(self, schema: pa.Schema, keys: list[str], key: Any) -> str:
        """The shard id holding a primary key (for lookups).

        Raises
        ------
        InvalidInputError
            Manual shards, or a key of the wrong shape or type.
        """
        pairs = dict(key_values(schema, keys, key))
        if self.column is None:  # unsharded
            return self.shard_id(0)
        if self.column not in pairs:
            raise InvalidInputError(f"the key does not give the sharded column {self.column!r}")
        try:
            arrays = {
                name: pa.array([value], type=schema.field(name).type)
                for name, value in pairs.items()
            }
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise InvalidInputError(f"key {key!r} does not fit the key type: {exc}") from exc
        batch = pa.RecordBatch.from_pydict(arrays)
        return self.shard_id(self.values(batch)[0].as_py())


def sharding_of(details: Mapping[str, Any] | None, lance_ds: Any) -> Sharding:
    """The :class:`Sharding` of a MemWAL's index details (blocking: reads the
    table's config for the epoch).

    Parameters
    ----------
    details : dict or None
        ``LanceDataset.mem_wal_index_details()``.
    lance_ds : lance.LanceDataset
        The table at the version the details were read from.

    Raises
    ------
    InvalidInputError
        No MemWAL is initialized.
    """
    if details is None:
        raise InvalidInputError(
            "the table has no MemWAL; initialize it first (lance-async init-wal, or "
            "AsyncDataset.initialize_mem_wal)"
        )
    specs: Iterable[Mapping[str, Any]] = details.get("sharding_specs") or []
    specs = list(specs)
    epoch = mem_wal_epoch(lance_ds)
    if not specs:
        return Sharding("manual", 0, None, None, epoch, None, None)
    spec = max(specs, key=lambda s: int(s["spec_id"]))
    fields = list(spec.get("fields") or [])
    if len(fields) != 1:
        raise InvalidInputError(f"sharding specs of {len(fields)} fields are not supported")
    field = fields[0]
    transform = str(field.get("transform") or "")
    if transform not in ("bucket", "identity", "unsharded"):
        raise InvalidInputError(f"the sharding transform {transform!r} is not supported")
    column: str | None = None
    sources = list(field.get("source_ids") or [])
    if sources:
        column = _column_of(lance_ds, int(sources[0]))
    buckets = (field.get("parameters") or {}).get("num_buckets")
    return Sharding(
        transform,
        int(spec["spec_id"]),
        column,
        int(buckets) if buckets is not None else None,
        epoch,
        dict(spec),
        lance_ds.lance_schema,
    )


def _column_of(lance_ds: Any, field_id: int) -> str:
    """The name of the top-level column with Lance field id ``field_id``."""
    for field in lance_ds.lance_schema.fields():
        if field.id() == field_id:
            return str(field.name())
    raise InvalidInputError(f"the sharding spec names field id {field_id}, which the table lacks")


async def read_sharding(dataset: Table) -> Sharding:
    """The :class:`Sharding` of ``dataset``'s latest version (on a worker thread).

    Raises
    ------
    InvalidInputError
        No MemWAL is initialized.
    """
    ds = dataset.lance

    def read() -> tuple[Any, Sharding]:
        latest = ds.checkout_version(ds.latest_version) if ds.latest_version != ds.version else ds
        return latest, sharding_of(latest.mem_wal_index_details(), latest)

    latest, sharding = await run_sync(read)
    dataset._advance(latest)
    return sharding
