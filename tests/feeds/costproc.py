"""Child process of ``test_message_cost.py``: what one large message costs.

``python -m tests.feeds.costproc MB WIDTH`` prints one JSON object, measured in
this order:

* ``ingest_rss`` -- the peak resident memory of ``ingest()`` taking one
  NDJSON message of MB megabytes (rows of WIDTH characters) through a routing
  writer, over the message's size (Linux: ``VmHWM`` reset through
  ``/proc/self/clear_refs``; first, before anything else inflates the heap);
* ``route_arrow`` -- Arrow's peak while a run of that size is cut per shard,
  over the run's size;
* ``ndjson_python`` / ``array_python`` -- Python's copies decoding the payload
  as NDJSON and as a JSON array (tracemalloc's peak over the payload's size);
* ``ndjson_arrow`` -- Arrow's peak decoding the NDJSON, over the table's size.

Arrow's peaks are read from a proxy pool set as the default for the one step
(its own statistics), so no earlier step counts.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pyarrow as pa

from ..helpers import KV_SCHEMA


def payload(mb: float, width: int, array: bool = False) -> bytes:
    n = int(mb * 1e6 / (width + 40))
    rows = [json.dumps({"id": i, "value": i, "name": "x" * width}) for i in range(n)]
    return (("[" + ",\n".join(rows) + "]") if array else "\n".join(rows)).encode()


def reset_peak() -> None:
    """Start the process's peak resident memory (``VmHWM``) from now (Linux)."""
    Path("/proc/self/clear_refs").write_text("5")


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


_POOLS: list[Any] = []  # a pool must outlive every buffer it allocated: kept to the end


class ArrowPeak:
    """Arrow allocations of one step, counted apart (a proxy of the default pool)."""

    def __enter__(self) -> ArrowPeak:
        self.parent = pa.default_memory_pool()
        self.pool = pa.proxy_memory_pool(self.parent)
        _POOLS.append(self.pool)
        pa.set_memory_pool(self.pool)
        return self

    def __exit__(self, *exc: object) -> None:
        pa.set_memory_pool(self.parent)

    @property
    def peak(self) -> int:
        return int(self.pool.max_memory())


def decode_copies(mb: float, width: int) -> dict[str, float]:
    from lance_async.feeds import Message
    from lance_async.feeds.messages import decode_json

    out: dict[str, float] = {}
    for kind in ("ndjson", "array"):
        data = payload(mb, width, kind == "array")
        gc.collect()
        tracemalloc.start()
        with ArrowPeak() as arrow:
            table = decode_json([Message(0, data)], KV_SCHEMA)
        out[f"{kind}_python"] = tracemalloc.get_traced_memory()[1] / len(data)
        tracemalloc.stop()
        out[f"{kind}_arrow"] = arrow.peak / table.nbytes
        del table
    return out


def route_copies(sharding: Any, mb: float, width: int) -> float:
    from lance_async._schema import TableFit
    from lance_async.memwal.accumulator import Item, Kind
    from lance_async.memwal.acks import Ack
    from lance_async.memwal.routing import split_run

    n = int(mb * 1e6 / (width + 16))
    run = pa.table(
        {"id": np.arange(n), "value": np.arange(n), "name": ["x" * width] * n}, schema=KV_SCHEMA
    ).to_batches(max_chunksize=max(1, n // 16))
    size: int = sum(b.nbytes for b in run)
    with ArrowPeak() as arrow:
        entry = Item(Kind.PUT, run, Ack(), n, size, 0.0)  # split_run leaves the ack alone
        cuts = split_run(sharding, TableFit(KV_SCHEMA, ["id"]), [entry])
    assert sum(c.batch.num_rows for c in cuts.cuts) == n and len(cuts.cuts) > 1
    return arrow.peak / size


async def ingest_cost(uri: str, mb: float, width: int) -> dict[str, float]:
    import lance_async as la
    from lance_async.feeds import IterableFeed, ingest

    first = pa.table({"id": [0], "value": [0], "name": [""]}, schema=KV_SCHEMA)
    ds = await la.write_dataset(first, uri)
    await ds.initialize_mem_wal()
    async with ds.mem_wal_writer() as writer:
        warm = "\n".join(json.dumps({"id": i, "value": 0, "name": "a"}) for i in range(64))
        await ingest(IterableFeed([warm.encode()]), writer)  # every shard's writer open
        box = [payload(mb, width)]
        length = len(box[0])
        gc.collect()
        reset_peak()
        start = status("VmRSS:")

        def received() -> Iterator[bytes]:
            yield box.pop()  # as a feed hands it out: only the message holds it

        stats = await ingest(IterableFeed(received()), writer)
        peak = status("VmHWM:")
    assert stats.messages == 1 and stats.rows == int(mb * 1e6 / (width + 40))
    return {
        "ingest_rss": (peak - start) / length,
        "route_arrow": route_copies(await ds.sharding(), mb, width),
    }


def main(argv: list[str]) -> None:
    mb, width = float(argv[0]), int(argv[1])
    result = anyio.run(ingest_cost, tempfile.mkdtemp() + "/t.lance", mb, width)
    result.update(decode_copies(mb, width))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
