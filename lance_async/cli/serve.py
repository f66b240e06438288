"""The ``serve`` command (the example FastAPI app) and ``keygen`` (an API key for it)."""

from __future__ import annotations

import gc
from typing import Any

import typer

from .common import STORAGE_OPTION, fail, missing_extra, number, parse_storage_options
from .common import app as cli

__all__ = ["keygen", "serve"]


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
    api_keys_file: str | None = typer.Option(
        None,
        "--api-keys-file",
        metavar="FILE",
        help="API keys, one 'ID SCOPE sha256:HEX' per line (make them with keygen).",
    ),
    dangerously_serve_without_auth: bool | None = typer.Option(
        None,
        "--dangerously-serve-without-auth",
        help="Listen beyond loopback with no authentication: anyone can read and write.",
    ),
    ssl_certfile: str | None = typer.Option(
        None, "--ssl-certfile", metavar="FILE", help="TLS certificate (PEM) to serve https."
    ),
    ssl_keyfile: str | None = typer.Option(
        None, "--ssl-keyfile", metavar="FILE", help="TLS private key (PEM)."
    ),
    head_timeout: float | None = typer.Option(
        None,
        "--head-timeout",
        metavar="SECONDS",
        help="Time to receive a request head, else 408 (default 10; 0: none).",
        callback=number("--head-timeout"),
    ),
    max_head_bytes: int | None = typer.Option(
        None,
        "--max-head-bytes",
        metavar="BYTES",
        help="Largest request head, else 431 (default 32 KiB).",
        callback=number("--max-head-bytes", minimum=1),
    ),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Serve a directory (or an object-store prefix) of Lance tables over HTTP.

    Settings come from these options, then LANCE_ASYNC_SERVE_* environment
    variables, then --config, then the defaults. Needs the 'fastapi' extra.
    Beyond 127.0.0.1 it needs API keys (--api-keys-file) or, to run without,
    --dangerously-serve-without-auth.
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
        "api_keys_file": api_keys_file,
        "dangerously_serve_without_auth": dangerously_serve_without_auth,
        "ssl_certfile": ssl_certfile,
        "ssl_keyfile": ssl_keyfile,
        "head_timeout": head_timeout,
        "max_head_bytes": max_head_bytes,
    }
    try:
        settings = ServeSettings.load(config, **overrides)
        gc.freeze()  # start-up objects out of the collector's way (docs/memwal.md)
        serve_main(settings)
    except ImportError as exc:  # --metrics without the extra
        fail(_import_error(exc), 2)
    except ValueError as exc:
        fail(_settings_error(exc), 2)


@cli.command()
def keygen(
    key_id: str = typer.Argument(..., metavar="ID", help="The key's id (logs name it)."),
    scope: str = typer.Option(
        "read", "--scope", metavar="SCOPE", help="read, write or admin (default read)."
    ),
) -> None:
    """Make an API key for serve: the token on standard error (shown once),
    its line for --api-keys-file on standard output.

    lance-async keygen ci --scope write >> keys.txt
    """
    try:
        from ..web.auth import ApiKey, new_token
    except ImportError as exc:
        fail(_import_error(exc), 2)
    token = new_token()
    try:
        key = ApiKey.from_token(key_id, scope, token)
    except ValueError as exc:
        fail(" ".join(str(exc).split()), 2)
    typer.echo(f"token for {key.id} ({key.scope.value}): {token}", err=True)
    typer.echo(key.line())


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
