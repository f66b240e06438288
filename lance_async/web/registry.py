"""Tables by name for an app: :class:`TableRegistry`, :func:`lance_lifespan` and the dependencies.

Tables are registered by name (never resolved as paths), opened at startup
with their MemWAL shard writers, and closed (writers flushed) at shutdown.
:func:`get_registry`, :func:`get_table`, :func:`get_dataset` and
:func:`get_writer` are FastAPI dependencies (``TableDep``, ``DatasetDep``,
``WriterDep`` are their ``Annotated`` forms); an unknown name is a 404.
"""

from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends
from starlette.requests import Request

from .._threads import ThreadLimits, configure_threads
from ..dataset import AsyncDataset, open_dataset
from ..errors import ClosedError
from ..memwal.router import ShardRouter
from ..memwal.writer import AsyncShardWriter
from .errors import NoShardWriterError, UnknownTableError

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = [
    "REGISTRY_STATE_KEY",
    "DatasetDep",
    "OpenTable",
    "RegistryState",
    "TableDep",
    "TableRegistry",
    "TableSpec",
    "WriterDep",
    "get_dataset",
    "get_registry",
    "get_table",
    "get_writer",
    "lance_lifespan",
]

log = logging.getLogger("lance_async.web")

REGISTRY_STATE_KEY = "lance_registry"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TableSpec:
    """How to open one registered table.

    Attributes
    ----------
    uri : str
        The dataset's URI or local path (chosen by the app, never by a client).
    shard_id : str, optional
        A MemWAL shard (UUID string) to open an :class:`AsyncShardWriter` on at
        startup. The table must have a MemWAL (``initialize_mem_wal``).
        Reusing the same id after a restart replays the shard's WAL.
    route : bool
        Open the routing writer (:class:`~lance_async.ShardRouter`) at
        startup instead: every row to its own shard by the table's sharding
        spec. The way to write a sharded MemWAL table from one server.
    writer_options : dict
        Keyword arguments for :meth:`AsyncDataset.mem_wal_writer`.
    storage_options : dict, optional
        Passed to :func:`lance_async.open_dataset`.
    """

    uri: str
    shard_id: str | None = None
    writer_options: Mapping[str, Any] = field(default_factory=dict)
    storage_options: Mapping[str, str] | None = None
    route: bool = False


@dataclass(frozen=True)
class OpenTable:
    """A registered table, open.

    Attributes
    ----------
    name : str
    dataset : AsyncDataset
        Shared by all requests; mutations move it to the versions they commit.
    writer : AsyncShardWriter, ShardRouter or None
        Its MemWAL writer: the routing writer (``spec.route``) or the writer
        of the shard the spec named.
    spec : TableSpec
    """

    name: str
    dataset: AsyncDataset
    writer: AsyncShardWriter | ShardRouter | None
    spec: TableSpec


class RegistryState(enum.Enum):
    """Life cycle of a :class:`TableRegistry`."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class TableRegistry:
    """Tables an app serves, by name; opened and closed as one unit.

    Parameters
    ----------
    tables : mapping of str to TableSpec, str or PathLike, optional
        Name -> spec (a bare URI is ``TableSpec(uri)``).

    Notes
    -----
    * Names match ``[A-Za-z0-9][A-Za-z0-9_.-]{0,127}`` without ``..``.
      Requests resolve names by dictionary lookup only, so no client input
      ever becomes part of a path.
    * Use it as ``async with registry:`` (or through :func:`lance_lifespan`).
      Opening opens every dataset and MemWAL writer (on the library's engine
      threads); closing flushes and closes the writers (each shields its
      flush from cancellation, bounded by its ``close_timeout``).
    * Open and close it in the same task (the lifespan task): writers own
      task groups.
    """

    def __init__(
        self, tables: Mapping[str, TableSpec | str | os.PathLike[str]] | None = None
    ) -> None:
        self._specs: dict[str, TableSpec] = {}
        self._open: dict[str, OpenTable] = {}
        self._stack: AsyncExitStack | None = None
        self._state = RegistryState.NEW
        for name, spec in (tables or {}).items():
            self.add(name, spec)

    def __repr__(self) -> str:
        return f"<TableRegistry {sorted(self._specs)} state={self._state.value}>"

    @property
    def state(self) -> RegistryState:
        """Where the registry is in its life cycle."""
        return self._state

    @property
    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._specs)

    def add(self, name: str, spec: TableSpec | str | os.PathLike[str]) -> None:
        """Register a table (before the registry is opened).

        Raises
        ------
        ValueError
            An invalid or duplicate name.
        ClosedError
            The registry was already opened.
        """
        if self._state is not RegistryState.NEW:
            raise ClosedError("tables can be added only before the registry is opened")
        if not _NAME_RE.fullmatch(name) or ".." in name:
            raise ValueError(
                f"invalid table name {name!r}: use letters, digits, '_', '-', '.' "
                "(at most 128, no '..')"
            )
        if name in self._specs:
            raise ValueError(f"table {name!r} is already registered")
        self._specs[name] = spec if isinstance(spec, TableSpec) else TableSpec(os.fspath(spec))

    async def open(self) -> TableRegistry:
        """Open every dataset and MemWAL writer.

        Returns
        -------
        TableRegistry
            ``self``.

        Raises
        ------
        DatasetNotFoundError
            A registered URI holds no dataset (what was opened is closed again).
        ClosedError
            Opened before.
        """
        if self._state is not RegistryState.NEW:
            raise ClosedError(f"{self!r} was already opened")
        stack = AsyncExitStack()
        try:
            for name, spec in self._specs.items():
                self._open[name] = await _open_table(name, spec, stack)
        except BaseException:
            self._state = RegistryState.CLOSED
            await stack.aclose()  # writers shield their own flush and close
            raise
        self._stack = stack
        self._state = RegistryState.OPEN
        return self

    async def add_open(self, name: str, spec: TableSpec, stack: AsyncExitStack) -> OpenTable:
        """Register and open a table while the registry is open (a table found
        after startup); its writer's context goes on ``stack``, which the
        caller closes in the task that entered it (writers own task groups).

        Returns
        -------
        OpenTable
            The table now served under ``name`` (the one open already when
            ``name`` is taken).

        Raises
        ------
        ClosedError
            The registry is not open.
        ValueError
            An invalid name.
        DatasetNotFoundError
            ``spec.uri`` holds no dataset (nothing registered).
        """
        if self._state is not RegistryState.OPEN:
            raise ClosedError(f"{self!r} is not open")
        if name in self._open:
            return self._open[name]
        if not _NAME_RE.fullmatch(name) or ".." in name:
            raise ValueError(f"invalid table name {name!r}")
        table = await _open_table(name, spec, stack)
        self._specs[name] = spec
        self._open[name] = table
        return table

    async def aclose(self) -> None:
        """Flush and close every writer (each flush is shielded). Safe twice.

        Raises
        ------
        WriterFailedError, BaseException
            What closing a writer raised (after all of them were closed).
        """
        if self._state is RegistryState.CLOSED:
            return
        self._state = RegistryState.CLOSED
        stack, self._stack = self._stack, None
        if stack is not None:
            # No CancelScope around this: each writer exits the task group it
            # entered at open, and shields its own flush and close.
            await stack.aclose()

    async def __aenter__(self) -> TableRegistry:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def get(self, name: str) -> OpenTable:
        """The open table registered as ``name`` (does not block).

        Raises
        ------
        UnknownTableError
            No such name.
        ClosedError
            The registry is not open.
        """
        if self._state is not RegistryState.OPEN:
            raise ClosedError(f"{self!r} is not open; use lance_lifespan(registry)")
        table = self._open.get(name)
        if table is None:
            raise UnknownTableError(name)
        return table

    def tables(self) -> list[OpenTable]:
        """Every open table, by name."""
        return [self._open[n] for n in sorted(self._open)]


async def _open_table(name: str, spec: TableSpec, stack: AsyncExitStack) -> OpenTable:
    """Open a table's dataset and, by its spec, its MemWAL writer (entered on ``stack``)."""
    storage = dict(spec.storage_options) if spec.storage_options else None
    dataset = await open_dataset(spec.uri, storage_options=storage)
    writer: AsyncShardWriter | ShardRouter | None = None
    if spec.route:
        writer = dataset.mem_wal_writer(**dict(spec.writer_options))
    elif spec.shard_id is not None:
        writer = dataset.mem_wal_writer(spec.shard_id, **dict(spec.writer_options))
    if writer is not None:
        await stack.enter_async_context(writer)
    return OpenTable(name, dataset, writer, spec)


def lance_lifespan(
    registry: TableRegistry, *, threads: ThreadLimits | None = None
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """A lifespan that opens ``registry`` at startup and closes it at shutdown.

    Parameters
    ----------
    registry : TableRegistry
    threads : ThreadLimits, optional
        Set the library's thread limits (``configure_threads``) at startup.

    Returns
    -------
    callable
        For ``FastAPI(lifespan=...)`` / ``Starlette(lifespan=...)``. It sets
        ``app.state.lance_registry``, which the dependencies read. Compose it
        with your own lifespan as ``async with lance_lifespan(registry)(app):``.
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if threads is not None:
            configure_threads(engine=threads.engine, stream=threads.stream, reader=threads.reader)
        async with registry:
            setattr(app.state, REGISTRY_STATE_KEY, registry)
            yield

    return lifespan


async def get_registry(request: Request) -> TableRegistry:
    """Dependency: the app's :class:`TableRegistry` (set by :func:`lance_lifespan`).

    Raises
    ------
    RuntimeError
        The app has no registry (no ``lifespan=lance_lifespan(registry)``).
    """
    registry = getattr(request.app.state, REGISTRY_STATE_KEY, None)
    if not isinstance(registry, TableRegistry):
        raise RuntimeError("this app has no TableRegistry: use lifespan=lance_lifespan(registry)")
    return registry


async def get_table(
    name: str, registry: Annotated[TableRegistry, Depends(get_registry)]
) -> OpenTable:
    """Dependency: the table named by the ``name`` path parameter.

    Raises
    ------
    UnknownTableError
        No such table (HTTP 404).
    """
    return registry.get(name)


async def get_dataset(table: Annotated[OpenTable, Depends(get_table)]) -> AsyncDataset:
    """Dependency: the named table's :class:`AsyncDataset`."""
    return table.dataset


async def get_writer(
    table: Annotated[OpenTable, Depends(get_table)],
) -> AsyncShardWriter | ShardRouter:
    """Dependency: the named table's MemWAL writer (the routing writer, or one
    shard's writer).

    Raises
    ------
    NoShardWriterError
        The table has none in this app (HTTP 409).
    """
    if table.writer is None:
        raise NoShardWriterError(
            f"table {table.name!r} has no MemWAL shard writer in this app; it takes no ingest"
        )
    return table.writer


TableDep = Annotated[OpenTable, Depends(get_table)]
DatasetDep = Annotated[AsyncDataset, Depends(get_dataset)]
WriterDep = Annotated[AsyncShardWriter | ShardRouter, Depends(get_writer)]
