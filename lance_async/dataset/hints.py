"""The hint a plain read gives once: rows it does not see are durable in the MemWAL.

A plain read (``scan``, ``to_table``, ``count_rows``) answers from the base
table, as pylance's does. On a MemWAL table that can be far from everything:
after an ingest, every row may sit in flushed generations or in WAL tails
until compaction, and ``to_table(filter="id = 42")`` returns nothing. A
pylance or LanceDB user has no reason to suspect that, so the first plain
read of each table in a process looks (once) at what the MemWAL holds and,
when it holds rows, says so in the log (logger ``lance_async``, WARNING),
naming the switch: ``use_lsm=True`` (LanceDB's name for the same choice), or
``ds.lsm``'s reads.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ..lsm.snapshots import discover_latest
from ..lsm.wal import read_wal_tail

__all__ = ["hint_once"]

log = logging.getLogger("lance_async")

_seen: set[str] = set()
_guard = threading.Lock()


def _key(uri: str) -> str:
    return uri if "://" in uri else os.path.realpath(uri)


def hint_once(ds: Any, uri: str, storage_options: dict[str, str] | None) -> None:
    """Log, the first time a plain read of ``uri`` runs in this process, what
    its MemWAL holds that a plain read does not see (blocking: worker thread).

    Reads the MemWAL's shard manifests and WAL tails once per table and
    process; never raises (a hint must not fail a read).
    """
    key = _key(uri)
    with _guard:
        if key in _seen:
            return
        _seen.add(key)
    try:
        _, snaps = discover_latest(ds, uri, None, False, storage_options)
        if not snaps:
            return
        generations = sum(len(s.sstables) for s in snaps)
        schema = ds.schema
        tail = sum(
            read_wal_tail(uri, s.shard_id, s.replay_after, schema, storage_options).rows.num_rows
            for s in snaps
        )
    except Exception as exc:  # a hint must not fail the read
        log.debug("lance_async: the MemWAL hint of %s failed: %r", uri, exc)
        return
    if generations or tail:
        log.warning(
            "lance_async: a plain read of %s sees the base table only; its MemWAL holds "
            "%d flushed generation(s) not compacted yet and %d row write(s) (puts and "
            "deletes) in WAL tails, durable and not in this read: pass use_lsm=True (or "
            "use ds.lsm.scan / point_lookup; lance-async scan --lsm) to read them, or "
            "compact (ds.compact_mem_wal(); lance-async compact) to move them into the base "
            "table",
            uri,
            generations,
            tail,
            extra={"table": uri},
        )
