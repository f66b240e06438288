"""A command's start-up, made cheaper: the engine imported without what no command uses.

Every ``lance-async`` command but ``--help`` and ``--version`` imports
pylance and ``pyarrow.dataset``. pyarrow imports pandas as soon as
``pyarrow.dataset`` loads (to tell pandas objects apart), and redis-py
imports the OpenTelemetry SDK for an instrumentation it uses only when
asked; no command has a pandas object, and ``--metrics`` imports the SDK
itself. Skipping both, with the garbage collector off while the modules
load, halves the CPU of the engine's import (about 1.25 s to 0.6 s here):
every short command (``info``, ``lookup``, ``scan``) starts that much
sooner, and a restarted worker, which a take-over waits for, takes its
partitions sooner on a loaded machine.

The idea is the lazy imports of CPython's own start-up and of tools such
as Mercurial's ``demandimport``: load at start only what the command runs.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import importlib.machinery
import sys
from typing import Any

__all__ = ["SKIPPED_AT_START", "LeanStart", "import_engine"]

SKIPPED_AT_START = ("pandas", "opentelemetry.sdk")
"""Modules not imported while a command starts, although a dependency would
import them (each is imported as usual later, if a command asks)."""


class LeanStart(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Skip :data:`SKIPPED_AT_START` and stop the collector between
    :meth:`begin` and :meth:`end` (not thread-safe: call both on the main
    thread, before any other thread imports).

    Meanwhile an import of a skipped module fails with ``ImportError`` (the
    modules that import them optionally carry on without), although
    ``importlib.util.find_spec`` still finds it, so a later import, after
    :meth:`end`, loads it as usual. Start-up makes objects that live for
    good: :func:`gc.freeze` after :meth:`end` keeps the collector from
    walking them again.
    """

    def begin(self) -> None:
        """Skip the modules and stop the collector (before the engine is imported)."""
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        gc.disable()

    def end(self) -> None:
        """Imports as usual again, and the collector on (idempotent)."""
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        gc.enable()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        """A spec whose loading fails, for a skipped module; None otherwise."""
        if fullname in SKIPPED_AT_START and fullname not in sys.modules:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: Any) -> Any:
        """Refuse: the module is not loaded during start-up."""
        raise ImportError(f"{spec.name} is not imported while a command starts")

    def exec_module(self, module: Any) -> None:
        """Never reached (:meth:`create_module` refuses)."""


def import_engine() -> None:
    """Import pylance and ``pyarrow.dataset`` the lean way, then freeze what
    they made out of the collector's way (blocking, once per process: a
    second call finds them imported and does nothing).

    Called by the root command before any command runs. In a process that
    has imported them already (a test calling :func:`~lance_async.cli.main`)
    it changes nothing.
    """
    if "lance" in sys.modules and "pyarrow.dataset" in sys.modules:
        return
    lean = LeanStart()
    lean.begin()
    try:
        import lance  # noqa: F401
        import pyarrow.dataset  # noqa: F401
    finally:
        lean.end()
    gc.freeze()
