"""The write-source contract: :class:`SourceMode`, :class:`WriteSource`, :class:`ReaderPlan`.

A :class:`WriteSource` is a schema, a :class:`SourceMode` and a way to make a
fresh pass over the rows on every call -- as an async iterator for the loop
(:meth:`WriteSource.open`) or as a blocking ``pa.RecordBatchReader`` for a
worker thread (:meth:`WriteSource.open_reader`). The concrete kinds live in
``kinds.py`` and ``replay.py``; ``registry.py`` picks one for any object.

Every pass is checked batch by batch against the declared schema
(:func:`checked`, :func:`achecked`); a mismatch on a later pass of a
replayable source is a :class:`~lance_async.errors.SourceChangedError`.
So is a later pass with other values: every pass of a REPLAYABLE source that
an engine call drains (:meth:`WriteSource.reader_plan`) is summarised as it
streams (row count and a hash of its values, :class:`~.digest.PassDigest`)
and compared with the first complete pass; the difference is raised before
the engine sees the end of the pass, so nothing of it is committed.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pyarrow as pa

from .._loop import aclose_shielded
from .._schema import conform_batch
from .._threads import run_sync, stream_limiter
from ..errors import SchemaMismatchError, SourceChangedError, SourceConsumedError, SourceError
from .digest import PassDigest
from .streams import AsyncBatchStream, bridge_reader

__all__ = [
    "DEFAULT_BRIDGE_BATCHES",
    "DEFAULT_BRIDGE_BYTES",
    "ReaderPlan",
    "SourceMode",
    "WriteSource",
    "achecked",
    "checked",
]

DEFAULT_BRIDGE_BATCHES = 4
DEFAULT_BRIDGE_BYTES = 64 * 1024 * 1024


class SourceMode(str, enum.Enum):
    """How a source can be read, and so how a conflict retry can re-read it."""

    MATERIALIZED = "materialized"
    """All rows are in memory already (tables, batches, frames)."""
    REPLAYABLE = "replayable"
    """A factory gives a fresh, identical pass on every call."""
    STREAMING = "streaming"
    """One pass only (readers, generators, async iterators)."""


# ---------------------------------------------------------------------------
# batch checking helpers
# ---------------------------------------------------------------------------


def _check_pass(
    batch: pa.RecordBatch, schema: pa.Schema, index: int, pass_no: int
) -> pa.RecordBatch:
    """Check one batch of pass ``pass_no``; a mismatch on a replay is a changed source."""
    try:
        return conform_batch(batch, schema, index)
    except SchemaMismatchError as exc:
        if pass_no > 1:
            raise SourceChangedError(
                f"pass {pass_no} of a replayable source differs from pass 1: {exc}"
            ) from exc
        raise


def checked(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    pass_no: int,
    sink: Callable[[BaseException], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Check each batch; record any error in ``sink`` before raising it.

    The sink matters when Rust drains the reader: it turns Python exceptions
    into text, so callers raise the recorded exception instead.
    """
    try:
        for i, batch in enumerate(batches):
            yield _check_pass(batch, schema, i, pass_no)
    except GeneratorExit:
        raise
    except BaseException as exc:
        if sink is not None:
            sink(exc)
        raise


async def achecked(
    batches: AsyncIterable[pa.RecordBatch], schema: pa.Schema, pass_no: int
) -> AsyncIterator[pa.RecordBatch]:
    i = 0
    iterator = batches.__aiter__()
    try:
        async for batch in iterator:
            yield _check_pass(batch, schema, i, pass_no)
            i += 1
    finally:
        await aclose_shielded(iterator)


# ---------------------------------------------------------------------------
# WriteSource
# ---------------------------------------------------------------------------


class ReaderPlan:
    """A reader to be made on a worker thread, plus where a producer error went.

    Returned by :meth:`WriteSource.reader_plan`. ``make()`` is blocking and
    must be called on the thread that drains the reader; ``error`` holds the
    exception an async producer raised (engines that turn errors into text
    lose it -- raise this one instead).
    """

    def __init__(
        self,
        make: Callable[[], pa.RecordBatchReader],
        error: Callable[[], Any],
        rows: tuple[list[pa.RecordBatch], pa.Schema] | None = None,
    ) -> None:
        self.make = make
        self._error = error
        self._rows = rows

    def data(self) -> pa.Table | pa.RecordBatchReader:
        """What to hand an engine call (blocking; on its worker thread): the
        rows as one table for in-memory sources -- Lance's in-memory path --
        or a fresh reader from :meth:`make`."""
        if self._rows is not None:
            batches, schema = self._rows
            return pa.Table.from_batches(batches, schema=schema)
        return self.make()

    @property
    def error(self) -> BaseException | None:
        """The producer's exception, if it raised one."""
        err = self._error()
        return err if isinstance(err, BaseException) else None

    def reraise(self, exc: BaseException) -> None:
        """Raise the source's own error in place of ``exc``, the engine's
        text-only version of it. Does nothing for a cancellation (let it
        propagate) or when the source did not fail."""
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            return
        err = self.error
        if err is not None and err is not exc:
            raise err


class WriteSource:
    """A source of rows with a schema, a mode and a fresh pass per call.

    Parameters
    ----------
    schema : pa.Schema or None
        The rows' schema (metadata included). ``None`` only for iterators
        whose schema is learned from their first batch and files given
        without ``schema=`` (read from the file); see :meth:`resolve_schema`.
    mode : SourceMode
    num_rows : int, optional
        Rows per pass when known without reading (in-memory rows); None
        otherwise.

    Notes
    -----
    Subclass it (or use :func:`replayable`) to teach lance_async a new kind
    of source; register a converter with ``coerce_source.register``.
    """

    #: True when :meth:`open_reader` reads without a loop round-trip per batch.
    native: bool = True

    def __init__(
        self, schema: pa.Schema | None, mode: SourceMode, num_rows: int | None = None
    ) -> None:
        self._schema = schema
        self.mode = mode
        self.num_rows = num_rows
        self.passes = 0
        """How many passes were opened so far (each retry of a replay adds one)."""
        self._pass_errors: dict[int, BaseException] = {}
        self.verify_replays = mode is SourceMode.REPLAYABLE
        """Compare every pass an engine drains with the first complete one
        (rows and a digest of the values; True for REPLAYABLE sources). Set
        it False only for a source whose passes cannot differ."""
        self._reference: tuple[int, tuple[int, tuple[tuple[str, str], ...]]] | None = None

    def __repr__(self) -> str:
        schema = self._schema.names if self._schema is not None else "?"
        return f"<{type(self).__name__} mode={self.mode.value} columns={schema}>"

    # -- schema -----------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        """The rows' schema.

        Raises
        ------
        SourceError
            For an iterator given without ``schema=`` whose first batch has not
            been seen yet; ``await source.resolve_schema()`` first.
        """
        if self._schema is None:
            raise SourceError(
                f"the schema of {self!r} is not known yet: pass schema=..., "
                "or await source.resolve_schema()"
            )
        return self._schema

    async def resolve_schema(self) -> pa.Schema:
        """Learn the schema (peeking the first batch of an iterator if needed).

        Returns
        -------
        pa.Schema

        Raises
        ------
        SourceError
            An empty iterator given without ``schema=``.
        """
        return self.schema

    @property
    def replayable(self) -> bool:
        """True unless the source is STREAMING (one pass only)."""
        return self.mode is not SourceMode.STREAMING

    def _sink(self, pass_no: int) -> Callable[[BaseException], None]:
        def record(exc: BaseException) -> None:
            self._pass_errors.setdefault(pass_no, exc)

        return record

    def _verified(
        self, batches: Iterable[pa.RecordBatch], pass_no: int
    ) -> Iterator[pa.RecordBatch]:
        """``batches`` of pass ``pass_no``, digested as they stream and compared
        with the first complete pass (blocking; on the thread that drains them).

        Raises :class:`SourceChangedError` -- after the batch that passes the
        first pass's row count, or instead of the end of a pass whose digest
        differs -- so an engine reading the pass aborts without committing.
        """
        digest = PassDigest()
        reference = self._reference
        try:
            for batch in batches:
                digest.update(batch)
                if reference is not None and digest.rows > reference[1][0]:
                    raise SourceChangedError(
                        f"pass {pass_no} of {self!r} holds more rows than pass {reference[0]} "
                        f"({reference[1][0]:,}); a replayable source must give the same rows "
                        "on every pass; nothing was committed"
                    )
                yield batch
            result = digest.result()
            if reference is None:
                self._reference = (pass_no, result)
            elif result != reference[1]:
                what = "fewer rows" if result[0] < reference[1][0] else "other values or order"
                raise SourceChangedError(
                    f"pass {pass_no} of {self!r} gave {what} than pass {reference[0]} "
                    f"({result[0]:,} rows against {reference[1][0]:,}); a replayable source "
                    "must give the same values in the same order on every pass; nothing was "
                    "committed"
                )
        except GeneratorExit:
            raise
        except BaseException as exc:
            self._sink(pass_no)(exc)
            raise

    def _verified_reader(self, reader: pa.RecordBatchReader, pass_no: int) -> pa.RecordBatchReader:
        if not self.verify_replays:
            return reader
        return pa.RecordBatchReader.from_batches(reader.schema, self._verified(reader, pass_no))

    def _begin_pass(self) -> int:
        if self.mode is SourceMode.STREAMING and self.passes >= 1:
            raise SourceConsumedError(
                f"{self!r} is a one-shot stream and was already read; wrap a reader "
                "factory with lance_async.replayable(...) to allow replays"
            )
        self.passes += 1
        return self.passes

    # -- passes -----------------------------------------------------------
    def open(self) -> AsyncIterator[pa.RecordBatch]:
        """Start a fresh pass as an async iterator of batches (for the loop).

        Each batch is checked against :attr:`schema`. Close the iterator
        (``aclose``) if you stop early.

        Raises
        ------
        SourceConsumedError
            A STREAMING source asked for a second pass.
        """
        pass_no = self._begin_pass()
        return self._open(pass_no)

    def open_reader(self) -> pa.RecordBatchReader:
        """Start a fresh pass as a blocking ``pa.RecordBatchReader``.

        Blocking: call it on a worker thread (``lance_async`` does). Native
        sources (Lance, Arrow datasets, tables, sync factories, files) read
        without any event-loop round-trip. Sources whose rows are produced on
        the loop (async iterators and async factories) cannot be read this way:
        use ``async with source.reader() as reader`` instead.

        Raises
        ------
        SourceConsumedError
            A STREAMING source asked for a second pass.
        SourceError
            The source is not native (``source.native is False``).
        """
        if not self.native:
            raise SourceError(
                f"{self!r} produces its rows on the event loop; use "
                "`async with source.reader() as reader:` to get a blocking reader"
            )
        pass_no = self._begin_pass()
        return self._open_reader(pass_no)

    def batches(self) -> list[pa.RecordBatch] | None:
        """The rows in memory, for MATERIALIZED sources (None otherwise)."""
        return None

    def _open(self, pass_no: int) -> AsyncIterator[pa.RecordBatch]:
        return AsyncBatchStream(lambda: self._open_reader(pass_no), schema=self._schema)

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:  # pragma: no cover
        raise NotImplementedError

    @asynccontextmanager
    async def reader_plan(
        self, *, max_batches: int = DEFAULT_BRIDGE_BATCHES, max_bytes: int | None = None
    ) -> AsyncIterator[ReaderPlan]:
        """Prepare one pass for an engine call on a worker thread.

        Native sources make their reader on that thread (``plan.make()``);
        others are bridged from the loop with a bounded buffer. Used by every
        engine call in lance_async.

        Yields
        ------
        ReaderPlan
        """
        if self.native:
            pass_no = self._begin_pass()

            def make() -> pa.RecordBatchReader:
                try:
                    return self._verified_reader(self._open_reader(pass_no), pass_no)
                except BaseException as exc:
                    self._sink(pass_no)(exc)
                    raise

            batches = self.batches()
            rows = (batches, self.schema) if batches is not None else None
            try:
                yield ReaderPlan(make, lambda: self._pass_errors.get(pass_no), rows)
            finally:
                self._pass_errors.pop(pass_no, None)
            return
        schema = await self.resolve_schema()
        iterator = self.open()
        pass_no = self.passes
        async with bridge_reader(
            iterator,
            schema,
            max_batches=max_batches,
            max_bytes=max_bytes or DEFAULT_BRIDGE_BYTES,
            check=False,
        ) as bridged:
            try:
                yield ReaderPlan(
                    lambda: self._verified_reader(bridged.reader, pass_no),
                    lambda: self._pass_errors.get(pass_no) or bridged.error,
                )
            finally:
                self._pass_errors.pop(pass_no, None)

    @asynccontextmanager
    async def reader(
        self, *, max_batches: int = DEFAULT_BRIDGE_BATCHES, max_bytes: int | None = None
    ) -> AsyncIterator[pa.RecordBatchReader]:
        """A fresh pass as a blocking reader, for any source.

        Drain the reader on a worker thread (``anyio.to_thread.run_sync``)
        inside the ``async with`` block. Native sources' readers are opened on
        a worker thread; loop-produced rows are bridged with a bounded buffer
        (``max_batches``, ``max_bytes``).

        Yields
        ------
        pa.RecordBatchReader
        """
        async with self.reader_plan(max_batches=max_batches, max_bytes=max_bytes) as plan:
            if self.native:
                reader = await run_sync(plan.make, limiter=stream_limiter())
            else:
                reader = plan.make()
            try:
                yield reader
            finally:
                reader.close()
