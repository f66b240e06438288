"""Which tables a server serves: the ``<name>.lance`` directories under its root.

:func:`discover_tables` lists a local directory or an object-store prefix at
startup; :class:`Discovery` lists it again when a request names a table the
registry lacks (a table created after startup), and opens what it finds in
one long-lived task, which owns their writers' contexts (writers own task
groups); :func:`discovery_middleware` is the ASGI hook that asks it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import anyio
import pyarrow.fs as pafs

from .._storage import filesystem, join
from .._threads import run_sync, stream_limiter
from ..dataset import open_dataset
from ..errors import DatasetNotFoundError
from ..memwal.compactor import CompactionPolicy
from .registry import TableRegistry, TableSpec

__all__ = ["Discovery", "discover_tables", "discovery_middleware"]

log = logging.getLogger("lance_async.web")

_TABLE_DIR = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})\.lance")


def _list_table_dirs(
    root: str, storage_options: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """(name, uri) of every ``<name>.lance`` directory under a local or object-store root."""
    fs, base = filesystem(root, storage_options)
    selector = pafs.FileSelector(base, allow_not_found=False, recursive=False)
    local = "://" not in root
    real_root = os.path.realpath(root) if local else ""
    found = []
    for info in fs.get_file_info(selector):
        match = _TABLE_DIR.fullmatch(info.base_name)
        if match and ".." not in match.group(1) and info.type == pafs.FileType.Directory:
            uri = join(root, info.base_name)
            if local:
                # links followed: a table must stay inside the root, and is
                # opened by its real path, so a link changed later cannot
                # move it out
                real = os.path.realpath(uri)
                if real == real_root or os.path.commonpath([real, real_root]) != real_root:
                    log.warning(
                        "lance_async.serve: %s leads out of the root (to %s); not served",
                        uri,
                        real,
                        extra={"table": match.group(1)},
                    )
                    continue
                uri = real
            found.append((match.group(1), uri))
    return sorted(found)


async def discover_tables(
    root: str | os.PathLike[str],
    *,
    writer_options: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, TableSpec]:
    """Find the tables under ``root`` (``<name>.lance`` directories).

    Parameters
    ----------
    root : str or PathLike
        A local directory or an object-store prefix (``s3://bucket/tables``).
    writer_options : mapping, optional
        ``TableSpec.writer_options`` of every MemWAL table found.
    storage_options : mapping, optional
        The object-store options of the root and its tables.

    Returns
    -------
    dict of str to TableSpec
        A MemWAL table with a sharding spec gets the routing writer
        (``route=True``: every row to its own shard); one with manual shards
        gets lance_async's default shard of the table (the one ``lance-async
        ingest`` writes too, so their writes never split a key). Directories
        that do not hold a dataset are skipped (with a warning).

    Notes
    -----
    Lists the directory on a worker thread and opens each dataset with
    :func:`lance_async.open_dataset`; never blocks the loop.
    """
    options = dict(storage_options) if storage_options else None
    entries = await run_sync(
        partial(_list_table_dirs, os.fspath(root), options), limiter=stream_limiter()
    )
    specs: dict[str, TableSpec] = {}
    for name, path in entries:
        try:
            dataset = await open_dataset(path, storage_options=options)
        except DatasetNotFoundError:
            log.warning(
                "lance_async.serve: %s holds no Lance dataset; skipped", path, extra={"table": path}
            )
            continue
        if await dataset.mem_wal_index_details() is None:
            specs[name] = TableSpec(path, storage_options=options)
            continue
        sharding = await dataset.sharding()
        writing = dict(writer_options or {})
        if sharding.sharded:
            specs[name] = TableSpec(
                path,
                route=True,
                writer_options={"compaction": CompactionPolicy(), **writing},
                storage_options=options,
            )
        else:
            specs[name] = TableSpec(
                path,
                shard_id=sharding.default_shard(),
                writer_options=writing,
                storage_options=options,
            )
    return specs


class Discovery:
    """Tables created under the root after startup, found when a request asks.

    A request for a table name the registry lacks (or for ``GET /tables``)
    asks for a new listing of the root, at most once per ``interval``
    seconds; the tables found are opened by one long-lived task (the
    lifespan's), which owns their writers' contexts and closes them at
    shutdown, since writers own task groups. Requests wait for the listing
    they asked for, bounded by ``timeout``.
    """

    def __init__(
        self,
        root: str,
        registry: TableRegistry,
        writer_options: Mapping[str, Any] | None,
        storage_options: Mapping[str, str] | None,
        interval: float = 1.0,
        timeout: float = 30.0,
    ) -> None:
        self.root = root
        self.registry = registry
        self.writer_options = writer_options
        self.storage_options = storage_options
        self.interval = interval
        self.timeout = timeout
        self._wanted = anyio.Event()
        self._done = anyio.Event()
        self._last = -float("inf")

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve listings until cancelled; close what it opened (blocks)."""
        async with AsyncExitStack() as stack:
            task_status.started()
            while True:
                await self._wanted.wait()
                self._wanted = anyio.Event()
                done, self._done = self._done, anyio.Event()
                try:
                    found = await discover_tables(
                        self.root,
                        writer_options=self.writer_options,
                        storage_options=self.storage_options,
                    )
                    for name, spec in found.items():
                        if name not in self.registry.names:
                            await self.registry.add_open(name, spec, stack)
                            log.info("lance_async.serve: now serving table %s", name)
                except Exception:  # a listing that fails: the request gets its 404
                    log.exception("lance_async.serve: listing %s failed", self.root)
                finally:
                    done.set()

    async def refresh(self) -> None:
        """Ask for a listing (unless one ran within ``interval``) and wait for it."""
        now = anyio.current_time()
        if now - self._last < self.interval:
            return
        self._last = now
        done = self._done
        self._wanted.set()
        with anyio.move_on_after(self.timeout):
            await done.wait()


_TABLE_PATH = re.compile(r"^/tables/([^/]+)(?:/|$)")


def discovery_middleware(app: Any, discovery: Discovery) -> Any:
    """ASGI middleware: a request naming a table the registry lacks (or listing
    them) asks ``discovery`` for a new listing first."""

    async def middleware(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            match = _TABLE_PATH.match(path)
            if path.rstrip("/") == "/tables" or (
                match is not None and match.group(1) not in discovery.registry.names
            ):
                await discovery.refresh()
        await app(scope, receive, send)

    return middleware
