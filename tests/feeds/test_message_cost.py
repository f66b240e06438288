"""A large message's cost: the copies on its way in, and its peak memory (issue 37).

One child process (``costproc.py``) takes a 16 MB NDJSON message through
``ingest()`` and a routing writer, and counts the copies of each step: Python's
(tracemalloc) while decoding, Arrow's (a proxy memory pool's peak) while
decoding and while cutting a run per shard, and the process's peak resident
memory over the message's size. Before issue 37 the same message made two
Python copies of the payload (``strip`` and a join), pyarrow's parser a
second copy of the table (one block of the whole text), the router two
(the concatenated run and its sorted take), and the resident peak was 7.2x
the message; a JSON array's cut held about 4x more in numpy arrays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's VmHWM reset")
def test_a_large_message_is_decoded_and_routed_without_copies_of_its_whole() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.feeds.costproc", "16", "200"],
        cwd=ROOT,
        env={**os.environ, "LANCE_LOG": "critical"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    cost = json.loads(done.stdout.strip().splitlines()[-1])
    # decoding: no Python copy of an NDJSON payload, one (the NDJSON text) of
    # a JSON array; Arrow holds the table and one block beside it
    assert cost["ndjson_python"] < 0.25, cost
    assert cost["array_python"] < 1.5, cost
    assert cost["ndjson_arrow"] < 1.5 and cost["array_arrow"] < 1.5, cost
    # routing: each shard's rows taken once, not the run concatenated first
    assert cost["route_arrow"] < 1.6, cost
    # the whole way in, engine put included: generous (measured about 3x)
    assert cost["ingest_rss"] < 5.0, cost
