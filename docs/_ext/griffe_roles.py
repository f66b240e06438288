"""A griffe extension for the API reference: Sphinx roles in docstrings as code.

The docstrings are NumPy style and name other objects with Sphinx roles
(``:class:`~lance_async.AsyncDataset```, ``:meth:`flush```). Markdown has no
roles, so this turns each into inline code of the name as Sphinx would show
it (``~`` keeps the last part only), before mkdocstrings renders the
docstring. Loaded by ``mkdocs.yml`` (``extensions`` of the python handler);
not part of the package.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    title = target.split(".")[-1] if tilde else target
    return f"`{title}`"


def strip_roles(text: str) -> str:
    """``text`` with every Sphinx role made inline code."""
    return ROLE.sub(_plain, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = strip_roles(obj.docstring.value)
