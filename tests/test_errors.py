"""Engine error mapping: one test per recognised engine message."""

from __future__ import annotations

from typing import Any

import lance
import pyarrow as pa
import pytest

import lance_async as la
from lance_async._engine_errors import map_engine_error


def test_tree_has_one_base() -> None:
    for name in la.errors.__all__:
        obj = getattr(la.errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, la.LanceAsyncError), name


def test_commit_conflict_error_maps_by_type() -> None:
    from lance.commit import CommitConflictError

    exc = CommitConflictError("conflict with version 7")
    exc.retryable = True
    mapped = map_engine_error(exc)
    assert isinstance(mapped, la.ConflictError)
    assert mapped.retryable


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Invalid user input: batch 0 does not match the base table schema", la.InvalidInputError),
        (
            "Invalid user input: ShardWriter is already closed, src/mem_wal.rs:270:29",
            la.ClosedError,
        ),
        (
            "Failed to read batches: Invalid argument error: Column 'id' is non-nullable",
            la.InvalidInputError,
        ),
        (
            "Too many concurrent writers. Attempted 0 retries., /home/runner/x.rs:1:1",
            la.ConflictError,
        ),
        (
            "Incompatible transaction: this Update is incompatible with an Overwrite",
            la.ConflictError,
        ),
        (
            "Dataset at path tmp/x was not found: Not found: tmp/x/_versions",
            la.DatasetNotFoundError,
        ),
        (
            "Append with different schema: fields did not match, missing=[], unexpected=[x]",
            la.SchemaMismatchError,
        ),
        ("Dataset already exists: /tmp/t.lance, /home/runner/x.rs:1:1", la.InvalidInputError),
        ("Ref not found error: tag zz does not exist", la.DatasetNotFoundError),
        ("Version not found error: version main:99 does not exist", la.DatasetNotFoundError),
        ("Ref conflict error: tag a already exists", la.InvalidInputError),
        (
            "Writer fenced (peer claimed epoch): Writer fenced (peer claimed epoch): local "
            "epoch 1 < stored epoch 2 for shard aa73adaa, /home/runner/x.rs:1:1",
            la.errors.FencedError,
        ),
        (
            "Failed to claim shard aa73adaa: another writer claimed epoch 3",
            la.ConflictError,
        ),
        (
            "Query Execution error: Execution error: Merge insert failed: found matching row "
            "with key values: id = 1, /rustc/48a229ce/library/core/src/task/poll.rs:291:44",
            la.InvalidInputError,
        ),
        (
            "Not supported: This merge insert configuration does not support explain_plan: "
            "the join takes the scalar-index execution path., /home/runner/x.rs:3451:24",
            la.MergeShapeError,
        ),
    ],
)
def test_engine_messages_map_to_typed_errors(message: str, expected: type) -> None:
    mapped = map_engine_error(OSError(message))
    assert type(mapped) is expected
    assert "/home/runner" not in str(mapped) and "/rustc/" not in str(mapped)


def test_unknown_errors_are_left_alone() -> None:
    assert map_engine_error(OSError("disk on fire")) is None
    assert map_engine_error(KeyError("x")) is None


def test_real_engine_messages_still_match(tmp_path: object) -> None:
    """Guards the message texts against a pylance upgrade."""
    with pytest.raises(ValueError) as info:
        lance.dataset(str(tmp_path) + "/missing")
    assert isinstance(map_engine_error(info.value), la.DatasetNotFoundError)
    schema = pa.schema(
        [
            pa.field(
                "id",
                pa.int64(),
                nullable=False,
                metadata={"lance-schema:unenforced-primary-key": "true"},
            )
        ]
    )
    ds = lance.write_dataset(pa.table({"id": [1]}, schema=schema), str(tmp_path) + "/t")
    ds.initialize_mem_wal()
    import uuid

    writer = ds.mem_wal_writer(str(uuid.uuid4()), durable_write=False)
    with pytest.raises(OSError) as bad:
        writer.put(pa.table({"id": pa.array([1], pa.int32())}))
    assert isinstance(map_engine_error(bad.value), la.InvalidInputError)
    writer.close()
    with pytest.raises(OSError) as closed:
        writer.put(pa.table({"id": [2]}))
    assert isinstance(map_engine_error(closed.value), la.ClosedError)


@pytest.mark.asyncio
async def test_mapped_errors_keep_the_engine_error_as_their_cause(tmp_path: object) -> None:
    uri = str(tmp_path) + "/t.lance"
    await la.write_dataset(pa.table({"id": [1]}), uri)
    with pytest.raises(la.InvalidInputError) as info:
        await la.write_dataset(pa.table({"id": [1]}), uri)
    assert isinstance(info.value.__cause__, OSError)
    assert "already exists" in str(info.value.__cause__)


# -- storage failures: one case per text the engine (or pyarrow) gives ------------------
#
# The texts are what pylance 14.0.2 and pyarrow raised against moto behind the
# fault proxy of tests/s3faults.py (and a 1 MiB tmpfs for the full disk),
# shortened only where marked "...". The Rust source locations are kept:
# the mapping must drop them.

_XML = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{}</Code><Message>m</Message></Error>'
_S3_LIST = (
    "LanceError(IO): Generic S3 error: Error performing list request: Error performing GET "
    "http://127.0.0.1:37795/be7cfb629?list-type=2&prefix=t.lance%2F_versions%2F in {}"
    " - Server returned non-2xx status code: {}: {}, "
    "/home/runner/work/lance/lance/rust/lance-io/src/object_store.rs:1576:42"
)
_WAL_FULL = (
    "Writer fenced (persistence failure): Writer fenced (persistence failure): WAL persistence "
    "failed for shard b81e23ae-a868-4b1d-bfc8-3cd480c4f4cf at position 3 after 3 retries; "
    "in-memory state may diverge from the durable WAL, reopen to replay: LanceError(IO): "
    "failed to create tmp/stx/mnt/t.lance/_mem_wal/b81e23ae-a868-4b1d-bfc8-3cd480c4f4cf/wal/"
    "1100000000000000000000000000000000000000000000000000000000000000.arrow atomically: "
    "Generic LocalFileSystem error: Unable to copy data to file: No space left on device "
    "(os error 28), /home/runner/work/lance/lance/rust/lance/src/dataset/mem_wal/wal.rs:1781:40"
)


@pytest.mark.parametrize(
    ("exc", "expected", "status", "code"),
    [
        pytest.param(
            ValueError(_S3_LIST.format("2.18ms", "403 Forbidden", _XML.format("AccessDenied"))),
            la.StoragePermissionError,
            403,
            "AccessDenied",
            id="s3-403-access-denied",
        ),
        pytest.param(
            ValueError(_S3_LIST.format("1.3ms", "404 Not Found", _XML.format("NoSuchBucket"))),
            la.StorageNotFoundError,
            404,
            "NoSuchBucket",
            id="s3-404-no-such-bucket",
        ),
        pytest.param(
            ValueError(
                _S3_LIST.format(
                    "421ms, after 3 retries, max_retries: 3, retry_timeout: 180s ",
                    "503 Service Unavailable",
                    _XML.format("SlowDown"),
                )
            ),
            la.StorageUnavailableError,
            503,
            "SlowDown",
            id="s3-503-slow-down",
        ),
        pytest.param(
            OSError(
                _S3_LIST.format(
                    "412ms, after 3 retries",
                    "500 Internal Server Error",
                    _XML.format("InternalError"),
                )
            ),
            la.StorageUnavailableError,
            500,
            "InternalError",
            id="s3-500-internal-error",
        ),
        pytest.param(
            ValueError(
                "LanceError(IO): Generic S3 error: Error performing list request: Error "
                "performing GET http://127.0.0.1:37519/bb?list-type=2&prefix=t.lance%2F_versions"
                "%2F in 471.862135ms, after 3 retries, max_retries: 3, retry_timeout: 180s  - "
                "HTTP error: error sending request, /home/runner/work/lance/lance/rust/lance-io/"
                "src/object_store.rs:1576:42"
            ),
            la.StorageUnavailableError,
            None,
            None,
            id="s3-connection-refused",
        ),
        pytest.param(
            OSError(
                "The operation lacked the necessary privileges to complete for path t.lance/"
                "_mem_wal/7fbd2839/manifest/version_hint.json: Error performing GET http://"
                "127.0.0.1:35515/b/t.lance/_mem_wal/7fbd2839/manifest/version_hint.json in "
                "766.339µs - Server returned non-2xx status code: 403 Forbidden: "
                + _XML.format("AccessDenied")
            ),
            la.StoragePermissionError,
            403,
            "AccessDenied",
            id="object-store-permission-denied-kind",
        ),
        pytest.param(
            OSError(
                "When reading information for key 'x/a.bin' in bucket 'baede8a99': AWS Error "
                "ACCESS_DENIED during HeadObject operation: No response body."
            ),
            la.StoragePermissionError,
            None,
            "ACCESS_DENIED",
            id="pyarrow-access-denied",
        ),
        pytest.param(
            OSError(
                "When listing objects under key 'x/' in bucket 'baede8a99': AWS Error "
                "INVALID_ACCESS_KEY_ID during ListObjectsV2 operation: m (Request ID: 0)"
            ),
            la.StoragePermissionError,
            None,
            "INVALID_ACCESS_KEY_ID",
            id="pyarrow-invalid-access-key",
        ),
        pytest.param(
            OSError(
                "When reading information for key 'x/a.bin' in bucket 'baede8a99': AWS Error "
                "UNKNOWN (HTTP status 503) during HeadObject operation: No response body."
            ),
            la.StorageUnavailableError,
            503,
            "UNKNOWN",
            id="pyarrow-head-503",
        ),
        pytest.param(
            OSError(
                "When listing objects under key 'x/' in bucket 'baede8a99': AWS Error SLOW_DOWN "
                "during ListObjectsV2 operation: m (Request ID: 0)"
            ),
            la.StorageUnavailableError,
            None,
            "SLOW_DOWN",
            id="pyarrow-slow-down",
        ),
        pytest.param(
            OSError(_WAL_FULL), la.StorageFullError, None, None, id="durable-put-disk-full"
        ),
        pytest.param(
            OSError(
                "LanceError(IO): No space left on device (os error 28), /home/runner/work/lance/"
                "lance/rust/lance-file/src/writer/structural.rs:254:9"
            ),
            la.StorageFullError,
            None,
            None,
            id="write-dataset-disk-full",
        ),
        pytest.param(
            OSError(
                "LanceError(IO): Generic LocalFileSystem error: Unable to copy data to file: No "
                "space left on device (os error 28), /home/runner/work/lance/lance/rust/"
                "lance-table/src/io/commit.rs:1663:50"
            ),
            la.StorageFullError,
            None,
            None,
            id="merge-insert-commit-disk-full",
        ),
        pytest.param(
            OSError("Permission denied (os error 13)"),
            la.StoragePermissionError,
            None,
            None,
            id="local-permission-denied",
        ),
        pytest.param(
            OSError("HTTP error: request or response body error: operation timed out"),
            la.StorageTimeoutError,
            None,
            None,
            id="http-timeout",
        ),
    ],
)
def test_storage_failures_map_to_the_storage_family(
    exc: BaseException, expected: type, status: int | None, code: str | None
) -> None:
    mapped = map_engine_error(exc)
    assert type(mapped) is expected
    assert isinstance(mapped, la.StorageError)
    assert (mapped.status, mapped.code) == (status, code)
    assert mapped.retryable == (expected in (la.StorageUnavailableError, la.StorageTimeoutError))
    assert "/home/runner" not in str(mapped) and "LanceError(IO)" not in str(mapped)
    assert not isinstance(mapped, (la.WriterFailedError, la.DatasetNotFoundError))


def test_the_bucket_and_an_object_are_told_apart() -> None:
    bucket = map_engine_error(
        ValueError(_S3_LIST.format("1ms", "404 Not Found", _XML.format("NoSuchBucket")))
    )
    assert isinstance(bucket, la.StorageNotFoundError) and bucket.what == "bucket"
    key = map_engine_error(
        OSError("Server returned non-2xx status code: 404 Not Found: " + _XML.format("NoSuchKey"))
    )
    assert isinstance(key, la.StorageNotFoundError) and key.what == "object"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (PermissionError(13, "Permission denied"), la.StoragePermissionError),
        (OSError(28, "No space left on device"), la.StorageFullError),
        (OSError(122, "Disk quota exceeded"), la.StorageFullError),
        (TimeoutError("timed out"), la.StorageTimeoutError),
        (ConnectionRefusedError(111, "Connection refused"), la.StorageUnavailableError),
    ],
)
def test_storage_failures_map_by_python_type_first(exc: OSError, expected: type) -> None:
    assert type(map_engine_error(exc)) is expected


@pytest.mark.parametrize(
    "message",
    [
        # the engine's text when a peer claimed the shard, put and close (durable or not)
        "Writer fenced (peer claimed epoch): Writer fenced (peer claimed epoch): local epoch 1 < "
        "stored epoch 2 for shard 41806824, /home/runner/work/lance/lance/rust/lance/src/dataset/"
        "mem_wal/manifest.rs:698:60",
        # a durable writer's close after the fence: the same, behind the engine's prefix
        "LanceError(IO): Writer fenced (peer claimed epoch): local epoch 2 < stored epoch 3 for "
        "shard 41806824, /home/runner/work/lance/lance/rust/lance/src/dataset/mem_wal/"
        "manifest.rs:698:60, /home/runner/work/lance/lance/rust/lance/src/dataset/mem_wal/"
        "write.rs:733:38",
    ],
)
def test_only_a_real_epoch_fence_is_fenced(message: str) -> None:
    mapped = map_engine_error(OSError(message))
    assert type(mapped) is la.errors.FencedError
    assert "LanceError(IO)" not in str(mapped) and "/home/runner" not in str(mapped)


def test_a_persistence_failure_is_never_a_fence() -> None:
    full = map_engine_error(OSError(_WAL_FULL))
    assert isinstance(full, la.StorageFullError)
    assert not isinstance(full, la.WriterFailedError)
    # a WAL write that failed for a reason the text does not name: a storage error
    other = map_engine_error(
        OSError(
            "LanceError(IO): Writer fenced (persistence failure): WAL persistence failed for "
            "shard b81e23ae at position 3 after 3 retries; reopen to replay: something odd"
        )
    )
    assert type(other) is la.StorageError


def test_a_missing_table_is_not_a_storage_error() -> None:
    mapped = map_engine_error(
        ValueError(
            "Dataset at path nope.lance was not found: Not found: nope.lance/_versions, "
            "/home/runner/work/lance/lance/rust/lance-table/src/io/commit.rs:653:26"
        )
    )
    assert type(mapped) is la.DatasetNotFoundError


@pytest.mark.asyncio
async def test_full_text_refusals_are_said_in_the_librarys_terms(tmp_path: Any) -> None:
    """On every read path (here a plain one): a query object naming a missing
    column is a SchemaMismatchError; a phrase query on an index built
    without positions names the setting that makes one."""
    from lance.query import MatchQuery, PhraseQuery

    ds = await la.write_dataset(pa.table({"id": [1], "text": ["brown fox"]}), tmp_path / "t")
    await ds.create_scalar_index("text", "INVERTED")
    with pytest.raises(la.SchemaMismatchError, match="nope"):
        await ds.to_table(full_text_query=MatchQuery("x", "nope"))
    with pytest.raises(la.InvalidInputError, match="with_position=True"):
        await ds.to_table(full_text_query=PhraseQuery("brown fox", "text"))
