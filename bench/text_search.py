"""LSM full-text search (issue 39, no target): what a search over the MemWAL costs.

One table, a base of short documents with an INVERTED index on ``text``,
then three flushed generations that reword a share of the keys and a WAL
tail that rewords more (a writer left open: its rows are read from
storage, as another process reads them). 64 queries of one or two words,
16 tasks at once, ``limit=10``:

* ``lance_async``: ``ds.lsm.full_text_search`` of a dataset opened on its
  own (every level: the base through its index with the hidden rows left
  out before ranking, the newer levels through one index built per read);
* ``pylance_base_to_thread``: pylance's ``to_table(full_text_query=...)``
  on ``anyio.to_thread`` -- the base table alone, so its answers miss or
  misstate every reworded key (its recall says by how much);
* ``pylance_compacted_to_thread``: the same search after the MemWAL was
  compacted into the base (the same rows in one level): the floor an LSM
  read is measured against.

Recall@10 is against pylance's own search of every key's newest row in a
fresh table with the same index: how many of its ten best come back. Scores
across levels are BM25 within the base and within the rest, so ten equal
to the oracle's is not promised; the match *sets* are (``tests/lsm``).

``python -m bench.text_search [--quick]`` runs it alone; ``python -m bench``
runs it inside the ``lsm`` workload.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import pyarrow as pa

from ._common import LANCE_ASYNC, PK, Metric, Series, Table, query_pool, summary_table

TASKS = 16
LIMIT = 10
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("text", pa.utf8(), nullable=False),
    ]
)
SHARD = "5f0e7b1c-2a44-4c8e-9d0b-7c1f0a3e6b21"
CASE = "{rows:,} docs, 3 generations + a WAL tail"


def sizes(quick: bool) -> dict[str, int]:
    """Base rows, rows per generation, tail rows, vocabulary size."""
    if quick:
        return {"rows": 20_000, "gen": 1_000, "tail": 500, "words": 400}
    return {"rows": 200_000, "gen": 4_000, "tail": 2_000, "words": 2_000}


def _vocabulary(n: int) -> list[str]:
    """``n`` distinct lower-case words of letters only (the tokenizer keeps them)."""
    letters = "bcdfghjklmnpqrstvwxz"
    words = []
    for i in range(n):
        word, j = "", i
        for _ in range(3):
            word += letters[j % len(letters)]
            j //= len(letters)
        words.append(f"{word}o")  # ends in a vowel: no English stem to strip
    return words


def measure(root: str, quick: bool) -> dict[str, Any]:
    """Every configuration on one table (blocking; runs its own event loop)."""
    import anyio

    import lance_async as la  # first: its engine-log filter is set before pylance loads

    import lance  # isort: skip

    n = sizes(quick)
    rng = np.random.default_rng(17)
    vocab = _vocabulary(n["words"])
    newest: dict[int, str] = {}

    def docs(ids: np.ndarray) -> pa.Table:
        texts = [" ".join(rng.choice(vocab, int(rng.integers(3, 9)))) for _ in ids]
        newest.update(zip(ids.tolist(), texts, strict=True))
        return pa.table({"id": pa.array(ids, pa.int64()), "text": texts}, schema=SCHEMA)

    uri = f"{root}/text.lance"
    lance.write_dataset(docs(np.arange(n["rows"])), uri).create_scalar_index("text", "INVERTED")
    queries = [
        " ".join(rng.choice(vocab, int(rng.integers(1, 3)), replace=False)) for _ in range(64)
    ]
    out: dict[str, Any] = {"sizes": n}

    def oracle_top() -> list[tuple[set[int], int]]:
        """Per query: the keys that may stand in its best ten (every key scoring
        at least the tenth best: ties are the engine's choice), and how many
        of them a right answer holds."""
        ids = sorted(newest)
        table = pa.table({"id": ids, "text": [newest[i] for i in ids]}, schema=SCHEMA)
        fresh = lance.write_dataset(table, f"{root}/oracle.lance")
        fresh.create_scalar_index("text", "INVERTED")
        best: list[tuple[set[int], int]] = []
        for q in queries:
            ranked = fresh.to_table(columns=["id", "_score"], full_text_query=q)
            scores = ranked["_score"].to_numpy()
            if not len(scores):
                best.append((set(), 0))
                continue
            want = min(LIMIT, len(scores))
            cut = np.sort(scores)[::-1][want - 1] * (1 - 1e-6)
            best.append((set(ranked["id"].to_numpy()[scores >= cut].tolist()), want))
        return best

    async def run_all(search: Any, best: list[tuple[set[int], int]]) -> dict[str, float]:
        async def one(i: int) -> list[int]:
            found: list[int] = await search(queries[i])
            return found

        out = await query_pool(len(queries), one, TASKS, [b[0] for b in best])
        out["recall_at_10"] = out.pop("hits") / (sum(n for _, n in best) or 1)
        return out

    def pylance_search(dataset: Any) -> Any:
        async def search(q: str) -> list[int]:
            def go() -> list[int]:
                t = dataset.to_table(columns=["id", "_score"], full_text_query=q, limit=LIMIT)
                return [int(x) for x in t["id"].to_pylist()]

            return await anyio.to_thread.run_sync(go)

        return search

    async def run() -> None:
        ads = await la.open_dataset(uri)
        await ads.initialize_mem_wal(manual_shards=True)
        async with ads.mem_wal_writer(SHARD, max_memtable_rows=n["gen"]) as w:
            for _ in range(3):
                await w.put(docs(rng.choice(n["rows"], n["gen"], replace=False)))
            await w.wait_flushed()
        async with ads.mem_wal_writer(SHARD, max_memtable_rows=n["rows"]) as w:
            await w.put(docs(rng.choice(n["rows"], n["tail"], replace=False)))  # the WAL tail
            best = await anyio.to_thread.run_sync(oracle_top)
            reader = await la.open_dataset(uri)
            out["tail_rows"] = sum((await reader.lsm.unflushed_rows()).values())

            async def mine(q: str) -> list[int]:
                t = await reader.lsm.full_text_search(q, columns=["id"], limit=LIMIT)
                return [int(x) for x in t["id"].to_pylist()]

            await mine(queries[0])  # the first read of the tail, outside the timing
            out[LANCE_ASYNC] = await run_all(mine, best)
            base = lance.dataset(uri)
            out["pylance_base_to_thread"] = await run_all(pylance_search(base), best)
        await (await la.open_dataset(uri)).compact_mem_wal()
        compacted = lance.dataset(uri)
        compacted.optimize.optimize_indices()
        out["pylance_compacted_to_thread"] = await run_all(pylance_search(lance.dataset(uri)), best)

    anyio.run(run, backend="asyncio")
    return out


def table(res: dict[str, Any]) -> tuple[Table, list[Series]]:
    """The summary table of :func:`measure`'s result, and its series."""
    case = CASE.format(rows=res["sizes"]["rows"])
    series = [Series(case, c, [m]) for c, m in res.items() if isinstance(m, dict) and "qps" in m]
    summary = summary_table(
        f"LSM full-text search, {TASKS} tasks, limit={LIMIT} (no target)",
        series,
        [
            Metric("qps", "queries/s", 1, 1),
            Metric("p50_ms", "p50 (ms)", 1, 1),
            Metric("p99_ms", "p99 (ms)", 1, 1),
            Metric("recall_at_10", "recall@10", 1, 2),
        ],
        Metric("qps", "queries/s"),
        "lance_async ÷ config (queries/s; above 1 = faster)",
        note=(
            f"{res['tail_rows']:,} rows in the WAL tail. pylance_base_to_thread searches the "
            "base alone (what a plain pylance search answers on a MemWAL table); "
            "pylance_compacted_to_thread searches the same rows after compaction."
        ),
    )
    return summary, series


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        result = measure(work, "--quick" in sys.argv)
    summary, _ = table(result)
    print(summary.title)
    print("  " + " | ".join(summary.header))
    for row in summary.rows:
        print("  " + " | ".join(row))
    print(json.dumps(result, indent=1, default=str))
