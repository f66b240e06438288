"""FastAPI and Starlette integration (the ``fastapi`` extra): see :mod:`lance_async.web`.

This module re-exports :mod:`lance_async.web`, where the helpers live, one
module per job; ``import lance_async.fastapi`` keeps working.
"""

from __future__ import annotations

from .web import *  # noqa: F403
from .web import __all__ as __all__
