"""The engine's log filter: pylance's own log lines, minus one that is not an error.

pylance 14 writes its Rust log lines (``env_logger``) to standard error,
filtered by the ``LANCE_LOG`` environment variable, which it reads once, when
it is imported. On a table with a MemWAL, a filtered scan makes the engine
log ``ERROR lance::index] Index __lance_mem_wal has no fields`` for the
MemWAL's system index (it indexes no column): harmless, and alarming.

:func:`quiet_engine_log` sets ``LANCE_LOG`` (only when the user has not, and
only before pylance is imported) to a filter that drops the log lines of the
one module that writes it -- ``lance::index`` itself -- while every other
module's warnings and errors, ``lance::index::*`` included, still show:
env_logger picks the longest directive whose name starts the log's target,
so ``lance::index=off`` mutes that module and ``lance::index::=<level>`` gives
its sub-modules back.
"""

from __future__ import annotations

import os
import sys

__all__ = ["engine_log_filter", "quiet_engine_log"]


def engine_log_filter(level: str = "warn") -> str:
    """The ``LANCE_LOG`` value: ``level`` everywhere but the one spurious module."""
    return f"{level},lance::index=off,lance::index::={level}"


def quiet_engine_log(level: str = "warn") -> bool:
    """Set ``LANCE_LOG`` to :func:`engine_log_filter` unless it is set or pylance loaded.

    Does not block. Returns True when it set the variable (child processes
    inherit it, as they would the user's).
    """
    if "LANCE_LOG" in os.environ or "lance" in sys.modules:
        return False
    os.environ["LANCE_LOG"] = engine_log_filter(level)
    return True
