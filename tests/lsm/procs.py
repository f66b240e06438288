"""Processes the cross-process LSM tests start: a writer and a compactor.

Run as ``python -m tests.lsm.procs MODE ...`` from the repository root. Each
prints one JSON object per line on standard output, flushed, so the test can
follow it; ``{"ready": ...}`` once set up.

``writer URI SEED OPS [--memtable-rows N] [--pace S] [--then hang|close]``
    Routes ``OPS`` random upserts and deletes of ids 0..299 through the
    table's routing writer, one at a time; prints ``{"i", "op", "ids",
    "value"}`` after each is acknowledged as durable, then ``{"done": OPS}``,
    then hangs (to be killed) or closes.
``compactor URI STOP_FILE``
    Compacts the MemWAL again and again until ``STOP_FILE`` exists; prints
    each pass's outcome (generations merged, shards it lost the race for).
``read URI SNAPSHOT_FILE``
    Reads the table through the pickled :class:`~lance_async.lsm.LsmSnapshot`
    in ``SNAPSHOT_FILE`` (taken by another process): prints ``{"scan": {id:
    value}, "lookups": {id: value}}``, or ``{"error": name}`` when the read
    raised a lance_async error.
``search URI QUERIES_JSON``
    Runs each ``[query, filter]`` of the JSON list through
    ``ds.lsm.full_text_search`` of a table it opens: prints ``{"ids": [...]}``
    per query, in order.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import sys
from typing import Any

import anyio
import pyarrow as pa

import lance_async as la
from tests.helpers import KV_SCHEMA


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def ops(seed: int, n: int) -> list[tuple[str, list[int], int]]:
    """The writer's operations: (op, ids, value), the same for a seed."""
    rng = random.Random(seed)
    out: list[tuple[str, list[int], int]] = []
    for i in range(n):
        ids = sorted(rng.sample(range(300), rng.randint(1, 12)))
        out.append(("delete" if rng.random() < 0.2 else "put", ids, i))
    return out


async def writer(uri: str, seed: int, n: int, memtable_rows: int, pace: float, then: str) -> None:
    ds = await la.open_dataset(uri)
    options: dict[str, Any] = {"max_memtable_rows": memtable_rows} if memtable_rows else {}
    async with ds.mem_wal_writer(**options) as w:
        say(ready=os.getpid())
        for i, (op, ids, value) in enumerate(ops(seed, n)):
            if op == "put":
                names = [f"v{value}"] * len(ids)
                rows = pa.table({"id": ids, "value": [value] * len(ids), "name": names})
                await w.put(rows.cast(KV_SCHEMA))
            else:
                await w.delete(pa.table({"id": pa.array(ids, pa.int64())}))
            say(i=i, op=op, ids=ids, value=value)
            if pace:
                await anyio.sleep(pace)
        say(done=n)
        if then == "hang":
            await anyio.sleep_forever()


async def compactor(uri: str, stop_file: str) -> None:
    ds = await la.open_dataset(uri)
    say(ready=os.getpid())
    passes = 0
    stop = anyio.Path(stop_file)
    while not await stop.exists():
        result = await ds.compact_mem_wal(optimize_indices=False)
        passes += 1
        if result.generations or result.stale:
            say(generations=result.generations, stale=result.stale)
        await anyio.sleep(0.005)
    say(passes=passes)


async def read(uri: str, snapshot_file: str) -> None:
    snapshot = pickle.loads(await anyio.Path(snapshot_file).read_bytes())
    ds = await la.open_dataset(uri)
    try:
        scan = await ds.lsm.scan(columns=["id", "value"], snapshot=snapshot).to_table()
        found = await ds.lsm.point_lookups(list(range(300)), ["id", "value"], snapshot=snapshot)
    except la.LanceAsyncError as exc:
        say(error=type(exc).__name__)
        return
    say(
        scan=dict(zip(scan["id"].to_pylist(), scan["value"].to_pylist(), strict=True)),
        lookups=dict(zip(found["id"].to_pylist(), found["value"].to_pylist(), strict=True)),
    )


async def search(uri: str, queries: str) -> None:
    ds = await la.open_dataset(uri)
    for query, filter in json.loads(queries):
        got = await ds.lsm.full_text_search(query, columns=["id"], limit=None, filter=filter)
        say(ids=got["id"].to_pylist())


def main(argv: list[str]) -> None:
    mode, uri = argv[0], argv[1]
    if mode == "writer":
        opts = {"--memtable-rows": "0", "--pace": "0", "--then": "hang"}
        rest = argv[4:]
        for flag, value in zip(rest[::2], rest[1::2], strict=True):
            opts[flag] = value
        anyio.run(
            writer,
            uri,
            int(argv[2]),
            int(argv[3]),
            int(opts["--memtable-rows"]),
            float(opts["--pace"]),
            opts["--then"],
        )
    elif mode == "compactor":
        anyio.run(compactor, uri, argv[2])
    elif mode == "read":
        anyio.run(read, uri, argv[2])
    elif mode == "search":
        anyio.run(search, uri, argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
