"""The ``serve`` command: the example FastAPI app."""

from __future__ import annotations

import gc
from typing import Any

import typer

from .common import STORAGE_OPTION, fail, missing_extra, number, parse_storage_options
from .common import app as cli

__all__ = ["serve"]


@cli.command()
def serve(
    root: str | None = typer.Option(
        None,
        "--root",
        metavar="DIR",
        help="Directory or object-store prefix of <name>.lance tables (default .).",
    ),
    host: str | None = typer.Option(
        None, "--host", metavar="HOST", help="Interface (default 127.0.0.1)."
    ),
    port: int | None = typer.Option(
        None,
        "--port",
        metavar="PORT",
        help="TCP port (default 8000).",
        callback=number("--port", maximum=65_535),
    ),
    allow_raw_sql: bool | None = typer.Option(
        None, "--allow-raw-sql/--no-raw-sql", help="Accept raw SQL filters."
    ),
    max_body_bytes: int | None = typer.Option(
        None,
        "--max-body-bytes",
        metavar="BYTES",
        help="Largest request body (default 1 GiB).",
        callback=number("--max-body-bytes", minimum=1),
    ),
    spool_dir: str | None = typer.Option(
        None, "--spool-dir", metavar="DIR", help="Where replay spools go."
    ),
    metrics: bool | None = typer.Option(
        None,
        "--metrics/--no-metrics",
        help="Serve GET /metrics for Prometheus (pip install 'lance-async[metrics]').",
    ),
    lance_metrics: bool | None = typer.Option(
        None, "--lance-metrics", help="With --metrics, pylance's object-store metrics too."
    ),
    config: str | None = typer.Option(
        None,
        "--config",
        metavar="FILE",
        help="A JSON or TOML file of settings (see lance_async.web.settings).",
    ),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Serve a directory (or an object-store prefix) of Lance tables over HTTP.

    Settings come from these options, then LANCE_ASYNC_SERVE_* environment
    variables, then --config, then the defaults. Needs the 'fastapi' extra.
    """
    try:
        from ..web.server import main as serve_main
        from ..web.settings import ServeSettings
    except ImportError as exc:
        fail(_import_error(exc), 2)
    overrides: dict[str, Any] = {
        "root": root,
        "host": host,
        "port": port,
        "allow_raw_sql": allow_raw_sql,
        "max_body_bytes": max_body_bytes,
        "spool_dir": spool_dir,
        "metrics": metrics,
        "lance_metrics": lance_metrics,
        "storage_options": parse_storage_options(storage_option),
    }
    try:
        settings = ServeSettings.load(config, **overrides)
        gc.freeze()  # start-up objects out of the collector's way (README, GC)
        serve_main(settings)
    except ImportError as exc:  # --metrics without the extra
        fail(_import_error(exc), 2)
    except ValueError as exc:
        fail(_settings_error(exc), 2)


def _import_error(exc: ImportError) -> str:
    """What to install, said once: the missing module's extra when it is known,
    else the library's own message (which names its extra)."""
    hint = missing_extra(exc)
    if hint is not None:
        return hint
    text = " ".join(str(exc).split())
    return text if "pip install" in text else f"{text}; pip install 'lance-async[fastapi]'"


def _settings_error(exc: ValueError) -> str:
    """A settings error on one line (pydantic's lists one problem per line,
    each followed by a link)."""
    problems = getattr(exc, "errors", None)
    if callable(problems):
        try:
            items = [
                f"{'.'.join(str(p) for p in e.get('loc', ())) or 'settings'}: {e.get('msg')}"
                for e in problems()
            ]
        except Exception:  # not pydantic's errors(): fall back to the text
            items = []
        if items:
            return "bad settings: " + "; ".join(items)
    return " ".join(str(exc).split())
