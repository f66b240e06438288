"""What the packages below ``dataset/`` need of a table: the :class:`Table` protocol.

``lsm/`` (the read side), ``memwal/`` (the writer side) and ``merge/`` take
the table they work on as an argument typed by this protocol, never by
:class:`~lance_async.AsyncDataset` (which implements it), so imports run one
way: the facade above knows the packages below, they know only this. The
seam is the one starlette's and httpx's lower modules keep: a small
structural type instead of the object above. Its two write helpers,
``_advance`` and ``_mutate``, are private names: the lower packages use them,
users of :class:`~lance_async.AsyncDataset` never need them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import pyarrow as pa
from lance.dataset import LanceDataset

__all__ = ["Table"]

T = TypeVar("T")


class Table(Protocol):
    """A Lance table as the lower packages see it (``AsyncDataset`` is one).

    Attributes are read without blocking; :meth:`_mutate` and the builder of
    :meth:`merge_insert` do their engine work on worker threads.
    """

    @property
    def uri(self) -> str:
        """The table's URI."""

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the version in hand, field metadata included."""

    @property
    def primary_key(self) -> list[str]:
        """Primary-key column names ([] when the table has none)."""

    @property
    def storage_options(self) -> dict[str, str] | None:
        """Object-store options for every file read beside the engine (a copy)."""

    @property
    def lance(self) -> LanceDataset:
        """The ``LanceDataset`` of the version in hand (use it on a worker thread)."""

    @property
    def version(self) -> int:
        """The version in hand."""

    @property
    def checked_out(self) -> bool:
        """True while the object is pinned at a version by a checkout (LSM
        reads, which show the live state, refuse it)."""

    @property
    def storage_timeout(self) -> float:
        """Seconds an engine call on this table may wait on its store (writers'
        and compaction's deadline)."""

    def _advance(self, dataset: LanceDataset) -> None:
        """Move to ``dataset``, a newer version of this table (never backwards)."""

    async def _mutate(self, action: Callable[[LanceDataset], T]) -> T:
        """Run ``action`` on a copy at the latest version, then move to what it committed."""

    def merge_insert(self, on: str | Iterable[str] | None = None) -> Any:
        """An :class:`~lance_async.AsyncMergeInsertBuilder` on this table."""
