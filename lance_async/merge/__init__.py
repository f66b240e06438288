"""Awaitable merge_insert (upsert) whose conflict retries replay the source.

:class:`AsyncMergeInsertBuilder` mirrors ``lance.MergeInsertBuilder`` of
pylance. What differs is how a commit conflict is retried, chosen by the
source's :class:`~lance_async.SourceMode`:

MATERIALIZED
    Lance's in-memory path (``execute_batches``) with Lance's own retries
    off; lance_async replays the rows from memory after a conflict, so
    ``num_attempts`` counts every engine merge. Nothing spills.
REPLAYABLE
    Lance's retries are turned off (``conflict_retries(0)``), so Lance never
    buffers or spills the input. On a retryable conflict lance_async backs off
    (a random slot, each as long as the last attempt and at least 50 ms: 0-3
    slots before the first retry, 0-7 before the second, as Lance's own
    ``SlotBackoff``; :func:`backoff_delay`), reopens the target at its latest
    version, opens a fresh pass of the source (calls the factory again) and
    tries again, up to ``conflict_retries`` retries within ``retry_timeout``.
STREAMING
    One pass. Lance's own buffered retries when ``conflict_retries > 0``;
    a conflict fails at once with ``conflict_retries(0)``.

Every attempt runs on an engine thread; the loop stays free during attempts
and during backoff.

Replay is a serial order
------------------------
Every attempt is one engine merge that commits in the same call
(``execute()``), never ``execute_uncommitted`` + ``commit``: pylance 14's
commit of an uncommitted merge loses the engine's check that the keys it
inserts are still absent, and two upserts of one new key would both commit
(``attempt.py`` says more). So each attempt either commits as if it ran
alone or fails with a conflict and is replayed against the new version;
concurrent upserts of the same new keys, in one process or many, leave one
row per key.

That holds for plain upserts (``when_matched_update_all()`` +
``when_not_matched_insert_all()``, joined on the declared primary key),
which write every key they name. Lance also rebases a merge over a
concurrent commit that touched none of the rows the merge *wrote*: an
update-only or delete merge that found a key absent, an insert-only merge
that found it present, or a conditional update that left it alone, commits
over a concurrent commit of that very key, and its outcome is that of
running *before* that commit although its version comes after (pylance
14.0.3; in one process, 8 of 8 seeded races of mixed shapes ended out of
version order). So within a process every merge other than a plain upsert
holds the table's merge lock alone from checkout to commit (plain upserts
share it; ``passes.MergeLock``), and there (version, ``group_index``) is a
serial order for every shape. The lock is held while the engine reads a
streamed source, so such a merge waits for the slow streams of upserts in
flight, and upserts arriving meanwhile wait behind it (writer preference,
or it could wait for ever): read a slow source into memory or a spool
first (the server's ``read_first`` does). Across processes only plain
upserts have that guarantee: merges of other shapes racing from several
processes may commit out of version order (3 processes x 24 mixed merges:
6 of 8 seeded runs). Run them from one process, or upsert.

Group commit
------------
Concurrent upserts of one table in one event loop (same join columns, same
plain clauses, same source columns) that arrive while one is in flight are
merged into one engine merge: one commit, rows applied in arrival order,
each caller with its own counts (``MergeResult.group_size`` and
``group_index`` place it in the serial order). ``coalesce.py`` has the
rules; :meth:`AsyncMergeInsertBuilder.coalesce` turns it off.

Tables without a declared primary key
-------------------------------------
Lance detects two concurrent merges inserting the same new key only when the
key is declared (``lance-schema:unenforced-primary-key``); otherwise both
commit, and the key is inserted twice. lance_async therefore runs every
merge into such a table one at a time per table within a process (the
merge lock above, held from the attempt's checkout to its commit), so the
later one sees the earlier one's rows and updates them. Other processes
are not protected: declare the primary key. The first inserting merge of
such a table logs a warning (logger ``lance_async``).

Cancellation
------------
Cancelling the task that awaits :meth:`AsyncMergeInsertBuilder.execute`
never leaves a thread running on its behalf: an attempt in flight ends in its
thread, then the cancellation is delivered. A streamed or replayable
source stops at its next batch, or at its end, and the engine commits
nothing: the end of the source is the commit point. An attempt whose engine
has read the whole source runs to its end; if it committed, its
:class:`MergeResult` is stored in :attr:`AsyncMergeInsertBuilder.last_result`
and logged (logger ``lance_async``, level WARNING) so the outcome is known.
Cancelled during backoff, nothing is in flight and nothing more is committed.
A sync factory or generator that blocks its thread (user code the engine is
waiting on) does not hold the cancellation up: before the commit point the
attempt is abandoned -- the cancellation is delivered at once, and the
thread, whenever the source lets it go, stops at its next batch and commits
nothing (logged; counted in ``abandoned_calls`` until it ends).
In a group commit, an upsert cancelled while its group waits is withdrawn
and commits nothing; once the group's merge has started, its rows commit
with the group (and are logged the same way) -- except the group's leader,
whose task runs the merge: cancelled before the commit (in a backoff, say)
it withdraws its rows and leaves at once, and the others form the next
group.

Through the MemWAL
------------------
``merge_insert(...).via_mem_wal()`` puts an upsert (or a delete by key) into
the table's shard writers instead of committing it; clauses that read the
target row have no MemWAL form (``via_mem_wal.py``). On a table with a MemWAL
that is the default, and ``via_base_table()`` the explicit way to the base
table (``route.py``: the one write rule).

Modules: ``builder.py`` (the builder: configuration, which path),
``attempt.py`` (one engine merge per attempt, the replay loop),
``coalesce.py`` (group commit), ``result.py`` (:class:`MergeResult`,
:func:`backoff_delay`), ``passes.py`` (checks of a pass of the source, the
insert lock), ``via_mem_wal.py`` (the MemWAL path), ``route.py`` (which path
a merge takes, and its checks).
"""

from __future__ import annotations

from .builder import AsyncMergeInsertBuilder
from .coalesce import MergeStatistics, merge_statistics
from .result import MergeResult, backoff_delay

__all__ = [
    "AsyncMergeInsertBuilder",
    "MergeResult",
    "MergeStatistics",
    "backoff_delay",
    "merge_statistics",
]
