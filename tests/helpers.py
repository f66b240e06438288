"""Test helpers shared by several test modules."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio
import pyarrow as pa

PK = {"lance-schema:unenforced-primary-key": "true"}

#: id (primary key, int64) + value (int64) + name (string)
KV_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("value", pa.int64()),
        pa.field("name", pa.string()),
    ]
)


def kv_table(ids: list[int] | range, value: int = 0) -> pa.Table:
    """Rows id=i, value=value, name=f"n{i}" with KV_SCHEMA."""
    ids = list(ids)
    return pa.table(
        {"id": ids, "value": [value] * len(ids), "name": [f"n{i}" for i in ids]}, schema=KV_SCHEMA
    )


@dataclass
class Ticker:
    """Measures event-loop lag with a task that sleeps 1 ms in a loop."""

    interval: float = 0.001
    lags: list[float] = field(default_factory=list)
    running: bool = True

    async def run(self) -> None:
        while self.running:
            start = time.perf_counter()
            await anyio.sleep(self.interval)
            self.lags.append(time.perf_counter() - start - self.interval)

    @property
    def max_lag(self) -> float:
        return max(self.lags) if self.lags else 0.0

    def p99(self) -> float:
        if not self.lags:
            return 0.0
        ordered = sorted(self.lags)
        return ordered[int(0.99 * (len(ordered) - 1))]
