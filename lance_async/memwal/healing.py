"""Shards that heal: a failed shard's writer opened again, with care (the routing writer's).

A shard writer failed by its store (a 403, a 503, a store that did not
answer within ``storage_timeout``, any failure but a fence) stays failed:
its acks, and those of the rows queued behind it, fail with that error.
The :class:`~lance_async.ShardRouter` does not: the next run with rows for
that shard closes the failed writer and opens a new one, which claims the
next writer epoch -- fencing the failed writer's engine call if it is still
running, so it can write nothing after the new writer's first entry (the
engine's fence sentinel) -- and replays the WAL, so every row acknowledged
before is there, once. It does so with care (:class:`ShardWriters`, the
router's writers; the bookkeeping of abandoned calls is ``abandoned.py``'s):

* first a probe of the store (one listing, at most a quarter of
  ``storage_timeout``: ``probe_timeout``): a store still failing fails the
  run's rows for that shard at once with the probe's error, without an
  open the store would leave hanging (a 403 store leaves an open hanging:
  the engine retries it);
* never while an earlier open of the shard, abandoned at its deadline, is
  still running (``late_opens``): it may still claim the shard once the
  store answers and would fence the new writer (one did, in testing, a
  second after the store came back). The rows fail at once; the next run
  tries again;
* an abandoned open that returns is kept for the router while it is open
  (``take_late_open``): the next run takes it instead of opening the shard
  again, so a store slower than ``storage_timeout`` for an open (a dozen
  requests; a put is one) still makes progress;
* attempts after a failed one wait a back-off (:data:`REOPEN_BACKOFF`
  doubling, at most a quarter of ``storage_timeout`` and
  :data:`MAX_REOPEN_BACKOFF`), so a burst of sends to a failing store
  makes a few probes, not one each.

So a service writing through the router needs no reopen of its own: the
first send after the store is back is acknowledged. A fenced shard is not
reopened (another writer owns it; taking it back would fence that one).
The idea is a connection pool's: a health check before a broken connection
is replaced, and a back-off between attempts (HikariCP, redis-py's
``Retry``), with the MemWAL's epochs doing what a pool's generation counter
does.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from .._engine_errors import map_engine_error
from .._retry import exponential
from .._threads import run_sync
from ..errors import FencedError, LanceAsyncError, StorageError, StorageTimeoutError
from .abandoned import PROBE_SHARE, late_opens, probe_timeout, take_late_open
from .stats import WriterState
from .writer import AsyncShardWriter

if TYPE_CHECKING:
    from .engine import OpenedEngine

__all__ = ["MAX_REOPEN_BACKOFF", "REOPEN_BACKOFF", "Healing", "ShardWriters"]

log = logging.getLogger("lance_async.memwal")

REOPEN_BACKOFF = 0.05
"""Seconds before a failed shard's second reopen attempt (doubled for each
attempt that fails in a row, up to :data:`MAX_REOPEN_BACKOFF`)."""
MAX_REOPEN_BACKOFF = 1.0
"""The longest wait between two reopen attempts of a shard (never more than
a quarter of ``storage_timeout``: a send waits it, then the probe)."""


# -- the router's shard writers -------------------------------------------------------------


@dataclass
class Healing:
    """A shard whose writer failed, or whose open failed: when to try again."""

    failures: int = 0
    """Attempts that failed in a row."""
    next_try: float = 0.0
    """When the next attempt may start (anyio's clock)."""
    reopen: bool = False
    """A writer of the shard was open and failed (not a first open that failed)."""


class ShardWriters:
    """A routing writer's shard writers: one per shard, opened lazily and side
    by side, opened again after a failure (see the module notes).

    Parameters
    ----------
    dataset : Table
        The table.
    options : mapping
        Every writer's options (:class:`~lance_async.AsyncShardWriter`'s).
    storage_timeout : float
        The writers' ``storage_timeout`` (seconds): the probe gets a quarter
        of it, a back-off at most a quarter.
    describe : callable
        The router's repr, for the log.
    keeps_late_opens : callable
        Whether an abandoned open that returns is kept (the router is open;
        called on the open's worker thread).
    prepare : callable
        Called with each new writer before it opens (the router feeds it:
        :meth:`AsyncShardWriter.routed`).

    Attributes
    ----------
    writers : dict of str to AsyncShardWriter
        The open writers by shard id (the router reads the same dict).
    reopens : int
        Shard writers opened again after theirs failed.
    """

    def __init__(
        self,
        dataset: Any,
        options: Mapping[str, Any],
        storage_timeout: float,
        *,
        describe: Callable[[], str],
        keeps_late_opens: Callable[[], bool],
        prepare: Callable[[AsyncShardWriter], None],
    ) -> None:
        self._dataset = dataset
        self._options = dict(options)
        self.storage_timeout = storage_timeout
        self._describe = describe
        self._keeps_late_opens = keeps_late_opens
        self._prepare = prepare
        self.writers: dict[str, AsyncShardWriter] = {}
        self._locks: dict[str, anyio.Lock] = {}  # one per shard being opened
        self._healing: dict[str, Healing] = {}
        self.reopens = 0

    def usable(self, shard_id: str) -> bool:
        """Whether the shard's writer takes rows as it is: open, or failed by
        a fence (whose acks must keep saying so; it is never reopened)."""
        writer = self.writers.get(shard_id)
        if writer is None:
            return False
        if writer.state is not WriterState.FAILED:
            return True
        return isinstance(writer.failure, FencedError)

    async def open(self, shard_id: str, task_group: TaskGroup) -> AsyncShardWriter:
        """The shard's writer: as it is when usable, else opened (again) now,
        its task in ``task_group``.

        Raises
        ------
        InvalidInputError, StorageError
            As :meth:`AsyncShardWriter.open`; a store that still fails (the
            probe's error); an earlier open of the shard still running.
        """
        if self.usable(shard_id):
            return self.writers[shard_id]
        lock = self._locks.get(shard_id)
        if lock is None:  # shards open side by side; each one once
            lock = self._locks[shard_id] = anyio.Lock()
        async with lock:
            if self.usable(shard_id):
                return self.writers[shard_id]
            failed = self.writers.get(shard_id)
            healing = self._healing.get(shard_id)
            if healing is None and failed is not None:  # failed since its open
                healing = self._healing[shard_id] = Healing(reopen=True)
            opened = None
            if healing is not None:
                # an open abandoned at its deadline that returned since: its claim
                # is as good as a new one, and the store answered it
                opened = self._adoptable(shard_id)
                if opened is None:
                    await self._before_reopen(shard_id, healing)
                if failed is not None:
                    await self._retire(shard_id, failed)
            fresh = AsyncShardWriter(self._dataset, shard_id, **self._options)
            fresh.adopt(opened, self._keeps_late_opens)
            self._prepare(fresh)
            try:
                await fresh.open(task_group)
            except Exception:
                self._failed_attempt(shard_id)
                raise
            self.writers[shard_id] = fresh
            self._opened(shard_id)
        return fresh

    async def open_many(
        self, shard_ids: Iterable[str], task_group: TaskGroup
    ) -> dict[str, Exception]:
        """Open the writers of these shards not usable, side by side.

        Opening claims a shard and replays its WAL tail: storage round
        trips, so one after another a fresh router's first run (or
        ``recover()``) waited for their sum. Four shards behind 20 ms of
        latency per request (moto behind ``tests/s3faults.py``'s slow proxy):
        a fresh router's first 100-row put took 1.71-1.75 s with the shards
        opened one after another, 0.58-0.63 s side by side. Returns the
        error of each shard that could not be opened (``Exception``s only;
        cancellation propagates). Blocks only the calling task.
        """
        missing = sorted({s for s in shard_ids if not self.usable(s)})
        failed: dict[str, Exception] = {}

        async def open_one(shard_id: str) -> None:
            try:
                await self.open(shard_id, task_group)
            except Exception as exc:  # the shard's rows fail with it, the others go on
                failed[shard_id] = exc

        if missing:
            async with anyio.create_task_group() as tg:
                for shard_id in missing:
                    tg.start_soon(open_one, shard_id)
        return failed

    # -- healing ----------------------------------------------------------------------

    def _failed_attempt(self, shard_id: str) -> None:
        """Count a failed open (or probe) and set when the next may start."""
        healing = self._healing.setdefault(shard_id, Healing())
        healing.failures += 1
        cap = min(MAX_REOPEN_BACKOFF, self.storage_timeout * PROBE_SHARE)
        wait = exponential(healing.failures, REOPEN_BACKOFF, cap)
        healing.next_try = anyio.current_time() + wait

    def _opened(self, shard_id: str) -> None:
        healing = self._healing.pop(shard_id, None)
        if healing is not None and healing.reopen:
            self.reopens += 1
            log.warning(
                "lance_async: %s reopened shard %s after its writer failed (attempt %d)",
                self._describe(),
                shard_id,
                healing.failures + 1,
            )

    def _adoptable(self, shard_id: str) -> OpenedEngine | None:
        """A late open of the shard to use instead of opening it, if one
        returned and none is still running."""
        uri = str(self._dataset.lance.uri)
        return None if late_opens(uri, shard_id) else take_late_open(uri, shard_id)

    async def _retire(self, shard_id: str, failed: AsyncShardWriter) -> None:
        """Close a failed writer before its shard is opened again (its acks
        said why it failed; an abandoned engine call it holds is left)."""
        with anyio.CancelScope(shield=True):
            try:
                await failed.aclose()
            except Exception as exc:
                log.debug("lance_async: closing the failed writer of %s: %r", shard_id, exc)

    async def _before_reopen(self, shard_id: str, healing: Healing) -> None:
        """Wait out the back-off; refuse while an open of the shard is still
        running; probe the store.

        Raises
        ------
        StorageError
            The store still fails (the probe's error, said to be the
            probe's), or an earlier open of the shard has not returned.
        """
        wait = healing.next_try - anyio.current_time()
        if wait > 0:
            await anyio.sleep(wait)
        lance = self._dataset.lance
        if late_opens(str(lance.uri), shard_id):
            self._failed_attempt(shard_id)
            raise StorageTimeoutError(
                f"shard {shard_id} cannot be opened again yet: an earlier open of it was "
                "abandoned at its deadline and has not returned (the store has not answered "
                "it); it is tried again with the next rows for the shard"
            )
        try:
            await run_sync(
                lambda: lance.tags.list(),
                timeout=probe_timeout(self.storage_timeout),
                what=f"a probe of the store before reopening shard {shard_id}",
            )
        except (OSError, ValueError, RuntimeError, StorageTimeoutError) as exc:
            self._failed_attempt(shard_id)
            mapped = exc if isinstance(exc, StorageError) else map_engine_error(exc)
            if not isinstance(mapped, LanceAsyncError):
                raise
            found = copy.copy(mapped)
            found.args = (
                f"shard {shard_id} is not reopened yet: the store still fails ({mapped}); it "
                "is tried again with the next rows for the shard",
            )
            raise found from exc

    async def drop_kept(self) -> None:
        """Close the late opens kept and never taken (on worker threads,
        within ``storage_timeout`` each): the router closes."""
        uri = str(self._dataset.lance.uri)
        kept = [e for s in list(self._healing) if (e := take_late_open(uri, s)) is not None]
        for opened in kept:
            try:
                await run_sync(
                    opened.engine.close,
                    timeout=self.storage_timeout,
                    what="closing a late-opened shard writer nobody took",
                )
            except Exception as exc:  # nobody writes through it; the next writer fences it
                log.debug("lance_async: %r", exc)
