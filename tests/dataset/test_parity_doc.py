"""docs/parity.md names every public LanceDataset method and property of pylance 14,
and every AsyncDataset twin it names exists."""

from __future__ import annotations

import re
from pathlib import Path

from lance.dataset import LanceDataset

import lance_async as la

DOC = Path(__file__).parents[2] / "docs" / "parity.md"


def _rows() -> list[tuple[str, str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and not set(cells[0]) <= {"-", " "}:
            rows.append((cells[0], cells[1]))
    return rows


def _names(cell: str, *, first_only: bool = False) -> set[str]:
    """The names in backticks (``await x.y(...)``: x and y, or x alone)."""
    out: set[str] = set()
    for match in re.finditer(r"`(?:await )?([\w.]+)", cell):
        parts = match.group(1).split(".")
        out.update(parts[:1] if first_only else parts)
    return out


def test_every_lance_dataset_member_has_a_row() -> None:
    listed = set().union(*(_names(pylance) for pylance, _ in _rows()))
    public = {name for name in vars(LanceDataset) if not name.startswith("_")}
    assert not public - listed, sorted(public - listed)


def test_every_twin_named_exists() -> None:
    twins = set().union(*(_names(ours, first_only=True) for _, ours in _rows()))
    known = {
        "AsyncDataset",
        "AsyncBatchStream",
        "AsyncTags",
        "AsyncSqlQuery",
        "AsyncBlobFile",
        "AsyncFragment",
        "AsyncDelta",
        "AsyncBranches",
        "CommitBatchResult",
        "ShardRouter",
        "AsyncShardWriter",
        "AsyncMergeInsertBuilder",
        "lance",
        "lsm",  # an LsmReader, set per dataset: its reads are checked below
    }
    missing = {t for t in twins if not hasattr(la.AsyncDataset, t) and t not in known}
    assert not missing, sorted(missing)


def test_every_lsm_read_named_exists() -> None:
    """``lsm.scan`` & co. name methods of the dataset's LSM reader (``ds.lsm``)."""
    named = {
        match.group(1)
        for _, ours in _rows()
        for match in re.finditer(r"`(?:await )?lsm\.(\w+)", ours)
    }
    assert named, "docs/parity.md names no LSM read"
    missing = {name for name in named if not callable(getattr(la.LsmReader, name, None))}
    assert not missing, sorted(missing)
