"""Engine error mapping: one test per recognised engine message."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.errors import map_engine_error


def test_tree_has_one_base() -> None:
    for name in la.errors.__all__:
        obj = getattr(la.errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, la.LanceAsyncError), name


def test_commit_conflict_error_maps_by_type() -> None:
    from lance.commit import CommitConflictError

    exc = CommitConflictError("conflict with version 7")
    exc.retryable = True  # type: ignore[attr-defined]
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
    ],
)
def test_engine_messages_map_to_typed_errors(message: str, expected: type) -> None:
    mapped = map_engine_error(OSError(message))
    assert type(mapped) is expected
    assert "/home/runner" not in str(mapped)


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


@pytest.mark.anyio
async def test_mapped_errors_keep_the_engine_error_as_their_cause(tmp_path: object) -> None:
    uri = str(tmp_path) + "/t.lance"
    await la.write_dataset(pa.table({"id": [1]}), uri)
    with pytest.raises(la.InvalidInputError) as info:
        await la.write_dataset(pa.table({"id": [1]}), uri)
    assert isinstance(info.value.__cause__, OSError)
    assert "already exists" in str(info.value.__cause__)
