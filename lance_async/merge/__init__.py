"""Awaitable merge_insert (upsert) whose conflict retries replay the source.

:class:`AsyncMergeInsertBuilder` mirrors ``lance.MergeInsertBuilder`` of
pylance. What differs is how a commit conflict is retried, chosen by the
source's :class:`~lance_async.SourceMode`:

MATERIALIZED
    Lance's in-memory path (``execute_batches``) with Lance's own retries;
    the rows are in memory already, nothing spills.
REPLAYABLE
    Lance's retries are turned off (``conflict_retries(0)``), so Lance never
    buffers or spills the input. On a retryable conflict lance_async backs off
    (about 50, 100, 200, 400 ms ... with jitter; from the third retry on, at
    least half the last attempt's time), reopens the target at its latest
    version, opens a fresh pass of the source (calls the factory again) and
    tries again, up to ``conflict_retries`` retries within ``retry_timeout``.
STREAMING
    One pass. Lance's own buffered retries when ``conflict_retries > 0``;
    a conflict fails at once with ``conflict_retries(0)``.

Every attempt runs on an engine thread; the loop stays free during attempts
and during backoff.

Tables without a declared primary key
-------------------------------------
Lance detects two concurrent merges inserting the same new key only when the
key is declared (``lance-schema:unenforced-primary-key``); otherwise both
commit, and the key is inserted twice. lance_async therefore runs merges that
can insert into such a table one at a time per table within a process (a
lock held from the attempt's checkout to its commit), so the later one sees
the earlier one's rows and updates them. Other processes are not protected:
declare the primary key. The first such merge of a table logs a warning
(logger ``lance_async``).

Cancellation
------------
Cancelling the task that awaits :meth:`AsyncMergeInsertBuilder.execute`
never leaves a thread running on its behalf: an attempt in flight ends in its
thread (a replayable source stops at its next batch and commits nothing;
other sources' merges run to their end), then the cancellation is
delivered. If that attempt committed, its :class:`MergeResult` is stored in
:attr:`AsyncMergeInsertBuilder.last_result` and logged (logger ``lance_async``,
level WARNING) so the outcome is known.
Cancelled during backoff, nothing is in flight and nothing more is committed.

A replayable source's attempt runs the merge uncommitted and then commits
it (compaction's merges, which mark SSTables compacted, in one call: the
uncommitted merge of pylance drops the mark): cancelled before the commit,
the source stops at its next batch and nothing is committed.

Through the MemWAL
------------------
``merge_insert(...).via_mem_wal()`` puts an upsert (or a delete by key) into
the table's shard writers instead of committing it; clauses that read the
target row have no MemWAL form (``mem_wal.py``). On a table with a MemWAL
that is the default, and ``via_base_table()`` the explicit way to the base
table (``route.py``: the one write rule).

Modules: ``builder.py`` (the builder and its retry loop), ``result.py``
(:class:`MergeResult`, :func:`backoff_delay`), ``passes.py`` (checks of a
pass of the source, the insert lock), ``mem_wal.py`` (the MemWAL path),
``route.py`` (which path a merge takes, and its checks).
"""

from __future__ import annotations

from .builder import AsyncMergeInsertBuilder
from .result import MergeResult, backoff_delay

__all__ = ["AsyncMergeInsertBuilder", "MergeResult", "backoff_delay"]
