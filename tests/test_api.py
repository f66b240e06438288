"""The public surface: __all__ complete, importable, documented, typed."""

from __future__ import annotations

import inspect
from pathlib import Path

import lance_async as la


def test_all_is_importable_and_complete() -> None:
    for name in la.__all__:
        assert hasattr(la, name), name
    public = {n for n in dir(la) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(la, n))}
    assert public - modules <= set(la.__all__) | {"annotations"}, public - modules - set(la.__all__)


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
