"""Processes of the cross-process clean-up test: a reader, and a compactor that cleans up.

Run as ``python -m tests.memwal.gcprocs MODE URI STOP_FILE`` from the
repository root; each prints one JSON object per line, flushed, and
``{"ready": pid}`` once set up. The writer is ``tests.lsm.procs``'s.

``reader``
    LSM scans of ``id, value`` again and again until ``STOP_FILE`` exists;
    prints each scan's rows as ``{"read": [[id, value], ...]}``, or
    ``{"expired": 1}`` when a scan got ``ViewExpiredError`` (allowed: never
    wrong rows).
``maintainer``
    A :class:`~lance_async.Compactor` compacting every generation and
    cleaning up with no retention, as often as it can, until ``STOP_FILE``
    exists; prints ``{"cleaned": n, "wal_entries_removed": m}`` each time
    its count of clean-ups rises, and its stats at the end.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

import anyio

import lance_async as la
from lance_async.memwal import CompactionPolicy, Compactor


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def reader(uri: str, stop_file: str) -> None:
    ds = await la.open_dataset(uri)
    say(ready=os.getpid())
    stop = anyio.Path(stop_file)
    while not await stop.exists():
        try:
            table = await ds.lsm.scan(columns=["id", "value"]).to_table()
        except la.ViewExpiredError:
            say(expired=1)
            continue
        ids, values = table.column("id").to_pylist(), table.column("value").to_pylist()
        say(read=[[i, v] for i, v in zip(ids, values, strict=True)])


async def maintainer(uri: str, stop_file: str) -> None:
    ds = await la.open_dataset(uri)
    policy = CompactionPolicy(
        max_generations=0,
        interval=0.01,
        optimize_indices=False,
        retention=timedelta(0),
        cleanup_interval=0.01,
    )
    async with Compactor(ds, policy) as compactor:
        say(ready=os.getpid())
        stop, told = anyio.Path(stop_file), 0
        while not await stop.exists():  # another process makes it
            now = compactor.stats()
            if now.cleanups > told:
                told = now.cleanups
                say(cleaned=told, wal_entries_removed=now.wal_entries_removed)
            await anyio.sleep(0.05)
    s = compactor.stats()
    say(
        compactions=s.compactions,
        cleanups=s.cleanups,
        generations_removed=s.generations_removed,
        wal_entries_removed=s.wal_entries_removed,
        failures=s.failures + s.cleanup_failures,
    )


def main(argv: list[str]) -> None:
    mode, uri, stop_file = argv
    anyio.run({"reader": reader, "maintainer": maintainer}[mode], uri, stop_file)


if __name__ == "__main__":
    main(sys.argv[1:])
