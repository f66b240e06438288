"""Versions, tags, history and branches (``VersionsMixin``, ``AsyncTags``).

A Lance dataset is a line of versions; a tag is a name for one of them
(kept beside the versions, so tagging commits no version). Everything here
reads or writes the version files on a worker thread.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Mapping
from typing import Any, TypeVar

from lance.dataset import LanceDataset

from .._args import check_int
from ..errors import DatasetNotFoundError, InvalidInputError
from ._core import DatasetCore, engine_call
from .handles import AsyncBranches, AsyncDelta

__all__ = ["AsyncTags", "VersionsMixin"]

D = TypeVar("D", bound="VersionsMixin")


def _check_reference(reference: int | str | None) -> int | str | None:
    if reference is None or isinstance(reference, str):
        return reference
    return check_int("reference", reference, minimum=1)


def _check_tag(tag: object) -> str:
    if not isinstance(tag, str):
        raise TypeError(f"a tag is a str, got {type(tag).__name__}")
    if not tag:
        raise ValueError("a tag cannot be empty")
    return tag


class AsyncTags:
    """The tags of a dataset, awaitable: the twin of pylance's ``LanceDataset.tags``.

    Obtain it from :attr:`AsyncDataset.tags`. Every method runs the engine
    call on a worker thread. Tags name versions of the whole dataset, so
    they are the same whichever version the :class:`AsyncDataset` reads.

    Raises
    ------
    DatasetNotFoundError
        (every method) the tag or the version it should name does not exist.
    InvalidInputError
        (``create``) the tag exists already: move it with :meth:`update`.
    ValueError, TypeError
        A tag that is not a non-empty string, a version below 1 (at the call).
    """

    def __init__(self, dataset: DatasetCore) -> None:
        self._dataset = dataset

    def __repr__(self) -> str:
        return f"<AsyncTags of {self._dataset.uri!r}>"

    async def list(self) -> dict[str, dict[str, Any]]:
        """Every tag: ``{tag: {"version": int, "created_at": ..., "manifest_size": ...}}``."""
        tags = await engine_call(lambda: self._dataset.lance.tags.list())
        return {name: dict(info) for name, info in tags.items()}

    async def list_ordered(
        self, order: str | None = None
    ) -> builtins.list[tuple[str, dict[str, Any]]]:
        """Every tag as ``(tag, info)`` pairs, ordered by version (``order``:
        ``"asc"`` or ``"desc"``, pylance's default when None)."""
        if order is not None and order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', got {order!r}")
        tags = await engine_call(lambda: self._dataset.lance.tags.list_ordered(order))
        return [(name, dict(info)) for name, info in tags]

    async def get_version(self, tag: str) -> int:
        """The version ``tag`` names."""
        name = _check_tag(tag)
        return int(await engine_call(lambda: self._dataset.lance.tags.get_version(name)))

    async def create(self, tag: str, reference: int | str | None = None) -> None:
        """Name a version ``tag`` (``reference``: a version number or another
        tag; default the version the dataset object reads)."""
        name = _check_tag(tag)
        ref = _check_reference(reference)
        target = self._dataset.version if ref is None else ref
        await engine_call(lambda: self._dataset.lance.tags.create(name, target))

    async def update(self, tag: str, reference: int | str | None = None) -> None:
        """Move an existing ``tag`` to another version (default: the version
        the dataset object reads)."""
        name = _check_tag(tag)
        ref = _check_reference(reference)
        target = self._dataset.version if ref is None else ref
        await engine_call(lambda: self._dataset.lance.tags.update(name, target))

    async def delete(self, tag: str) -> None:
        """Remove ``tag`` (the version it named stays)."""
        name = _check_tag(tag)
        await engine_call(lambda: self._dataset.lance.tags.delete(name))


class VersionsMixin(DatasetCore):
    """Versions and tags of :class:`~lance_async.AsyncDataset`."""

    @property
    def tags(self) -> AsyncTags:
        """The dataset's tags, awaitable (``LanceDataset.tags``; does not block)."""
        return AsyncTags(self)

    async def latest_version(self) -> int:
        """The newest committed version (reads the version hint on a worker thread)."""
        return int(await engine_call(lambda: self._ds.latest_version))

    async def checkout(self: D, version: int | str) -> D:
        """A new ``AsyncDataset`` at ``version`` (a number or a tag);
        ``LanceDataset.checkout_version`` on a worker thread.

        The new object is :attr:`checked_out`: its plain reads read that
        version; its LSM reads, which show the live state, raise
        :class:`~lance_async.errors.InvalidInputError` (as LanceDB's do) until
        ``refresh()`` moves it to the latest version.

        Raises
        ------
        DatasetNotFoundError
            No such version or tag.
        ValueError, TypeError
            A version number below 1 (at the call).
        """
        if version is None:
            raise TypeError("checkout needs a version number or a tag")
        ref = _check_reference(version)
        assert ref is not None
        try:
            pinned = self._new(await engine_call(lambda: self._ds.checkout_version(ref)))
        except DatasetNotFoundError as exc:
            raise DatasetNotFoundError(
                f"the Lance dataset at {self.uri!r} has no version {version!r}"
            ) from exc.__cause__
        pinned._checked_out = True
        return pinned

    async def refresh(self: D) -> D:
        """Move this object to the latest version; returns ``self``
        (``LanceDataset.checkout_latest``, without changing the object under
        concurrent readers)."""

        def work() -> LanceDataset | None:
            latest = self._ds.latest_version
            return self._ds.checkout_version(latest) if latest != self._ds.version else None

        newer = await engine_call(work)
        if newer is not None:
            self._advance(newer)
        self._checked_out = False
        return self

    async def versions(self) -> list[dict[str, Any]]:
        """All versions with their timestamps and metadata (``LanceDataset.versions``)."""
        return [dict(v) for v in await engine_call(self._ds.versions)]

    async def restore(self: D) -> D:
        """Make the version this object reads the latest, in a new commit
        (``LanceDataset.restore``); returns ``self`` at that new version.

        A dataset object at the latest version restores nothing new: the
        commit still happens and holds the same rows (as in pylance).

        Raises
        ------
        ConflictError
            A concurrent commit conflicted (``retryable`` says whether to try again).
        """
        version = self.version

        def work() -> LanceDataset:
            copy = self._ds.checkout_version(version)
            copy.restore()  # type: ignore[no-untyped-call]
            return copy

        self._advance(await engine_call(work))
        return self

    async def read_transaction(self, version: int) -> Any:
        """The transaction that made ``version`` (``LanceDataset.read_transaction``:
        a ``lance.Transaction``, or None for versions written without one)."""
        number = check_int("version", version, minimum=1)
        return await engine_call(lambda: self._ds.read_transaction(number))

    async def shallow_clone(
        self: D,
        target: str | os.PathLike[str],
        reference: int | str | None = None,
        *,
        storage_options: Mapping[str, str] | None = None,
        **options: Any,
    ) -> D:
        """A new dataset at ``target`` whose versions point at this one's files
        (``LanceDataset.shallow_clone``: nothing copied); returns it.

        Parameters
        ----------
        target : str or PathLike
            Where the clone lives.
        reference : int or str, optional
            The version or tag to clone (default the version this object reads).
        storage_options : dict, optional
            The clone's object-store options (default this dataset's).
        """
        return await self._clone("shallow_clone", target, reference, storage_options, options)

    async def deep_clone(
        self: D,
        target: str | os.PathLike[str],
        reference: int | str | None = None,
        *,
        storage_options: Mapping[str, str] | None = None,
        **options: Any,
    ) -> D:
        """A new dataset at ``target`` with a copy of one version's files
        (``LanceDataset.deep_clone``); returns it. Parameters as
        :meth:`shallow_clone`."""
        return await self._clone("deep_clone", target, reference, storage_options, options)

    async def _clone(
        self: D,
        how: str,
        target: str | os.PathLike[str],
        reference: int | str | None,
        storage_options: Mapping[str, str] | None,
        options: dict[str, Any],
    ) -> D:
        ref = _check_reference(reference)
        ref = self.version if ref is None else ref
        store = dict(storage_options) if storage_options else self._storage_options
        path = os.fspath(target)
        clone = await engine_call(
            lambda: getattr(self._ds, how)(path, ref, storage_options=store, **options)
        )
        return type(self)(clone, storage_options=store, storage_timeout=self.storage_timeout)

    # -- history and branches ------------------------------------------------
    async def version_refs(self) -> list[dict[str, Any]]:
        """Lightweight references to every version of this branch
        (``LanceDataset.version_refs``: no manifest is deserialized)."""
        return [dict(v) for v in await engine_call(self._ds.version_refs)]

    async def get_transactions(self, recent_transactions: int = 10) -> list[Any]:
        """The transactions of the ``recent_transactions`` newest versions up to
        the one this object reads, newest first (``LanceDataset.get_transactions``;
        None for a version written without one)."""
        n = check_int("recent_transactions", recent_transactions, minimum=1)
        return list(await engine_call(lambda: self._ds.get_transactions(n)))

    async def delta(
        self,
        compared_against: int | None = None,
        *,
        begin_version: int | None = None,
        end_version: int | None = None,
    ) -> AsyncDelta:
        """What changed between two versions (``LanceDataset.delta``).

        Give ``compared_against`` (this object's version against an older
        one), or both ``begin_version`` (exclusive) and ``end_version``.

        Returns
        -------
        AsyncDelta
            The changed rows as streams, the transactions awaited.

        Raises
        ------
        ValueError, TypeError
            Neither form, or both; a version below 1 (at the call).
        """
        for name, value in (
            ("compared_against", compared_against),
            ("begin_version", begin_version),
            ("end_version", end_version),
        ):
            if value is not None:
                check_int(name, value, minimum=0 if name == "begin_version" else 1)
        ranged = begin_version is not None or end_version is not None
        if (compared_against is None) == (not ranged) or (
            ranged and (begin_version is None or end_version is None)
        ):
            raise ValueError("give compared_against=, or both begin_version= and end_version=")
        ds = self._ds
        found = await engine_call(
            lambda: ds.delta(compared_against, begin_version=begin_version, end_version=end_version)
        )
        return AsyncDelta(found)

    @property
    def branches(self) -> AsyncBranches:
        """The dataset's branches, awaitable (``LanceDataset.branches``; does not block)."""
        return AsyncBranches(lambda: self._ds.branches)

    async def create_branch(
        self: D,
        branch: str,
        reference: int | str | tuple[str | None, int | None] | None = None,
        *,
        storage_options: Mapping[str, str] | None = None,
    ) -> D:
        """A new branch from a version or tag (``LanceDataset.create_branch``);
        returns the branch as a dataset of its own.

        Parameters
        ----------
        branch : str
            Its name (``"main"`` is the default branch's).
        reference : int, str or (str, int), optional
            A version of this branch, a tag, or ``(branch, version)``;
            default the version this object reads.
        storage_options : dict, optional
            The branch's object-store options (default this dataset's).

        Raises
        ------
        TypeError, ValueError
            A name that is not a non-empty string, a version below 1 (at the call).
        InvalidInputError
            The branch exists already (the engine's refusal).

        Notes
        -----
        Branches are experimental in pylance 14, and how a branch shares the
        MemWAL (and lance_async's record of retired shards) is untested:
        write a branch through the base table.
        """
        if not isinstance(branch, str) or not branch:
            raise TypeError("a branch is a non-empty str")
        if isinstance(reference, tuple):
            name, number = reference
            if number is not None:
                check_int("reference version", number, minimum=1)
            ref: int | str | tuple[str | None, int | None] = (name, number)
        else:
            checked = _check_reference(reference)
            ref = self.version if checked is None else checked
        store = dict(storage_options) if storage_options else self._storage_options
        ds = self._ds

        def work() -> LanceDataset:
            if branch in ds.branches.list():
                raise InvalidInputError(f"the branch {branch!r} exists already")
            try:
                return ds.create_branch(branch, ref, storage_options=store)
            except OSError:
                # pylance 14 fails a second branch of one name with an
                # internal error ("Clone operation should not enter
                # build_manifest"): a concurrent creation won
                if branch in ds.branches.list():
                    raise InvalidInputError(f"the branch {branch!r} exists already") from None
                raise

        made = await engine_call(work)
        return type(self)(made, storage_options=store, storage_timeout=self.storage_timeout)
