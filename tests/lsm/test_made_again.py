"""A table deleted and made again at the same URI, in one process: no read of
the new table answers from what the old one left in a cache.

The two tables reach the same version number, so a cache keyed by the URI
and the number alone (the base's keys and row addresses, the blocklist of
hidden base rows, the lookups' key index) would serve the old table's rows:
a key the MemWAL reworded came back in its old version.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.lsm import lookup
from lance_async.lsm.basekeys import BaseKeyCache

from ..helpers import PK

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("text", pa.utf8(), nullable=False),
        pa.field("vec", pa.list_(pa.float32(), 2)),
    ]
)
SHARD = "00000000-0000-4000-8000-0000000000d7"


def rows(ids: list[int], text: str, at: float | None = None) -> pa.Table:
    """Rows of ``ids`` with ``text``; each key's vector is (key, key) unless ``at``."""
    flat = np.repeat(np.array(ids if at is None else [at] * len(ids), np.float32), 2)
    vecs = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), 2)
    return pa.table({"id": ids, "text": [text] * len(ids), "vec": vecs}, schema=SCHEMA)


@pytest.mark.asyncio
async def test_a_table_made_again_is_never_read_through_the_old_ones_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = BaseKeyCache(min_lookups=1)
    monkeypatch.setattr(lookup, "base_keys", keys)
    uri = tmp_path / "t.lance"
    versions = []
    for first in (0, 1000):
        ids = list(range(first, first + 20))
        moved = first + 5  # reworded and moved far away by the MemWAL
        ds = await la.write_dataset(rows(ids, "fox"), uri)
        await ds.create_scalar_index("text", "INVERTED")
        await ds.initialize_mem_wal(manual_shards=True)
        versions.append(ds.version)
        async with ds.mem_wal_writer(SHARD) as writer:
            await writer.put(rows([moved], "plain", at=-500.0))
        found = await ds.lsm.full_text_search("fox", columns=["id"], limit=None)
        assert sorted(found["id"].to_pylist()) == [k for k in ids if k != moved]
        near = await ds.lsm.vector_search(
            np.array([moved, moved], np.float32), column="vec", k=3, columns=["id"]
        )
        assert moved not in near["id"].to_pylist()  # its old vector is hidden
        await ds.lsm.point_lookups(ids)  # the lookups' key index of this version...
        keys.wait_built()
        other = 1007 if first == 0 else 7  # a key of the other table only
        looked = await ds.lsm.point_lookups([*ids, other], columns=["id", "text"])
        assert sorted(looked["id"].to_pylist()) == ids  # ...never the old table's
        assert dict(zip(looked["id"].to_pylist(), looked["text"].to_pylist(), strict=True)) == {
            k: "plain" if k == moved else "fox" for k in ids
        }
        shutil.rmtree(uri)
    assert versions[0] == versions[1], "the test needs both tables at one version number"
    assert keys.builds == 2
