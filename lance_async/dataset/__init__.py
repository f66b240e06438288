"""``AsyncDataset``: a Lance dataset whose every blocking call runs off the loop.

The class is assembled in ``facade.py`` from one mixin per group of
operations (reads, writes, schema, versions, maintenance, MemWAL), each a
module of this package over the core in ``_core.py``; ``handles.py`` wraps
the engine objects those calls return whose own methods block (SQL queries,
blob files, fragments, deltas, branches). The MemWAL and merge
code take the dataset as an argument and never import this package at run
time: imports run from here down.
"""

from __future__ import annotations

from .facade import AsyncDataset, open_dataset, write_dataset
from .handles import AsyncBlobFile, AsyncBranches, AsyncDelta, AsyncFragment, AsyncSqlQuery
from .versions import AsyncTags
from .writes import CommitBatchResult

__all__ = [
    "AsyncBlobFile",
    "AsyncBranches",
    "AsyncDataset",
    "AsyncDelta",
    "AsyncFragment",
    "AsyncSqlQuery",
    "AsyncTags",
    "CommitBatchResult",
    "open_dataset",
    "write_dataset",
]
