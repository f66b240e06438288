"""Engine exceptions mapped to lance_async's: :func:`map_engine_error`, :func:`raise_mapped`.

The one place where what pylance (or a pyarrow filesystem) raised becomes
the typed error of :mod:`lance_async.errors`: by exception type first
(``lance.commit.CommitConflictError``; ``PermissionError``, ``TimeoutError``,
ENOSPC...), by message text only where pylance gives nothing else, each form
covered by a test. Does no I/O.
"""

from __future__ import annotations

from ._faults import storage_fault, strip_engine_prefix
from .errors import (
    ClosedError,
    ConflictError,
    DatasetNotFoundError,
    FencedError,
    InvalidInputError,
    LanceAsyncError,
    MergeShapeError,
    ResourceExhaustedError,
    SchemaMismatchError,
    StaleCompactionError,
    StorageError,
    StorageFullError,
    StorageNotFoundError,
    StoragePermissionError,
    StorageTimeoutError,
    StorageUnavailableError,
)

__all__ = ["map_engine_error", "raise_mapped"]


def _message(exc: BaseException) -> str:
    """The engine's message without the Rust source location it ends with."""
    text = str(exc)
    for location in (", /home/runner", ", /rustc/", ", src/"):
        text = text.split(location, 1)[0]
    return text


#: The error of each kind of storage failure (``_faults.Fault.kind``).
_STORAGE: dict[str, type[StorageError]] = {
    "permission": StoragePermissionError,
    "bucket": StorageNotFoundError,
    "object": StorageNotFoundError,
    "unavailable": StorageUnavailableError,
    "full": StorageFullError,
    "timeout": StorageTimeoutError,
}


def _storage_error(exc: BaseException, text: str, message: str) -> StorageError | None:
    """The typed storage error ``exc`` is (see ``_faults``), or None."""
    fault = storage_fault(exc, text)
    if fault is None:
        return None
    error = _STORAGE[fault.kind](fault.describe(message), status=fault.status, code=fault.code)
    if isinstance(error, StorageNotFoundError):
        error.what = fault.kind
    return error


def map_engine_error(exc: BaseException) -> LanceAsyncError | None:
    """Translate a pylance exception into the lance_async error it means.

    Parameters
    ----------
    exc : BaseException
        An exception raised by a pylance call (or by a pyarrow filesystem
        call on the table's files).

    Returns
    -------
    LanceAsyncError or None
        The typed error to raise (``raise mapped from exc``), or None when the
        exception has no lance_async meaning and should propagate unchanged.

    Notes
    -----
    By type first: ``lance.commit.CommitConflictError`` becomes
    :class:`ConflictError` with its ``retryable`` flag. pylance raises
    plain ``OSError`` / ``ValueError`` for the rest, so the text is read
    (without the engine's ``LanceError(IO): `` prefixes), each form covered
    by a test:

    * A store's refusal or failure, by the exception's type and errno first
      (see ``_faults.storage_fault``): a :class:`StorageError` subclass.
    * "Writer fenced (persistence failure)": the WAL could not be written;
      the storage error that says why (:class:`StorageFullError` for "No
      space left on device"), else a plain :class:`StorageError`. Any other
      "Writer fenced" is a real fence: :class:`FencedError`.
    * "Failed to claim shard" (a lost race to open a shard; retryable),
      "Invalid user input" (bad rows, but also "ShardWriter is already
      closed"), "Failed to read batches" (a batch whose own schema says
      non-nullable holds nulls), "Too many concurrent writers" (retries
      exhausted inside Lance; retryable), "Incompatible transaction" (a
      concurrent overwrite or similar; not retryable), "Dataset at path ...
      was not found" (the store answered: no table there), "Append with
      different schema" (a :class:`SchemaMismatchError`), "Dataset already
      exists" (mode="create" over a dataset), "Resources exhausted" (a
      :class:`ResourceExhaustedError` that says how to size the pool), "Ref
      not found" / "Version not found" (a tag or version that does not
      exist: :class:`DatasetNotFoundError`), "Ref conflict" (a tag that
      exists already: :class:`InvalidInputError`), "Merge insert failed:
      found matching row" (``when_matched_fail()`` met a stored key:
      :class:`InvalidInputError`), "does not support explain_plan" (a merge
      plan the engine cannot explain: :class:`MergeShapeError`), "FTS field
      path ... does not exist" (a full-text query naming a missing column:
      :class:`SchemaMismatchError`), "position is not found but required for
      phrase" (a phrase query on an index without positions:
      :class:`InvalidInputError` naming ``with_position=True``).
    """
    from lance.commit import CommitConflictError as _LanceConflict

    if isinstance(exc, LanceAsyncError):
        return exc
    if isinstance(exc, _LanceConflict):
        return ConflictError(
            f"commit conflict: {_message(exc)}", retryable=bool(getattr(exc, "retryable", False))
        )
    if not isinstance(exc, (OSError, ValueError, RuntimeError)):
        return None
    text = strip_engine_prefix(str(exc))
    message = strip_engine_prefix(_message(exc))
    if text.startswith("Writer fenced (persistence failure)"):
        cause = _storage_error(exc, text, message)
        if cause is not None:
            return cause
        return StorageError(
            f"the shard writer could not write its WAL: {message}. Rows acknowledged before "
            "are safe; open a new writer on the shard (it replays the WAL)"
        )
    if text.startswith("Writer fenced"):
        return FencedError(
            f"the shard writer was fenced: another writer claimed the shard ({message})"
        )
    storage = _storage_error(exc, text, message)
    if storage is not None:
        return storage
    if "Failed to claim shard" in text:
        return ConflictError(
            f"another writer claimed the shard at the same moment: {message}", retryable=True
        )
    if "ShardWriter is already closed" in text:
        return ClosedError("the MemWAL shard writer is closed; open a new one")
    if "Stale SSTable compaction" in text:
        return StaleCompactionError(
            f"another compaction already merged these generations: {_message(exc)}"
        )
    if "FTS field path '" in text and "' does not exist" in text:
        name = text.split("FTS field path '", 1)[1].split("' does not exist", 1)[0]
        return SchemaMismatchError(
            f"no column {name!r} in the table (a full-text query names it)", field=name
        )
    if "position is not found but required for phrase" in text:
        return InvalidInputError(
            "a phrase query needs an INVERTED index with positions: create it with "
            "await ds.create_scalar_index(column, 'INVERTED', with_position=True) "
            "(drop_index the one without first)"
        )
    if text.startswith("Invalid user input"):
        return InvalidInputError(f"the engine rejected the input: {message}")
    if text.startswith("Failed to read batches"):
        return InvalidInputError(f"the engine could not read the batches: {message}")
    if text.startswith("Append with different schema"):
        return SchemaMismatchError(
            f"the rows do not fit the dataset they are appended to: {message}"
        )
    if text.startswith("Dataset already exists"):
        return InvalidInputError(
            f"{message}; write with mode='append' or mode='overwrite', or to another path"
        )
    if text.startswith("Resources exhausted"):
        from ._memory import memory_limits

        pool = memory_limits().pool_bytes
        where = f"{pool:,} bytes" if pool is not None else "the engine's default"
        return ResourceExhaustedError(
            f"the engine's memory pool ({where}) ran out: {message.splitlines()[0]}; "
            "nothing was committed. Raise it with lance_async.configure_memory(pool_bytes=...) "
            "(or LANCE_MEM_POOL_SIZE, in bytes), or write in smaller pieces "
            "(for a merge: smaller sources, or use_index(False))",
            pool_bytes=pool,
        )
    if "Too many concurrent writers" in text:
        return ConflictError(f"commit conflict: {message}", retryable=True)
    if text.startswith("Incompatible transaction"):
        return ConflictError(f"commit conflict no retry can cure: {message}", retryable=False)
    if text.startswith(("Ref not found", "Version not found")):
        return DatasetNotFoundError(f"{message}; list them with versions() or tags.list()")
    if "Merge insert failed: found matching row" in text:
        found = message.split("found matching row", 1)[1].removeprefix(" with").strip(" :,")
        return InvalidInputError(
            f"the source holds a key the table has ({found}) and the merge says "
            "when_matched_fail(); nothing was committed"
        )
    if "does not support explain_plan" in text:
        return MergeShapeError(
            f"the engine cannot explain this merge's plan: {message}; with a scalar index on "
            "the join key, use_index(False) explains the hash join instead",
            clause="use_index",
        )
    if text.startswith("Ref conflict"):
        return InvalidInputError(f"{message}; move an existing tag with tags.update()")
    if "was not found" in text and ("Dataset at path" in text or "Not found" in text):
        where = text.split("Dataset at path ", 1)[-1].split(" was not found", 1)[0]
        return DatasetNotFoundError(
            f"no Lance dataset at {where!r}; check the path or create it with write_dataset"
        )
    return None


def raise_mapped(exc: BaseException) -> None:
    """Raise the typed error ``exc`` means (``from exc``); return when it has none.

    Call it in an ``except`` block and re-raise after it:
    ``except OSError as exc: raise_mapped(exc); raise``.
    """
    mapped = map_engine_error(exc)
    if mapped is not None and mapped is not exc:
        raise mapped from exc
