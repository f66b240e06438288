"""The engine's handle objects, awaitable: SQL queries, blob files, fragments, deltas, branches.

Some ``LanceDataset`` calls return an object whose own methods block (a SQL
query builder that executes, a blob file that reads, a fragment that scans,
a delta that reads the changed rows, the branches that read their refs).
Each twin here wraps one of them and runs every such method on a worker
thread, as httpx's async client wraps a response whose body is read lazily:
the wrapper's methods are the pylance object's, awaited; what the pylance
object holds in memory (ids, sizes, metadata) stays a plain attribute.
``.lance`` is the wrapped object, for sync code on a worker thread.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import pyarrow as pa

from .._args import check_batch_size, check_columns, check_int
from .._engine_errors import raise_mapped
from .._filters import check_filter
from .._threads import run_sync
from ..errors import ClosedError
from ..sources.streams import AsyncBatchStream

if TYPE_CHECKING:
    from lance.blob import BlobFile
    from lance.dataset import Branches, DatasetDelta, SqlQueryBuilder
    from lance.fragment import LanceFragment

__all__ = ["AsyncBlobFile", "AsyncBranches", "AsyncDelta", "AsyncFragment", "AsyncSqlQuery"]

T = TypeVar("T")
BlobHandling = Literal["all_binary", "blobs_descriptions", "all_descriptions"]


async def _call(func: Callable[[], T]) -> T:
    """``func()`` on a worker thread, engine errors mapped."""
    try:
        return await run_sync(func)
    except (OSError, ValueError, RuntimeError) as exc:
        raise_mapped(exc)
        raise


def _scan_options(options: dict[str, Any]) -> dict[str, Any]:
    """A fragment scan's options, checked as the dataset's are (at the call)."""
    for name in ("limit", "offset"):
        if options.get(name) is not None:
            check_int(name, options[name], minimum=0)
    if options.get("batch_size") is not None:
        check_batch_size("batch_size", options["batch_size"])
    if isinstance(options.get("columns"), str):
        check_columns(options["columns"])
    if options.get("filter") is not None:
        options["filter"] = check_filter(options["filter"])
    return options


class AsyncSqlQuery:
    """A SQL query over one dataset, awaitable: the twin of pylance's
    ``SqlQueryBuilder`` and the ``SqlQuery`` it builds.

    Obtain it from :meth:`AsyncDataset.sql`. The settings return the query
    (pylance's builder methods, same names, checked at the call); the
    results are awaited (:meth:`to_batch_records`, :meth:`to_table`) or
    streamed (:meth:`to_batches`). Nothing runs until then, and each result
    runs the query again (pylance's ``build()`` then its execution, on a
    worker thread).
    """

    def __init__(self, builder: Callable[[], SqlQueryBuilder], query: str) -> None:
        self._builder = builder
        self._query = query
        self._settings: list[tuple[str, tuple[Any, ...]]] = []

    def __repr__(self) -> str:
        return f"<AsyncSqlQuery {self._query!r}>"

    def _set(self, name: str, *args: Any) -> AsyncSqlQuery:
        self._settings.append((name, args))
        return self

    def table_name(self, table_name: str) -> AsyncSqlQuery:
        """The name the query uses for the dataset (default ``dataset``)."""
        if not isinstance(table_name, str) or not table_name:
            raise TypeError("table_name must be a non-empty str")
        return self._set("table_name", table_name)

    def with_row_id(self, with_row_id: bool = True) -> AsyncSqlQuery:
        """Let the query see ``_rowid``."""
        return self._set("with_row_id", bool(with_row_id))

    def with_row_addr(self, with_row_addr: bool = True) -> AsyncSqlQuery:
        """Let the query see ``_rowaddr``."""
        return self._set("with_row_addr", bool(with_row_addr))

    def batch_size(self, batch_size: int) -> AsyncSqlQuery:
        """Rows per batch of the scan under the query (>= 1)."""
        return self._set("batch_size", check_batch_size("batch_size", batch_size))

    def batch_size_bytes(self, batch_size_bytes: int) -> AsyncSqlQuery:
        """Bytes per batch of the scan under the query (>= 1)."""
        size = check_int("batch_size_bytes", batch_size_bytes, minimum=1)
        return self._set("batch_size_bytes", size)

    def blob_handling(self, blob_handling: BlobHandling) -> AsyncSqlQuery:
        """How blob columns come back (pylance's three modes)."""
        if blob_handling not in ("all_binary", "blobs_descriptions", "all_descriptions"):
            raise ValueError(f"unknown blob_handling {blob_handling!r}")
        return self._set("blob_handling", blob_handling)

    def _build(self) -> Any:
        builder = self._builder()
        for name, args in self._settings:
            builder = getattr(builder, name)(*args)
        return builder.build()

    async def to_batch_records(self) -> list[pa.RecordBatch]:
        """Every batch of the result (``SqlQuery.to_batch_records``)."""
        result: list[pa.RecordBatch] = await _call(lambda: self._build().to_batch_records())
        return result

    async def to_table(self) -> pa.Table:
        """The result as one table."""

        def run() -> pa.Table:
            reader = self._build().to_stream_reader()
            return reader.read_all()

        result: pa.Table = await _call(run)
        return result

    def to_batches(self, *, prefetch: int = 4) -> AsyncBatchStream:
        """The result streamed (``SqlQuery.to_stream_reader`` on a prefetch
        thread; ``async for``; closed promptly on ``break`` or ``aclose()``)."""
        check_int("prefetch", prefetch, minimum=1)
        return AsyncBatchStream(lambda: self._build().to_stream_reader(), prefetch=prefetch)


class AsyncBlobFile:
    """One blob, read lazily: the twin of ``lance.BlobFile`` (a file-like object).

    Obtain it from :meth:`AsyncDataset.take_blobs`. Reads and seeks run on a
    worker thread; ``size()`` and ``tell()`` are in memory. ``async with``
    closes it. Use after close raises :class:`~lance_async.errors.ClosedError`.
    """

    def __init__(self, blob: BlobFile) -> None:
        self.lance = blob
        """The wrapped ``lance.BlobFile`` (its reads block)."""
        self._closed = False

    def __repr__(self) -> str:
        return f"<AsyncBlobFile size={self.lance.size()}{' closed' if self._closed else ''}>"

    async def __aenter__(self) -> AsyncBlobFile:
        await anyio.lowlevel.checkpoint()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _open(self) -> BlobFile:
        if self._closed:
            raise ClosedError("this blob file is closed")
        return self.lance

    @property
    def closed(self) -> bool:
        """True once closed."""
        return self._closed

    def size(self) -> int:
        """The blob's size in bytes (does not block)."""
        return int(self.lance.size())

    def tell(self) -> int:
        """The position of the next :meth:`read` (does not block)."""
        return int(self._open().tell())

    async def seek(self, offset: int, whence: int = 0) -> int:
        """Move the position (``io`` semantics); returns the new position."""
        blob = self._open()
        check_int("offset", offset, minimum=None)
        return int(await _call(lambda: blob.seek(offset, whence)))

    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes from the position (all that is left when -1)."""
        blob = self._open()
        check_int("size", size, minimum=-1)
        return bytes(await _call(lambda: blob.read(size)))

    async def readall(self) -> bytes:
        """The rest of the blob."""
        blob = self._open()
        return bytes(await _call(blob.readall))

    async def read_range(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (the position does not move)."""
        blob = self._open()
        check_int("offset", offset, minimum=0)
        check_int("length", length, minimum=0)
        return bytes(await _call(lambda: blob.read_range(offset, length)))

    async def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Each ``(offset, length)`` range, in one planned read."""
        blob = self._open()
        wanted = [
            (check_int("offset", o, minimum=0), check_int("length", n, minimum=0))
            for o, n in ranges
        ]
        return [bytes(b) for b in await _call(lambda: blob.read_ranges(wanted))]

    async def aclose(self) -> None:
        """Close the blob (idempotent)."""
        if not self._closed:
            self._closed = True
            await _call(self.lance.close)


class AsyncFragment:
    """One fragment of a dataset version: the twin of ``lance.LanceFragment``.

    Obtain it from :meth:`AsyncDataset.get_fragments` (or ``get_fragment``).
    What the manifest says (id, metadata, data files, deletion file) is in
    memory; counts and reads run on a worker thread.
    """

    def __init__(self, fragment: LanceFragment) -> None:
        self.lance = fragment
        """The wrapped ``LanceFragment`` (its reads block)."""

    def __repr__(self) -> str:
        return f"<AsyncFragment id={self.fragment_id}>"

    @property
    def fragment_id(self) -> int:
        """The fragment's id (does not block)."""
        return int(self.lance.fragment_id)

    @property
    def metadata(self) -> Any:
        """Its ``FragmentMetadata`` (does not block)."""
        return self.lance.metadata

    def data_files(self) -> builtins.list[Any]:
        """Its data files (from the manifest; does not block)."""
        return list(self.lance.data_files())

    def deletion_file(self) -> str | None:
        """Its deletion file's path, if any (from the manifest; does not block)."""
        path: str | None = self.lance.deletion_file()
        return path

    async def count_rows(self, filter: str | None = None) -> int:
        """Live rows (that pass ``filter``)."""
        checked = check_filter(filter) if filter is not None else None
        return int(await _call(lambda: self.lance.count_rows(checked)))

    async def physical_rows(self) -> int:
        """Rows written, deleted ones included (may read a file footer)."""
        return int(await _call(lambda: self.lance.physical_rows))

    async def head(self, num_rows: int) -> pa.Table:
        """The first ``num_rows`` rows."""
        n = check_int("num_rows", num_rows, minimum=0)
        result: pa.Table = await _call(lambda: self.lance.head(n))
        return result

    async def take(self, indices: Sequence[int], columns: Sequence[str] | None = None) -> pa.Table:
        """Rows at these offsets in the fragment."""
        cols = list(check_columns(columns)) if columns is not None else None
        result: pa.Table = await _call(lambda: self.lance.take(list(indices), columns=cols))
        return result

    async def to_table(self, **options: Any) -> pa.Table:
        """The fragment's rows (``LanceFragment.to_table``; the same keywords)."""
        checked = _scan_options(options)
        result: pa.Table = await _call(lambda: self.lance.to_table(**checked))
        return result

    def scan(self, *, prefetch: int = 4, **options: Any) -> AsyncBatchStream:
        """The fragment's rows streamed (``LanceFragment.scanner(...).to_reader()``)."""
        check_int("prefetch", prefetch, minimum=1)
        checked = _scan_options(options)
        fragment = self.lance
        return AsyncBatchStream(lambda: fragment.scanner(**checked).to_reader(), prefetch=prefetch)


class AsyncDelta:
    """What changed between two versions: the twin of pylance's ``DatasetDelta``.

    Obtain it from :meth:`AsyncDataset.delta`. The changed rows are streams
    (each reads on a prefetch thread); the transactions are awaited.
    """

    def __init__(self, delta: DatasetDelta) -> None:
        self.lance = delta
        """The wrapped ``DatasetDelta``."""

    def __repr__(self) -> str:
        return "<AsyncDelta>"

    async def list_transactions(self) -> builtins.list[Any]:
        """The transactions between the two versions."""
        return list(await _call(self.lance.list_transactions))

    def get_inserted_rows(self) -> AsyncBatchStream:
        """The rows inserted between the two versions, streamed."""
        return AsyncBatchStream(self.lance.get_inserted_rows)

    def get_updated_rows(self) -> AsyncBatchStream:
        """The rows updated between the two versions, streamed."""
        return AsyncBatchStream(self.lance.get_updated_rows)

    def get_deleted_row_ids(self) -> AsyncBatchStream:
        """The row ids deleted between the two versions, streamed."""
        return AsyncBatchStream(self.lance.get_deleted_row_ids)


class AsyncBranches:
    """The branches of a dataset, awaitable: the twin of ``LanceDataset.branches``.

    Obtain it from :attr:`AsyncDataset.branches`; make one with
    :meth:`AsyncDataset.create_branch`. Branches are experimental in pylance
    14 (and how one shares a MemWAL with its parent is untested).
    """

    def __init__(self, branches: Callable[[], Branches]) -> None:
        self._branches = branches

    def __repr__(self) -> str:
        return "<AsyncBranches>"

    async def list(self) -> dict[str, dict[str, Any]]:
        """Every branch: ``{name: {"parent_version": ..., ...}}``."""
        found = await _call(lambda: self._branches().list())
        return {name: dict(info) for name, info in found.items()}

    async def list_ordered(
        self, order: str | None = None
    ) -> builtins.list[tuple[str, dict[str, Any]]]:
        """Every branch as ``(name, info)``, ordered (``"asc"``/``"desc"``)."""
        if order is not None and order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', got {order!r}")
        found = await _call(lambda: self._branches().list_ordered(order))
        return [(name, dict(info)) for name, info in found]

    async def delete(self, branch: str) -> None:
        """Remove ``branch`` (its versions go with it)."""
        if not isinstance(branch, str) or not branch:
            raise TypeError("a branch is a non-empty str")
        await _call(lambda: self._branches().delete(branch))
