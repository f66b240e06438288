"""The lance_async benchmark suite (not part of the tests).

Run ``python -m bench`` from the repository root (``--quick`` for a smoke
run); the report lands in ``bench/results/REPORT.md`` with PNG charts. One
module per workload: :mod:`bench.merge_replay`, :mod:`bench.mem_wal_ingest`,
:mod:`bench.scan`, :mod:`bench.scaling`; :mod:`bench.report` writes the
report and :mod:`bench._zygote` forks the fresh child process of each run.
"""
