"""Peer suites ported by meaning: Lance's merge_insert and MemWAL tests and
LanceDB's merge tests, each behaviour checked through lance_async's async API
(and beside pylance where pylance has the same call). ``docs/parity.md``,
"Peer suites", lists what was mirrored and what differs."""
