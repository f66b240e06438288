"""Writes that commit to the base table (``WritesMixin``) and the shared write path.

Row writes (:meth:`~WritesMixin.insert`, :func:`write_source`), deletes,
updates, merge_insert and the commit of transactions built elsewhere
(:meth:`~WritesMixin.commit`, :meth:`~WritesMixin.commit_batch`, the twins of
pylance's ``LanceDataset.commit`` / ``commit_batch``). Each runs its engine
call on a worker thread and moves this object to the version it committed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import anyio
import lance
import pyarrow as pa
from lance.dataset import LanceDataset

from .._args import check_choice, check_int
from .._engine_errors import map_engine_error, raise_mapped
from .._filters import check_filter
from .._threads import run_sync
from ..errors import ConflictError, ContentionError
from ..merge import AsyncMergeInsertBuilder, MergeStatistics, merge_statistics
from ..sources import resolve_source
from ._core import DatasetCore

if TYPE_CHECKING:
    from .facade import AsyncDataset

__all__ = ["CommitBatchResult", "WritesMixin", "write_source"]

D = TypeVar("D", bound="WritesMixin")
T = TypeVar("T")

WRITE_MODES = ("create", "append", "overwrite")
_RETRIES_RE = re.compile(r"Attempted (\d+) retries")


async def write_source(
    source: Any,
    target: str | os.PathLike[str] | LanceDataset,
    *,
    mode: str,
    schema: pa.Schema | None,
    lance_kwargs: Mapping[str, Any],
) -> LanceDataset:
    """Stream any source into ``lance.write_dataset`` on a worker thread.

    The one write path of :func:`~lance_async.write_dataset` and
    :meth:`AsyncDataset.insert`: the source is resolved
    (:func:`~lance_async.resolve_source`), streamed through a bounded bridge
    (never materialized), and a failing source's own error is raised, since
    pylance turns it into text.

    Raises
    ------
    ValueError
        An unknown ``mode`` (at the call).
    SchemaMismatchError, InvalidInputError, BaseException
        As :func:`~lance_async.write_dataset`.
    """
    check_choice("mode", mode, WRITE_MODES)
    path = target if isinstance(target, LanceDataset) else os.fspath(target)
    src = await resolve_source(source, schema=schema)
    async with src.reader_plan() as plan:

        def work() -> LanceDataset:
            return lance.write_dataset(
                plan.data(), path, schema=src.schema, mode=mode, **lance_kwargs
            )

        try:
            written = await run_sync(work)
        except BaseException as exc:
            plan.reraise(exc)
            if isinstance(exc, (OSError, ValueError, RuntimeError)):
                raise_mapped(exc)
            raise
    await anyio.lowlevel.checkpoint()
    return written


def commit_error(exc: BaseException, what: str) -> BaseException | None:
    """The typed error of a failed commit, as merges raise them: a conflict
    Lance could not rebase is a :class:`ConflictError` (``retryable`` from
    the engine), Lance's retries running out a :class:`ContentionError`."""
    mapped = map_engine_error(exc)
    if isinstance(mapped, ConflictError) and mapped.retryable:
        match = _RETRIES_RE.search(str(exc))
        if match:
            return ContentionError(
                f"{what} lost to concurrent writers after {int(match.group(1)) + 1} attempt(s)",
                num_attempts=int(match.group(1)) + 1,
            )
        return ConflictError(
            f"{what} conflicts with a version committed since the transaction was built "
            f"({mapped}); build it again on the latest version and commit that",
            retryable=True,
        )
    return mapped


async def run_commit(work: Callable[[], T], what: str) -> T:
    """Run a blocking engine commit on a worker thread; its failure raised as
    :func:`commit_error` types it (else as it came)."""
    try:
        return await run_sync(work)
    except (OSError, ValueError, RuntimeError) as exc:
        mapped = commit_error(exc, what)
        if mapped is not None:
            raise mapped from exc
        raise


@dataclass(frozen=True)
class CommitBatchResult(Generic[D]):
    """What :meth:`AsyncDataset.commit_batch` committed.

    Attributes
    ----------
    dataset : AsyncDataset
        The dataset at the new version (the object ``commit_batch`` was called on).
    merged : lance.Transaction
        The one transaction the batch was merged into.
    """

    dataset: D
    merged: Any


class WritesMixin(DatasetCore):
    """Row writes, deletes, updates, merge_insert and commits of
    :class:`~lance_async.AsyncDataset`."""

    async def insert(
        self: D,
        data: Any,
        *,
        mode: str = "append",
        schema: pa.Schema | None = None,
        **lance_kwargs: Any,
    ) -> D:
        """Append (or, with ``mode="overwrite"``, replace) rows; returns ``self``
        at the version written (``LanceDataset.insert``).

        Parameters
        ----------
        data : anything :func:`~lance_async.coerce_source` accepts
            Streamed into the writer through a bounded bridge.
        mode : {"append", "overwrite"}
        schema : pa.Schema, optional
            The rows' schema (see :func:`~lance_async.write_dataset`).
        **lance_kwargs
            Passed to ``lance.write_dataset``; the dataset's storage options
            are passed for you.

        Raises
        ------
        ValueError
            Another ``mode`` (at the call).
        SchemaMismatchError
            The rows do not fit the table (nothing is committed).
        """
        check_choice("mode", mode, ("append", "overwrite"))
        kwargs = dict(lance_kwargs)
        if self._storage_options:
            kwargs.setdefault("storage_options", self._storage_options)
        # the dataset object itself: its session and caches are reused, as pylance's insert does
        written = await write_source(data, self._ds, mode=mode, schema=schema, lance_kwargs=kwargs)
        self._advance(written)
        return self

    async def delete(self, filter: str, **options: Any) -> Any:
        """Delete rows matching a Lance SQL ``filter``; returns pylance's DeleteResult.

        Raises
        ------
        FilterError
            ``filter`` is not one expression (pylance would ignore what
            follows the first one and delete by that).
        """
        checked = check_filter(filter)
        return await self._mutate(lambda d: d.delete(checked, **options))

    async def update(
        self, values: Mapping[str, str], where: str | None = None, **options: Any
    ) -> dict[str, Any]:
        """Set columns to SQL expressions where ``where`` holds (``LanceDataset.update``).

        Returns
        -------
        dict
            pylance's result, e.g. ``{"num_rows_updated": n}``.

        Raises
        ------
        FilterError
            ``where`` is not one expression.
        """
        checked = check_filter(where)
        return dict(await self._mutate(lambda d: d.update(dict(values), where=checked, **options)))

    async def truncate_table(self: D) -> D:
        """Delete every row, keeping the schema and indexes, in a new version
        (``LanceDataset.truncate_table``); returns ``self``."""
        await self._mutate(lambda d: d.truncate_table())
        return self

    def merge_insert(self, on: str | Iterable[str] | None = None) -> AsyncMergeInsertBuilder:
        """Start an upsert (see :class:`~lance_async.AsyncMergeInsertBuilder`;
        does not block).

        On a table with a MemWAL the upsert goes through it, as LanceDB routes
        merge_insert once a write spec is set; ``via_base_table()`` asks for
        the base table, refused while the MemWAL holds any of the source's
        keys (``lance_async/merge/route.py``). Columns the source lacks keep
        the stored values of updated rows and are null in inserted ones, on
        both paths.

        Parameters
        ----------
        on : str or list of str, optional
            Join columns; default (None or an empty list, as pylance and
            LanceDB read it) the schema's primary key.

        Raises
        ------
        ValueError
            No join column given and the schema marks no primary key.
        SchemaMismatchError
            A join column the table lacks.
        """
        return AsyncMergeInsertBuilder(cast("AsyncDataset", self), on)

    def merge_statistics(self) -> MergeStatistics:
        """Upserts of this table in the running event loop, as the group commit
        sees them: merges in flight, upserts waiting for the next group and
        their rows and bytes (does not block; see
        :meth:`AsyncMergeInsertBuilder.coalesce`).

        Returns
        -------
        MergeStatistics
        """
        return merge_statistics(self.uri)

    async def commit(
        self: D,
        operation: Any,
        *,
        read_version: int | None = None,
        max_retries: int = 20,
        detached: bool = False,
        **options: Any,
    ) -> D:
        """Commit a transaction built elsewhere (``LanceDataset.commit`` on a
        worker thread): what :meth:`AsyncMergeInsertBuilder.execute_uncommitted`
        returns, a ``lance.LanceOperation``, or fragments written by workers.

        Parameters
        ----------
        operation : lance.Transaction or lance.LanceOperation.BaseOperation
            The change to commit.
        read_version : int, optional
            The version the change was built on (a Transaction carries its own).
        max_retries : int
            Times Lance rebases the change on newer versions before giving up
            (>= 0; pylance's default 20).
        detached : bool
            Commit outside the version line (pylance's detached commits).
        **options
            Other ``LanceDataset.commit`` arguments (``commit_message``,
            ``commit_lock``, ``commit_timeout``, ...).

        Returns
        -------
        AsyncDataset
            ``self``, moved to the committed version; for a detached commit a
            new object at that version (``self`` stays where it was).

        Raises
        ------
        ConflictError
            The change conflicts with a version committed since ``read_version``
            and Lance cannot rebase it (``retryable`` True: build it again on
            the latest version; False: it can never apply), as merges raise it.
        ContentionError
            Lance's ``max_retries`` ran out against concurrent writers.
        ValueError, TypeError
            ``max_retries`` below 0 (at the call).
        """
        retries = check_int("max_retries", max_retries, minimum=0)
        if read_version is not None:
            check_int("read_version", read_version, minimum=0)
        base = self._ds

        def work() -> LanceDataset:
            return LanceDataset.commit(
                base,
                operation,
                read_version=read_version,
                max_retries=retries,
                detached=detached,
                **options,
            )

        committed = await run_commit(work, f"the commit to {self.uri}")
        if detached:
            return self._new(committed)
        self._advance(committed)
        return self

    async def commit_batch(
        self: D, transactions: Sequence[Any], *, max_retries: int = 20, **options: Any
    ) -> CommitBatchResult[D]:
        """Commit several transactions as one version (``LanceDataset.commit_batch``;
        pylance takes only append transactions here).

        Returns
        -------
        CommitBatchResult
            ``dataset`` is ``self``, moved to the new version; ``merged`` the
            merged transaction.

        Raises
        ------
        ConflictError, ContentionError
            As :meth:`commit`.
        ValueError, TypeError
            No transaction, one that is not an append (pylance commits
            only appends in a batch), ``max_retries`` below 0 (at the call).
        """
        txns = list(transactions)
        if not txns:
            raise ValueError("commit_batch needs at least one transaction")
        for txn in txns:
            if not isinstance(txn, lance.Transaction):
                raise TypeError(f"commit_batch takes lance.Transaction objects, got {txn!r}")
            if not isinstance(txn.operation, lance.LanceOperation.Append):
                kind = type(txn.operation).__name__
                raise ValueError(
                    f"pylance commits only append transactions in a batch, got {kind}; "
                    "commit it on its own with commit()"
                )
        retries = check_int("max_retries", max_retries, minimum=0)
        base = self._ds

        def work() -> dict[str, Any]:
            return dict(LanceDataset.commit_batch(base, txns, max_retries=retries, **options))

        result = await run_commit(work, f"the batch commit to {self.uri}")
        self._advance(result["dataset"])
        return CommitBatchResult(self, result["merged"])
