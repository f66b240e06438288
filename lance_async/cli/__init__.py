"""The ``lance-async`` command (typer and rich; the ``demo`` extra installs them).

Commands
--------
``demo [--dir PATH]``
    The main job: the whole mission on the 2013 NYC flights (see
    :mod:`lance_async.demo`). Exit code 0 only when every check holds.
``ingest SOURCE TABLE_URI [--format F] [--shard ID]``
    Stream a file, ``-`` (stdin), ``nats://host:port/STREAM/SUBJECT`` or
    ``redis://host:port/STREAM`` into the table's MemWAL; every message is
    acknowledged once its rows are durable. A file is checked whole first
    (it is replayable), so a bad line writes nothing.
``merge SOURCE TABLE_URI --on KEY``
    Upsert a file into the table (merge_insert on a replayable source).
``scan TABLE_URI [--filter EXPR] [--columns A,B] [--format table|ndjson|ipc]``
    Stream rows to standard output.
``info TABLE_URI``
    Versions, rows, MemWAL shards and their generations.
``serve [--root DIR]``
    The example FastAPI app (``fastapi`` extra).

Errors print a clear message on standard error and exit with 2 for a bad
argument -- an unknown option value, column or join key, a filter the engine
cannot parse, a missing file, no table at the URI -- and with 1 for anything
else (bad data, conflicts, a table in the wrong state, a broker or engine
failure). "Nothing was written" is said only when it is true: a file checked
whole before the first write (``ingest``'s default), or a ``merge`` (which
commits all or nothing).

Output is encoded and written, and input decoded, on the library's worker
threads (``stream`` limiter), never on the event loop.
"""

from __future__ import annotations

import os

# The engine logs harmless lines at ERROR level on some MemWAL calls ("Index
# __lance_mem_wal has no fields"); a command's stderr is for our messages.
# It reads LANCE_LOG once, when pylance is imported: so before any import of it.
os.environ.setdefault("LANCE_LOG", "critical")

from . import demo, ingest, scan, serve, tables, worker  # noqa: F401  (they register commands)
from .common import app

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``lance-async`` command."""
    app()
