"""The ``lance-async`` command (typer and rich, in the base install).

Commands
--------
``cleanup TABLE_URI [--retention 1h] [--dry-run]``
    Remove superseded versions and the MemWAL files (WAL entries,
    compacted generations, old shard manifests) that no reader inside the
    retention needs; ``--dry-run`` lists them instead.
``create TABLE_URI (--from FILE | --schema SPEC) --key COLUMN``
    A new table from a file (or ``-``, stdin) or a schema, with its primary
    key (refused without one unless ``--no-key``).
``demo [--dir PATH]``
    The main job: the whole mission on the 2013 NYC flights (see
    :mod:`lance_async.demo`). Exit code 0 only when every check holds.
``ingest SOURCE TABLE_URI [--format F] [--shard ID]``
    Stream a file, ``-`` (stdin), ``nats://host:port/STREAM/SUBJECT`` or
    ``redis://host:port/STREAM`` into the table's MemWAL; every message is
    acknowledged once its rows are durable. A file is checked whole first
    (it is replayable), so a bad line writes nothing.
``merge SOURCE TABLE_URI [--on KEY [--allow-non-key]]``
    Upsert a file (or ``-``, stdin, copied to a temporary file first) into
    the table (merge_insert on a replayable source); ``--on`` a column that
    is not the primary key is refused unless ``--allow-non-key``.
``scan TABLE_URI [--filter EXPR] [--columns A,B] [--format table|ndjson|ipc]``
    Stream rows to standard output.
``info TABLE_URI``
    Versions, rows (base table, flushed generations, unflushed WAL, the LSM
    view), MemWAL shards and their generations.
``serve [--root DIR]``
    The example FastAPI app (``fastapi`` extra).

Errors print a clear message on standard error and exit with 2 for a bad
argument -- an unknown option value, column or join key, a filter the engine
cannot parse, a missing file, no table at the URI -- and with 1 for anything
else (bad data, conflicts, a table in the wrong state, a broker or engine
failure). "Nothing was written" is said only when it is true: a file checked
whole before the first write (``ingest``'s default), or a ``merge`` (which
commits all or nothing). Every error is one line on standard error.

Progress goes to standard error: bars with a total where one is known (a
file's bytes, a file's rows counted by its check) on a terminal, and plain
lines every few seconds when standard error is a file or a pipe.

Start-up: the command modules import only typer, rich and anyio; pylance and
pyarrow are imported by the commands that run, so ``--help`` stays fast.

Output is encoded and written, and input decoded, on the library's worker
threads (``stream`` limiter), never on the event loop.
"""

from __future__ import annotations

# A command's stderr is for our messages and the engine's real errors, not its
# warnings nor the harmless ERROR it logs on MemWAL tables (see _enginelog.py).
# pylance reads LANCE_LOG once, when it is imported: so before any import of it.
from .._enginelog import quiet_engine_log

quiet_engine_log("error")

import os
import sys

from . import (  # noqa: F401  (they register commands)
    cleanup,
    create,
    demo,
    ingest,
    scan,
    serve,
    tables,
    worker,
)
from .common import app
from .common import main as run

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``lance-async`` command (exits with the command's code).

    A command that gave up on an engine call at its ``storage_timeout``
    ends with ``os._exit`` once its output is flushed: the abandoned thread
    (stuck, or holding what it made late) would otherwise meet the
    interpreter's finalization, where pylance aborts the process (exit 134
    instead of the error's own code).
    """
    code = run()
    from .._threads import abandoned_total

    if abandoned_total():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
