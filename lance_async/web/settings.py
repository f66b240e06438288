"""The example server's settings: command-line options, environment, or a config file.

:class:`ServeSettings` is a pydantic-settings model, so a deployment can
configure ``lance-async serve`` without a command line: every field reads
``LANCE_ASYNC_SERVE_<FIELD>`` from the environment (mappings as JSON, e.g.
``LANCE_ASYNC_SERVE_STORAGE_OPTIONS='{"aws_region": "eu-west-1"}'``), and
``--config FILE`` (or ``LANCE_ASYNC_SERVE_CONFIG``) reads a JSON or TOML file
of the same fields. Precedence, highest first: command-line options, the
environment, the config file, the defaults.

The tables' root may be a local directory or an object-store prefix
(``s3://bucket/tables``) read with ``storage_options``.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from .limits import BodyLimits

__all__ = ["ServeSettings"]


class ServeSettings(BaseSettings):
    """How ``lance-async serve`` runs (see the module notes for where values come from).

    Attributes
    ----------
    root : str
        The tables: every ``<name>.lance`` under this directory or prefix.
    host, port : str, int
        Where to listen (default 127.0.0.1:8000).
    storage_options : dict of str to str
        Object-store options of the root and every table in it.
    writer_options : dict
        Options of the MemWAL writers (``AsyncShardWriter``'s and pylance's
        ``mem_wal_writer`` keywords).
    allow_raw_sql : bool
        Accept raw Lance SQL filters (trusted clients only).
    max_body_bytes : int or None
        Largest request body (default 1 GiB).
    body_idle_timeout : float or None
        Seconds an upload may pause between body chunks (default 30; 0: no limit).
    min_body_rate : float or None
        Bytes per second an upload must average once ``body_rate_grace`` has
        passed (default 1,024; 0: no limit).
    body_rate_grace : float or None
        Seconds from an upload's first bytes before ``min_body_rate`` applies
        (default 10).
    max_body_time : float or None
        Seconds an upload may take in all (default 3,600; 0: no limit).
        Passing any of these four is a 408 that writes nothing
        (see :class:`lance_async.fastapi.BodyLimits`).
    spool_dir : str or None
        Where merge and ingest bodies are spooled.
    log_level : str
        uvicorn's log level.
    metrics : bool
        Serve ``GET /metrics`` for Prometheus (the ``metrics`` extra).
    lance_metrics : bool
        With ``metrics``, pylance's own object-store instruments too.
    """

    model_config = SettingsConfigDict(env_prefix="LANCE_ASYNC_SERVE_", extra="forbid")

    root: str = "."
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    storage_options: dict[str, str] = Field(default_factory=dict)
    writer_options: dict[str, Any] = Field(default_factory=dict)
    allow_raw_sql: bool = False
    max_body_bytes: int | None = Field(default=None, ge=1)
    body_idle_timeout: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    min_body_rate: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    body_rate_grace: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    max_body_time: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    spool_dir: str | None = None
    log_level: str = "info"
    metrics: bool = False
    lance_metrics: bool = False

    def body_limits(self) -> BodyLimits | None:
        """The :class:`~lance_async.fastapi.BodyLimits` these settings ask for
        (None: every limit at its default)."""
        from .limits import BodyLimits

        given = {
            name: getattr(self, name)
            for name in (
                "max_body_bytes",
                "body_idle_timeout",
                "min_body_rate",
                "body_rate_grace",
                "max_body_time",
            )
            if getattr(self, name) is not None
        }
        return BodyLimits(**given) if given else None

    @classmethod
    def load(cls, config: str | os.PathLike[str] | None = None, **overrides: Any) -> ServeSettings:
        """Settings from ``config`` (JSON or TOML), the environment, then ``overrides``.

        ``overrides`` whose value is None are ignored (an option not given).

        Raises
        ------
        ValueError
            The config file cannot be read or parsed, or a value is invalid
            (pydantic's ``ValidationError`` is a ``ValueError``).
        """
        path = config or os.environ.get("LANCE_ASYNC_SERVE_CONFIG")
        from_file: dict[str, Any] = {}
        if path:
            text_path = Path(path)
            try:
                raw = text_path.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read the config file {str(path)!r}: {exc}") from None
            try:
                if text_path.suffix.lower() == ".toml":
                    try:
                        toml = importlib.import_module("tomllib")
                    except ImportError:  # Python 3.10
                        raise ValueError("TOML config files need Python 3.11; use JSON") from None
                    from_file = toml.loads(raw.decode())
                else:
                    from_file = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ValueError(f"the config file {str(path)!r} does not parse: {exc}") from None
            if not isinstance(from_file, dict):
                raise ValueError(f"the config file {str(path)!r} must hold a table of settings")
        env = cls()  # the environment (and the defaults)
        explicit_env = env.model_fields_set
        merged: dict[str, Any] = {**from_file}
        merged.update({k: getattr(env, k) for k in explicit_env})
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(merged)
