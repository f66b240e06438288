"""The public surface: __all__ complete, importable, documented, typed."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import lance_async as la

#: Public in their modules, deliberately not re-exported at the top level.
NOT_TOP_LEVEL = {"ReaderPlan", "BridgeStatistics", "StreamStatistics", "BridgedReader"}


def test_all_is_importable_and_complete() -> None:
    for name in la.__all__:
        assert hasattr(la, name), name
    # every lazily exported name is in __all__ and the other way round
    assert set(la._LOCATIONS) == set(la.__all__)
    assert len(la.__all__) == len(set(la.__all__))
    # every public name of the modules behind them that is in their __all__
    # and documented as public API is reachable from the top level
    for module in ("dataset", "merge", "memwal", "sources"):
        mod = __import__(f"lance_async.{module}", fromlist=["__all__"])
        for name in mod.__all__:
            if inspect.isclass(getattr(mod, name)) or name in ("open_dataset", "replayable"):
                assert hasattr(la, name) or name in NOT_TOP_LEVEL, f"{module}.{name}"
    with pytest.raises(AttributeError):
        la.no_such_name  # noqa: B018


def test_every_public_name_has_a_docstring() -> None:
    for name in la.__all__:
        obj = getattr(la, name)
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not callable(member):
                    continue
                assert inspect.getdoc(member), f"{name}.{attr}"


def test_package_is_typed() -> None:
    assert (Path(la.__file__).parent / "py.typed").exists()


def test_one_spelling_per_job() -> None:
    """The spellings docs/one-way.md says went are gone from the public objects."""
    gone = {
        la.AsyncDataset: [
            "advance",
            "mutate",
            "shard_router",
            "shard_snapshots",
            "lsm_scan",
            "lsm_point_lookup",
        ],
        la.ShardRouter: ["put_stream", "lsm_scan", "lsm_point_lookups", "lsm_vector_search"],
        la.AsyncShardWriter: ["put_stream", "lsm_scan", "lsm_point_lookup", "lsm_snapshot"],
    }
    for cls, names in gone.items():
        assert [n for n in names if hasattr(cls, n)] == [], cls
    for cls in (la.AsyncDataset, la.ShardRouter, la.AsyncShardWriter):
        assert not [n for n in dir(cls) if n.startswith("lsm_")], cls
    for name in ("scan", "point_lookup", "point_lookups", "vector_search", "snapshot"):
        assert callable(getattr(la.LsmReader, name))
