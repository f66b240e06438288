"""The whole stack on an S3-compatible server (moto), with ``storage_options`` only.

Every ``AWS_*`` variable is removed for these tests (see ``tests/services.py``):
a path that fell back to default credentials or the public endpoint fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_async as la

from .helpers import PK, CompetingSource
from .services import S3Bucket

DIM = 4
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("value", pa.int64()),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
    ]
)


COMPETITOR = """
import json, sys
import lance, pyarrow as pa
uri, options = sys.argv[1], json.loads(sys.argv[2])
ds = lance.dataset(uri, storage_options=options)
table = ds.to_table(filter="id IN (2, 3)")
table = table.set_column(1, "value", pa.array([7] * table.num_rows, pa.int64()))
ds.merge_insert("id").when_matched_update_all().execute(table)
"""


def compete_in_another_process(uri: str, options: dict[str, str]) -> None:
    """A competing upsert, committed by another process (blocking)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    subprocess.run(
        [sys.executable, "-c", COMPETITOR, uri, json.dumps(options)], check=True, env=env
    )


def rows(ids: list[int] | range, value: int) -> pa.Table:
    ids = list(ids)
    flat = np.repeat(np.array(ids, dtype=np.float32), DIM) + value
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "value": pa.array([value] * len(ids), pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), DIM),
        },
        schema=SCHEMA,
    )


@pytest.mark.asyncio
async def test_the_whole_stack_runs_on_s3_with_storage_options_only(
    s3_bucket: S3Bucket, tmp_path: Any
) -> None:
    uri = s3_bucket.uri("t.lance")
    options = s3_bucket.storage_options
    ds = await la.write_dataset(rows(range(50), 0), uri, storage_options=options)
    assert ds.storage_options == options

    # merge_insert that loses one commit race and is retried by replay: once the
    # engine has read its first pass, another process commits an upsert of the same rows
    source = CompetingSource(
        rows([2, 3, 60], 100), lambda: compete_in_another_process(uri, options)
    )
    contended = await la.open_dataset(uri, storage_options=options)
    result = await (
        contended.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(la.replayable(source, schema=SCHEMA))
    )
    assert result.num_attempts == 2 and source.competed == 1

    # the MemWAL: default bucket sharding, durable sends through the routing writer
    ds = await la.open_dataset(uri, storage_options=options)
    await ds.initialize_mem_wal(max_memtable_rows=30)
    async with ds.mem_wal_writer() as writer:
        for start in range(100, 220, 20):
            await writer.put(rows(range(start, start + 20), 5))
        await writer.delete({"id": [100, 5]})  # a new row and a base row
        assert (await writer.lsm.point_lookup(101)).column("value").to_pylist() == [5]
        # another reader (no writer of its own) sees the acked rows, the unflushed
        # ones through the WAL tails, read from the bucket with the table's options
        reader = await la.open_dataset(uri, storage_options=options)
        assert isinstance(await reader.lsm.unflushed_rows(), dict)
        seen = await reader.lsm.point_lookups(list(range(200, 220)), columns=["id"])
        assert sorted(seen.column("id").to_pylist()) == list(range(200, 220))
    snaps = await ds.lsm.snapshots()  # read through the table's options
    assert snaps and sum(len(s.sstables) for s in snaps) >= 4
    scanned = (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
    ids = sorted(r["id"] for r in scanned)
    assert ids == sorted([*(i for i in range(50) if i != 5), 60, *range(101, 220)])
    assert (await ds.lsm.point_lookup(3, columns=["value"])).column("value").to_pylist() == [100]
    assert (await ds.lsm.point_lookup(100)).num_rows == 0
    assert (await ds.lsm.point_lookup(5)).num_rows == 0
    near = await ds.lsm.vector_search(np.full(DIM, 150.0 + 5), column="vec", k=3)
    assert near.column("id").to_pylist()[0] == 150
    assert (await ds.check_shards()).ok
    compaction = await ds.compact_mem_wal()
    assert compaction.rows_upserted > 0 and compaction.rows_deleted == 1
    assert await ds.count_rows() == len(ids)
    assert not [s for s in await ds.lsm.snapshots() if s.sstables]

    # the dataset as a source, read with its storage options (pinned, replayable)
    copy = await la.write_dataset(ds, tmp_path / "copy.lance")
    assert await copy.count_rows() == len(ids)


def test_the_command_line_takes_storage_options(s3_bucket: S3Bucket, tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from lance_async.cli import app

    runner = CliRunner()
    uri = s3_bucket.uri("cli.lance")
    flags = [f"--storage-option={k}={v}" for k, v in s3_bucket.storage_options.items()]
    src = tmp_path / "rows.ndjson"
    src.write_text("".join(json.dumps({"id": i, "value": i}) + "\n" for i in range(30)))
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("value", pa.int64())]
    )
    lance.write_dataset(
        schema.empty_table(), uri, schema=schema, storage_options=s3_bucket.storage_options
    )
    for command in (
        ["init-wal", uri, *flags],
        ["ingest", str(src), uri, *flags],
        ["info", uri, "--json", *flags],
        ["check", uri, *flags],
        ["compact", uri, *flags],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 0, (command, result.output)
    result = runner.invoke(app, ["scan", uri, "--format", "ndjson", *flags])
    assert result.exit_code == 0, result.output
    got = sorted(json.loads(line)["id"] for line in result.output.splitlines() if line.strip())
    assert got == list(range(30))
    bad = runner.invoke(app, ["scan", uri, "--storage-option", "no-equals-sign"])
    assert bad.exit_code == 2


@pytest.mark.asyncio
async def test_a_forgotten_storage_option_fails_instead_of_reaching_aws(
    s3_bucket: S3Bucket,
) -> None:
    uri = s3_bucket.uri(f"{uuid.uuid4().hex}.lance")
    with pytest.raises((OSError, la.LanceAsyncError)):
        await la.write_dataset(rows(range(3), 0), uri)


def test_serve_takes_its_tables_from_a_bucket(
    s3_bucket: S3Bucket, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from .web.serving import free_port, start

    options = s3_bucket.storage_options
    lance.write_dataset(
        rows(range(7), 1), s3_bucket.uri("tables/kv.lance"), storage_options=options
    )
    port = free_port()
    # settings from a config file and the environment, as a deployment would set them
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"root": s3_bucket.uri("tables"), "port": 1}))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LANCE_ASYNC_SERVE_")},
        "LANCE_ASYNC_SERVE_STORAGE_OPTIONS": json.dumps(options),
        "LANCE_ASYNC_SERVE_PORT": str(port),  # the environment beats the file
    }
    argv = [sys.executable, "-m", "lance_async", "serve", "--config", str(config)]
    with start(argv, port, tmp_path, tmp_path / "server.log", env=env) as server:
        got = httpx.get(f"{server.url}/tables/kv/rows?columns=id,value", timeout=10)
        assert got.status_code == 200
        assert sorted(json.loads(line)["id"] for line in got.text.splitlines()) == list(range(7))


def test_serve_settings_precedence(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from lance_async.web.settings import ServeSettings

    config = tmp_path / "s.toml"
    config.write_text('root = "s3://b/t"\nport = 9000\n[storage_options]\naws_region = "eu"\n')
    monkeypatch.setenv("LANCE_ASYNC_SERVE_PORT", "9100")
    got = ServeSettings.load(config, host="0.0.0.0", port=None)
    assert (got.root, got.port, got.host) == ("s3://b/t", 9100, "0.0.0.0")
    assert got.storage_options == {"aws_region": "eu"}
    assert ServeSettings.load(config, port=9200).port == 9200  # options beat the environment
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="does not parse"):
        ServeSettings.load(bad)
    with pytest.raises(ValueError):
        ServeSettings.load(None, port=70000)


@pytest.mark.asyncio
async def test_lookups_by_base_offsets_read_the_bucket_with_its_options(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lance_async.lsm import lookup
    from lance_async.lsm.basekeys import BaseKeyCache

    cache = BaseKeyCache(min_lookups=1)
    monkeypatch.setattr(lookup, "base_keys", cache)
    uri, options = s3_bucket.uri("keys.lance"), s3_bucket.storage_options
    ds = await la.write_dataset(rows(range(80), 1), uri, storage_options=options)
    await ds.delete("id = 7")
    await ds.initialize_mem_wal(max_memtable_rows=20)
    async with ds.mem_wal_writer() as writer:
        await writer.put(rows(range(0, 40, 2), 9))
    await ds.lsm.point_lookup(1)
    cache.wait_built()
    assert cache.builds == 1  # the version's keys were read from the bucket
    found = await ds.lsm.point_lookups([1, 2, 7, 79, 80])
    assert found.column("id").to_pylist() == [1, 2, 79]
    assert found.column("value").to_pylist() == [1, 9, 1]


@pytest.mark.asyncio
async def test_full_text_search_reads_every_level_from_the_bucket(s3_bucket: S3Bucket) -> None:
    """The base's INVERTED index, a flushed generation and a WAL tail, all
    read with the table's storage options (a reader opened on its own)."""
    uri, options = s3_bucket.uri("text.lance"), s3_bucket.storage_options
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("text", pa.utf8())]
    )

    def texts(ids: range, words: str) -> pa.Table:
        return pa.table({"id": list(ids), "text": [words] * len(ids)}, schema=schema)

    ds = await la.write_dataset(texts(range(20), "red fox"), uri, storage_options=options)
    await ds.create_scalar_index("text", "INVERTED")
    await ds.initialize_mem_wal(manual_shards=True)
    shard = str(uuid.uuid4())
    async with ds.mem_wal_writer(shard) as writer:
        await writer.put(texts(range(0, 10), "blue river"))  # flushed at close: a generation
    async with ds.mem_wal_writer(shard) as writer:
        await writer.put(texts(range(30, 33), "red river"))  # the WAL tail
        reader = await la.open_dataset(uri, storage_options=options)
        assert sum((await reader.lsm.unflushed_rows()).values()) >= 3
        assert any(s.sstables for s in await reader.lsm.snapshots())
        red = await reader.lsm.full_text_search("red", columns=["id"], limit=None)
        river = await reader.lsm.full_text_search("river", columns=["id"], limit=None)
    assert sorted(red.column("id").to_pylist()) == [*range(10, 20), 30, 31, 32]
    assert sorted(river.column("id").to_pylist()) == [*range(10), 30, 31, 32]
