"""Smoke tests of the services in ``tests/services.py``, with the real clients.

* pylance 14 on moto, configured by ``storage_options`` alone: write,
  merge_insert, MemWAL initialisation, a durable put, and the flushed
  generation read back through ``LsmScanner.from_snapshots``.
* The MemWAL files read through a pyarrow ``S3FileSystem`` and through
  obstore, both built from the same ``storage_options``.
* librdkafka (KafkaFeed over confluent-kafka's AIOConsumer) on Tansu: a
  6-partition topic, a two-member consumer group with manual commits, and a
  rebalance when one member stops.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import anyio
import lance
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from lance.mem_wal import LsmScanner, ShardSnapshot

from .services import (
    FAST_GROUP,
    S3Bucket,
    create_topic,
    unique_name,
)

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("name", pa.string())]
)
GEN_DIR = re.compile(r"^[0-9a-f]{8}_gen_(\d+)$")


def rows(ids: list[int], names: list[str]) -> pa.Table:
    return pa.table({"id": ids, "name": names}, schema=SCHEMA)


def by_id(table: pa.Table) -> dict[int, str]:
    return {r["id"]: r["name"] for r in table.to_pylist()}


def arrow_s3(storage_options: dict[str, str]) -> pafs.S3FileSystem:
    """A pyarrow S3 filesystem from pylance-style ``storage_options``.

    ``endpoint_override`` takes the full ``http://host:port`` URL (the scheme
    comes from it, so ``allow_http`` needs no counterpart).
    """
    return pafs.S3FileSystem(
        access_key=storage_options["aws_access_key_id"],
        secret_key=storage_options["aws_secret_access_key"],
        region=storage_options["aws_region"],
        endpoint_override=storage_options["aws_endpoint"],
    )


def obstore_s3(url: str, storage_options: dict[str, str]) -> Any:
    """An obstore ``S3Store`` for ``url`` from the same ``storage_options``.

    ``S3Store.from_url`` panics (``pyo3_runtime.PanicException``, not an
    Exception) if ``config`` holds a key without the ``aws_`` prefix, so
    ``allow_http`` goes to ``client_options``.
    """
    from obstore.store import S3Store

    config: Any = {k: v for k, v in storage_options.items() if k.startswith("aws_")}
    client: Any = {"allow_http": storage_options.get("allow_http", "false") == "true"}
    return S3Store.from_url(url, config=config, client_options=client)


# -- S3 ----------------------------------------------------------------------


def test_moto_answers_conditional_put(s3_bucket: S3Bucket) -> None:
    """``If-None-Match: *`` on an existing key is refused (412), as Lance needs."""
    obstore = pytest.importorskip("obstore")
    store = obstore_s3(s3_bucket.uri(""), s3_bucket.storage_options)
    obstore.put(store, "k", b"first", mode="create")
    with pytest.raises(obstore.exceptions.AlreadyExistsError, match="412"):
        obstore.put(store, "k", b"second", mode="create")
    assert bytes(obstore.get(store, "k").bytes()) == b"first"


def test_lance_mem_wal_on_moto(s3_bucket: S3Bucket) -> None:
    options = s3_bucket.storage_options
    uri = s3_bucket.uri("t.lance")
    ds = lance.write_dataset(rows([1, 2, 3], ["a", "b", "c"]), uri, storage_options=options)
    ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
        rows([3, 4], ["C", "d"])
    )
    ds = lance.dataset(uri, storage_options=options)
    assert by_id(ds.to_table()) == {1: "a", 2: "b", 3: "C", 4: "d"}

    ds.initialize_mem_wal(bucket_column="id", num_buckets=2)
    shard = str(uuid.uuid4())
    writer = ds.mem_wal_writer(shard, durable_write=True, max_wal_flush_interval_ms=10)
    try:
        writer.put(rows([4, 5], ["D", "e"]))
        # put() returned: the rows are durable, so the WAL file is on S3 already
        # (writer.stats()["wal_flush_count"] may still read 0 at this point)
        fs = arrow_s3(options)
        wal = fs.get_file_info(
            pafs.FileSelector(f"{s3_bucket.bucket}/t.lance/_mem_wal/{shard}/wal")
        )
        assert [i.base_name for i in wal if i.base_name.endswith(".arrow")]
        assert by_id(writer.lsm_scanner().to_table())[5] == "e"
    finally:
        writer.close()

    ds = lance.dataset(uri, storage_options=options)
    assert by_id(LsmScanner.from_snapshots(ds, []).to_table()) == {1: "a", 2: "b", 3: "C", 4: "d"}

    # close() flushed the memtable into a generation folder; find it through
    # pyarrow (what lance_async's manifest reader uses) and scan it
    shard_dir = f"{s3_bucket.bucket}/t.lance/_mem_wal/{shard}"
    gens = [
        (int(m.group(1)), info.base_name)
        for info in arrow_s3(options).get_file_info(pafs.FileSelector(shard_dir))
        if (m := GEN_DIR.match(info.base_name)) and info.type == pafs.FileType.Directory
    ]
    assert [g for g, _ in gens] == [1]
    snapshot = ShardSnapshot(shard)
    for generation, folder in gens:
        snapshot = snapshot.with_sstable(generation, folder)
    merged = by_id(LsmScanner.from_snapshots(ds, [snapshot]).to_table())
    assert merged == {1: "a", 2: "b", 3: "C", 4: "D", 5: "e"}


def test_mem_wal_files_through_arrow_and_obstore(s3_bucket: S3Bucket) -> None:
    """pyarrow's S3FileSystem and obstore both list and read ``_mem_wal/`` on moto."""
    options = s3_bucket.storage_options
    uri = s3_bucket.uri("m.lance")
    ds = lance.write_dataset(rows([1], ["a"]), uri, storage_options=options)
    ds.initialize_mem_wal()
    shard = str(uuid.uuid4())
    with ds.mem_wal_writer(shard, durable_write=True, max_wal_flush_interval_ms=10) as writer:
        writer.put(rows([2], ["b"]))

    manifest_dir = f"{s3_bucket.bucket}/m.lance/_mem_wal/{shard}/manifest"
    fs = arrow_s3(options)
    arrow_names = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(manifest_dir)))
    assert "version_hint.json" in arrow_names
    assert any(n.endswith(".binpb") for n in arrow_names)
    with fs.open_input_stream(f"{manifest_dir}/version_hint.json") as f:
        hint = f.read()
    assert hint.startswith(b'{"version":')

    obstore = pytest.importorskip("obstore")
    store = obstore_s3(uri, options)
    listed = obstore.list(store, prefix=f"_mem_wal/{shard}/manifest").collect()
    assert sorted(o["path"].rsplit("/", 1)[-1] for o in listed) == arrow_names
    path = f"_mem_wal/{shard}/manifest/version_hint.json"
    assert bytes(obstore.get(store, path).bytes()) == hint


# -- Kafka -----------------------------------------------------------------------


async def _drain(feeds: list[Any], want: int, seen: dict[tuple[int, int], Any]) -> None:
    """Fetch from ``feeds`` until ``seen`` holds ``want`` records and all have partitions."""
    with anyio.fail_after(30):
        while len(seen) < want or not all(f.assigned for f in feeds):
            for f in feeds:
                for m in await f.fetch(100, 0.05):
                    key = (m.offset.partition, m.offset.offset)
                    assert key not in seen, "delivered twice"
                    seen[key] = m


@pytest.mark.asyncio
async def test_kafka_group_commit_and_rebalance(kafka_bootstrap: str) -> None:
    from lance_async.feeds import KafkaFeed, KafkaProducer
    from lance_async.feeds.kafkaclient import setting_name

    topic, group = unique_name("smoke"), unique_name("group")
    await create_topic(kafka_bootstrap, topic, partitions=6)
    every = {(topic, p) for p in range(6)}
    async with KafkaProducer({"bootstrap.servers": kafka_bootstrap}) as producer:
        sent = [await producer.send(topic, f"{i}".encode(), partition=i % 6) for i in range(100)]
        for future in sent:
            await future
    fast = {setting_name(k): v for k, v in FAST_GROUP.items()}

    t0 = time.monotonic()
    c1 = await KafkaFeed.connect(kafka_bootstrap, [topic], group, options=fast, client_id="c1")
    c2 = await KafkaFeed.connect(kafka_bootstrap, [topic], group, options=fast, client_id="c2")
    async with c1:
        async with c2:
            seen: dict[tuple[int, int], Any] = {}
            await _drain([c1, c2], 100, seen)
            assert sorted(int(m.payload) for m in seen.values()) == list(range(100))
            a1, a2 = c1.assigned, c2.assigned
            assert a1 and a2 and not a1 & a2 and a1 | a2 == every
            for m in seen.values():
                await m.ack()
            committed = {**await c1.commit(), **await c2.commit()}
            assert committed == {tp: 17 if tp[1] < 4 else 16 for tp in every}
        # c2 leaves: c1 takes its partitions (when c2's session expires: Tansu
        # ignores LeaveGroup) and resumes at the committed offsets
        with anyio.fail_after(30):
            while c1.assigned != every:
                assert not await c1.fetch(100, 0.1)
        async with KafkaProducer({"bootstrap.servers": kafka_bootstrap}) as producer:
            for tp in sorted(a2):
                await producer.send_and_wait(topic, b"after", partition=tp[1])
        later: dict[tuple[int, int], Any] = {}
        await _drain([c1], len(a2), later)
        assert sorted(later) == sorted((tp[1], committed[tp]) for tp in a2)
        print(f"group join, consume, commit and handover: {time.monotonic() - t0:.1f} s")
