"""The exceptions lance_async raises.

Every error about data, state, concurrency and the engine derives from
:class:`LanceAsyncError`; each message says what to do next, and errors that
a retry can cure carry ``retryable = True``. Arguments wrong in themselves (a
shard id that is not a UUID, a negative limit, ``k=0``) raise
:class:`ValueError` or :class:`TypeError` at the call, before any I/O
(``_args.py``); an unknown kind of source raises
:class:`UnsupportedSourceError` (a TypeError), a merge_insert the chosen path
cannot run :class:`MergeShapeError` (a ValueError). :class:`InvalidInputError`
is for *data* the table refuses: rows, keys, filters, a table in a state the
call cannot use.

The tree::

    LanceAsyncError
    ├── ClosedError                 used after aclose() / after the context exited
    ├── WrongEventLoopError         a loop-bound object used from another event loop
    ├── DatasetNotFoundError        no Lance dataset at the URI
    ├── ManifestFormatError         MemWAL files on storage in a layout this version does not know
    ├── ViewExpiredError            a read's view (a snapshot, too) whose files a clean-up removed
    ├── SourceError                 something is wrong with a write source
    │   ├── UnsupportedSourceError  not a kind of object coerce_source knows (a TypeError)
    │   ├── SourceConsumedError     a one-shot (streaming) source asked to replay
    │   └── SourceChangedError      a replayable source gave different data on replay
    ├── InvalidInputError           rows the engine would reject (raised before any commit)
    │   ├── SchemaMismatchError     a schema or batch does not match (names the field)
    │   ├── DuplicateKeyError       a key repeats inside one source (names the key)
    │   ├── DecodeError             a feed message could not be decoded (names the offset)
    │   └── WrongShardError         a row sent to a shard its key does not map to
    ├── MergeShapeError             merge clauses the MemWAL cannot express (a ValueError)
    ├── ConflictError               a commit lost to a concurrent writer (.retryable)
    │   ├── ContentionError         retries exhausted (.num_attempts)
    │   └── StaleCompactionError    another compaction merged those generations first
    ├── WriterFailedError           a MemWAL shard writer broke; every pending ack fails
    │   └── FencedError             another writer claimed the shard (a newer epoch)
    ├── StorageError                the object store (or disk) failed a request
    │   ├── StoragePermissionError  refused: credentials or policy (HTTP 401/403)
    │   ├── StorageNotFoundError    the bucket (or an object the table needs) is not there
    │   ├── StorageUnavailableError throttled, 5xx, connection refused (.retryable)
    │   ├── StorageFullError        no space left on the device (or quota)
    │   └── StorageTimeoutError     no answer within storage_timeout (.retryable)
    ├── ResourceExhaustedError      the engine's memory pool ran out (size it: configure_memory)
    ├── BackpressureTimeoutError    no room in a writer's queue before the timeout
    ├── DeadLetterError             a bad message's dead-letter destination refused it
    ├── PayloadTooLargeError        a message or body passed a size limit (HTTP 413)
    └── InvalidInputError ─ FilterError   a filter outside the allowed form (HTTP 400)

The HTTP helpers' own errors (unknown table, media types, bodies,
authentication) are in :mod:`lance_async.web.errors`, under the same base.

Engine errors are mapped in one place, ``_engine_errors.map_engine_error``: by exception
type first (``lance.commit.CommitConflictError``; ``PermissionError``,
``TimeoutError``, ENOSPC...), by message text only where pylance gives
nothing else (``OSError("Invalid user input: ...")``; an object store's
refusal is a plain ``OSError`` whose text holds the HTTP status and the
store's code: ``_faults.py`` reads it). The original engine exception is
always kept as ``__cause__``. :class:`FencedError` is only ever a real fence
(a newer writer epoch), :class:`DatasetNotFoundError` only the store
answering that no table is at the path; a store that refuses, fails, fills
up or does not answer is a :class:`StorageError`, whatever called it.
"""

from __future__ import annotations

__all__ = [
    "BackpressureTimeoutError",
    "ClosedError",
    "ConflictError",
    "ContentionError",
    "DatasetNotFoundError",
    "DeadLetterError",
    "DecodeError",
    "DuplicateKeyError",
    "FencedError",
    "FilterError",
    "InvalidInputError",
    "LanceAsyncError",
    "ManifestFormatError",
    "MergeShapeError",
    "PayloadTooLargeError",
    "ResourceExhaustedError",
    "SchemaMismatchError",
    "SourceChangedError",
    "SourceConsumedError",
    "SourceError",
    "StaleCompactionError",
    "StorageError",
    "StorageFullError",
    "StorageNotFoundError",
    "StoragePermissionError",
    "StorageTimeoutError",
    "StorageUnavailableError",
    "UnsupportedSourceError",
    "ViewExpiredError",
    "WriterFailedError",
    "WrongEventLoopError",
    "WrongShardError",
]


class LanceAsyncError(Exception):
    """Base class of every error lance_async raises on purpose.

    Attributes
    ----------
    retryable : bool
        True when running the same operation again may succeed.
    may_have_landed : bool
        True when a write failed this way may still take effect: its engine
        call was abandoned at its deadline, and the engine goes on retrying
        it until the store answers. Sending the rows again is safe when the
        write is keyed (the newest row of a key wins); an insert without a
        key may then be written twice. False: no engine call of the write
        is left running.
    """

    retryable: bool = False
    may_have_landed: bool = False


class ClosedError(LanceAsyncError):
    """The object (writer, stream, router) was closed; open a new one."""


class WrongEventLoopError(LanceAsyncError):
    """A loop-bound object was used from an event loop other than the one it
    was first used in. Create one object per event loop."""


class DatasetNotFoundError(LanceAsyncError):
    """No Lance dataset exists at the given URI. Check the path, or create the
    dataset first with :func:`lance_async.write_dataset`."""


class ManifestFormatError(LanceAsyncError):
    """A MemWAL file (shard manifest, WAL entry, compaction record) did not have
    the layout this version of lance_async knows (the one pylance writes).
    The read fails rather than guess; the message names the file. Upgrade
    lance_async to match your pylance."""


class ViewExpiredError(LanceAsyncError):
    """A read's view of the table can no longer be read: a file it needs -- a
    WAL entry, a flushed generation, the base table's version -- was removed
    by a clean-up (the MemWAL's retention, ``cleanup_old_versions``) after
    the view was taken. Nothing wrong was returned: the read fails instead.

    ``retryable``: the call read again makes a fresh view (reads that open
    their own retry once by themselves); a pinned snapshot
    (:meth:`~lance_async.lsm.LsmReader.snapshot`) does not come back: take a
    new one, and hold views for less than the retention.
    """

    retryable = True


class SourceError(LanceAsyncError):
    """A write source cannot be opened or read as asked."""


class UnsupportedSourceError(SourceError, TypeError):
    """The object is no kind of write source lance_async knows. Pass a table,
    a reader, a dataset or an (async) iterator of record batches, or register
    the type with ``@lance_async.coerce_source.register``. Also a
    :class:`TypeError`."""


class SourceConsumedError(SourceError):
    """A one-shot (streaming) source was asked for a second pass.

    Wrap a reader factory with :func:`lance_async.replayable` to make the
    source replayable, or pass a materialized table.
    """


class SourceChangedError(SourceError):
    """A replayable source produced a different schema, or its files changed,
    between passes. Nothing was committed; make the factory deterministic or
    stop changing the files while they are being merged."""


class InvalidInputError(LanceAsyncError):
    """The rows are not acceptable for the target table. Raised before
    anything is committed; the writer or dataset stays usable."""


class SchemaMismatchError(InvalidInputError):
    """A schema or a batch does not match what was declared.

    Attributes
    ----------
    field : str or None
        The first field that differs, when one can be named.
    batch_index : int or None
        Index (0-based) of the offending batch within its source, when known.
    """

    def __init__(
        self, message: str, *, field: str | None = None, batch_index: int | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.batch_index = batch_index


class DuplicateKeyError(InvalidInputError):
    """A key appears more than once in one source (one merge, one send).

    Nothing was written. Deduplicate the rows, or opt in to keeping the last
    occurrence of each key: ``merge_insert(...).duplicate_keys("keep_last")``.

    Attributes
    ----------
    key : dict
        The first repeated key, ``{column: value}``.
    count : int
        How often it appears.
    """

    def __init__(self, message: str, *, key: dict[str, object], count: int) -> None:
        super().__init__(message)
        self.key = key
        self.count = count


class DecodeError(InvalidInputError):
    """A feed message could not be decoded into rows of the table's schema.

    Attributes
    ----------
    offset : object
        The message's offset or id in its feed (stream sequence, entry id, ...).
    field : str or None
        The field whose value does not fit the column, when one can be named.
    """

    def __init__(self, message: str, *, offset: object = None, field: str | None = None) -> None:
        super().__init__(message)
        self.offset = offset
        self.field = field


class MergeShapeError(LanceAsyncError, ValueError):
    """A merge_insert whose clauses the chosen path cannot run. Also a
    :class:`ValueError`: the builder's arguments are wrong in themselves.

    Raised by ``merge_insert(...).via_mem_wal()`` for what a MemWAL cannot
    express: a MemWAL put replaces a key's row without reading it, so
    clauses that depend on the row the table holds (a condition, fail on
    match, insert only if absent, update only if present, delete rows the
    source lacks) have no MemWAL form. Nothing was read or written. Drop
    the clause, or leave out ``via_mem_wal()`` to commit to the base table.

    Attributes
    ----------
    clause : str or None
        The builder step that cannot run (``"when_matched_update_all"``, ...).
    """

    def __init__(self, message: str, *, clause: str | None = None) -> None:
        super().__init__(message)
        self.clause = clause


class ConflictError(LanceAsyncError):
    """A commit conflicted with a concurrent writer.

    ``retryable`` says whether running the operation again on the latest
    version can succeed; lance_async's merge_insert already retries those.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class ContentionError(ConflictError):
    """Every attempt lost to concurrent writers; retries are exhausted.

    Attributes
    ----------
    num_attempts : int
        How many attempts ran (first try plus retries).
    """

    def __init__(self, message: str, *, num_attempts: int) -> None:
        super().__init__(message, retryable=True)
        self.num_attempts = num_attempts


class StaleCompactionError(ConflictError):
    """A MemWAL compaction lost the race: another compaction (in any process)
    already merged generations at least as new into the base table.

    Nothing of the losing compaction was committed (the engine refuses the
    commit that would mark older generations compacted, and the deletes and
    upserts travel in that same commit). Not retryable as such: read the
    shard snapshots again and compact what is still uncompacted
    (:meth:`~lance_async.AsyncDataset.compact_mem_wal` does this itself).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class WriterFailedError(LanceAsyncError):
    """A MemWAL shard writer hit an error it cannot recover from. Every pending
    and later ack fails with this error. Close the writer and open a new one
    on the same shard: the WAL replays every row that was acknowledged.

    A writer failed by its store (refused, unreachable, full, no answer
    within ``storage_timeout``) fails its acks with the
    :class:`StorageError` that says which instead; the writer is failed all
    the same (``state`` is ``FAILED``) and the same advice holds.
    """


class FencedError(WriterFailedError):
    """Another writer claimed this writer's shard: a newer writer epoch fenced it.

    The MemWAL's second rule (one shard, one writer) at work: the newer
    writer replayed this shard's WAL, so every row acknowledged before the
    fence is safe, and nothing this writer puts after it is visible. Every
    pending and later ack fails with this error, and a feed must stop
    committing offsets for what this writer held. Close the writer; do not
    reopen the shard unless you own it again (a worker that lost its
    partitions leaves them to their new owner).

    Attributes
    ----------
    shard_id : str or None
        The fenced shard.
    """

    def __init__(self, message: str, *, shard_id: str | None = None) -> None:
        super().__init__(message)
        self.shard_id = shard_id


class StorageError(LanceAsyncError):
    """The object store (or the local disk) failed a request: opening a table,
    a merge, a read, a MemWAL put, flush or close, a compaction. A MemWAL
    writer that meets one is failed (state ``FAILED``; every pending and
    later ack fails with this error): rows acknowledged before are safe in
    the WAL; close it and open a new writer once the store is back. This
    class itself is a failure none of the subclasses names.

    Attributes
    ----------
    retryable : bool
        True when the same call may succeed later unchanged.
    status : int or None
        The HTTP status the store answered, when there was one.
    code : str or None
        The store's error code (``"AccessDenied"``, ``"NoSuchBucket"``, ...).
    """

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class StoragePermissionError(StorageError):
    """The store refused the request (HTTP 401 / 403, a local "permission
    denied"). A retry does not help: fix the credentials (``storage_options``
    or the ``AWS_*`` / ``GOOGLE_*`` / ``AZURE_*`` variables) or the policy."""


class StorageNotFoundError(StorageError):
    """The bucket (``what == "bucket"``), or an object the table needs
    (``"object"``), is not in the store. A missing *table* is
    :class:`DatasetNotFoundError` instead."""

    what: str = "object"


class StorageUnavailableError(StorageError):
    """The store is throttling (429, 503 ``SlowDown``), failing (5xx) or
    refusing connections, after the engine's own retries. Retry later."""

    retryable = True


class StorageFullError(StorageError):
    """No space left on the device holding the table (or its quota). Free
    space; a MemWAL writer's acknowledged rows are safe (reopen to replay)."""


class StorageTimeoutError(StorageError):
    """A call that waits on the store did not return within its deadline
    (``storage_timeout`` of a writer or a dataset).

    pylance retries some requests for ever (a MemWAL put whose WAL write is
    refused, a bucket that vanished); lance_async stops waiting at the
    deadline and leaves the call's worker thread behind (logged; counted in
    ``WriterStats.abandoned_calls``). Retryable: the store may come back.

    Attributes
    ----------
    timeout : float or None
        The deadline that passed, in seconds.
    """

    retryable = True
    timeout: float | None = None


class WrongShardError(InvalidInputError):
    """A row was sent to a shard that its key does not map to.

    Every key has one shard (Lance's MemWAL spec): LSM reads and compaction
    keep the newest row per key inside a shard only. Nothing of the batch
    was queued. Send such rows through a routing writer
    (``dataset.mem_wal_writer()`` with no shard id), which puts every row
    in its own shard.

    Attributes
    ----------
    shard_id : str or None
        The shard the offending row belongs to.
    """

    def __init__(self, message: str, *, shard_id: str | None = None) -> None:
        super().__init__(message)
        self.shard_id = shard_id


class ResourceExhaustedError(LanceAsyncError):
    """The engine ran out of its memory pool (or spill space) for one operation.

    Nothing was committed. Give the engine a larger pool with
    :func:`lance_async.configure_memory` (``pool_bytes=``; or the
    ``LANCE_MEM_POOL_SIZE`` environment variable, in bytes), or make the
    operation smaller: merge the rows in several smaller sources, or join
    without the key's scalar index (``merge_insert(...).use_index(False)``).

    Attributes
    ----------
    pool_bytes : int or None
        The pool size in force (None: the engine's default).
    """

    def __init__(self, message: str, *, pool_bytes: int | None) -> None:
        super().__init__(message)
        self.pool_bytes = pool_bytes


class DeadLetterError(LanceAsyncError):
    """A bad message could not be set aside: its dead-letter destination (a
    file, a Redis stream, a JetStream subject, a Kafka topic) refused it or
    did not answer. The message stays unacknowledged (it comes again); the
    ingest stops. ``retryable`` when the destination was unreachable or
    timed out; not when it refused this message (too large for the
    destination, say): then set it aside elsewhere, or remove it from the
    feed by hand.

    Attributes
    ----------
    destination : str
        Where the dead letter was going.
    offset : object
        The bad message's offset.
    """

    def __init__(
        self, message: str, *, destination: str, offset: object, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.destination = destination
        self.offset = offset
        self.retryable = retryable


class BackpressureTimeoutError(LanceAsyncError):
    """The writer's queue stayed full for longer than the given timeout.
    Nothing was queued; retry later or raise the queue limits."""

    retryable = True


# -- limits and filters: raised by the lower layers and by the HTTP helpers ------


class PayloadTooLargeError(LanceAsyncError):
    """A request body passed one of its limits; nothing was written.

    Attributes
    ----------
    limit : str
        Which limit: ``"max_body_bytes"``, ``"max_batch_rows"``,
        ``"max_batch_bytes"``, ``"max_ingest_rows"`` or ``"max_ingest_bytes"``.
    maximum : int
        The limit's value (bytes or rows).
    actual : int or None
        What was seen (or announced), when known.
    """

    def __init__(self, message: str, *, limit: str, maximum: int, actual: int | None) -> None:
        super().__init__(message)
        self.limit = limit
        self.maximum = maximum
        self.actual = actual


class FilterError(InvalidInputError):
    """A row filter is not in the allowed form (HTTP 400).

    The allowed form is ``column <op> literal`` with ``op`` one of ``=``,
    ``!=``, ``<``, ``<=``, ``>``, ``>=``; several filters are joined with AND.
    Raw Lance SQL is accepted only when the app enables it.

    Attributes
    ----------
    filter : str or None
        The offending filter (at most 200 characters of it).
    """

    def __init__(self, message: str, *, filter: str | None = None) -> None:
        super().__init__(message)
        self.filter = filter[:200] if filter is not None else None


#: Errors of the HTTP helpers, moved to :mod:`lance_async.web.errors`.
_MOVED_TO_WEB = frozenset(
    {
        "BodyConsumedError",
        "BodyTimeoutError",
        "ClientDisconnectedError",
        "EmptyBodyError",
        "NoShardWriterError",
        "NotAcceptableError",
        "ServerBusyError",
        "UnknownTableError",
        "UnsupportedMediaTypeError",
    }
)


def __getattr__(name: str) -> object:
    if name in _MOVED_TO_WEB:
        raise AttributeError(
            f"lance_async.errors.{name} moved to lance_async.web.errors (also exported by "
            f"lance_async.web and lance_async.fastapi): from lance_async.fastapi import {name}"
        )
    raise AttributeError(f"module 'lance_async.errors' has no attribute {name!r}")
