"""The producer example of docs/scale-out.md runs as written (real Redis)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

import lance_async as la
from lance_async.cluster import Partitioner

from ..conftest import broker_or_skip
from ..feeds.support import stream_entries
from ..helpers import KV_SCHEMA

DOC = Path(__file__).resolve().parents[2] / "docs" / "scale-out.md"


@pytest.mark.asyncio
async def test_the_producer_example_puts_each_row_in_its_partition(tmp_path: Path) -> None:
    broker_or_skip("Redis", 6379)
    block = re.search(r"## A producer.*?```python\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None, "docs/scale-out.md has no producer example"
    key = f"docs-{uuid.uuid4().hex[:8]}"
    code = block.group(1).replace('"events"', repr(key))
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(KV_SCHEMA.empty_table(), uri, schema=KV_SCHEMA)
    await ds.initialize_mem_wal(num_buckets=4, bucket_column="id")
    rows = [{"id": i, "value": i, "name": f"n{i}"} for i in range(40)]
    await namespace["produce"](uri, rows)
    partitioner = await Partitioner.open(uri)
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
    try:
        seen = []
        for p in range(4):
            for _id, fields in stream_entries(await client.xrange(f"{key}:{p}")):
                part = [json.loads(line) for line in fields[b"data"].splitlines()]
                assert set(partitioner.partition_of_rows(part)) == {p}
                seen += part
        assert sorted(r["id"] for r in seen) == list(range(40))
    finally:
        for p in range(4):
            await client.delete(f"{key}:{p}")
        await client.aclose()
