"""What every command shares: the typer app, the consoles, errors as exit codes, progress."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

try:
    import typer
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
except ImportError as exc:  # pragma: no cover - the demo extra provides them
    raise SystemExit(
        "the lance-async command needs typer and rich: pip install 'lance-async[demo]'"
    ) from exc

from .. import errors
from ..dataset import AsyncDataset, open_dataset
from ..sources.files import guess_format

app = typer.Typer(
    help="Async streaming for Lance: ingest feeds into the MemWAL, upsert, scan.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


@dataclass
class Writes:
    """Whether a command may have written rows yet (for the error message).

    ``started`` turns True just before the first write; a
    :class:`~lance_async.DecodeError` before that wrote nothing.
    """

    started: bool = False


def run_command(
    coro_fn: Callable[[], Coroutine[Any, Any, Any]], writes: Writes | None = None
) -> Any:
    """Run a coroutine; turn lance_async errors into one line and an exit code.

    ``typer.BadParameter`` raised inside exits 2 with typer's usage message;
    ``writes`` says whether a bad input may have come after written rows
    (None: nothing is known, so nothing is claimed).
    """
    try:
        return anyio.run(coro_fn)
    except (typer.BadParameter, typer.Exit):
        raise  # a bad argument (exit 2 with typer's usage message), or already decided
    except BrokenPipeError:  # `| head` closed the pipe: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except errors.DatasetNotFoundError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    except errors.DecodeError as exc:
        where = f" (offset {exc.offset})" if exc.offset is not None else ""
        if writes is not None and not writes.started:
            outcome = " Nothing was written."
        elif writes is not None:
            outcome = " Rows before it may have been written."
        else:
            outcome = ""
        err.print(f"[red]error:[/red] bad input{where}: {exc}.{outcome}")
        raise typer.Exit(1) from None
    except errors.LanceAsyncError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    except (OSError, ValueError) as exc:
        err.print(f"[red]error:[/red] {str(exc).split(', /home/runner', 1)[0]}")
        raise typer.Exit(1) from None
    except Exception as exc:  # a connection refused by a broker, and the like
        err.print(f"[red]error:[/red] {type(exc).__name__}: {exc}")
        raise typer.Exit(1) from None


def progress_bar() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


def count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def check_columns(ds: AsyncDataset, names: Sequence[str], option: str) -> None:
    """Raise typer.BadParameter (exit 2) for a column the table does not have."""
    unknown = [n for n in names if n not in ds.schema.names]
    if unknown:
        raise typer.BadParameter(
            f"no column {unknown[0]!r} in the table (it has {', '.join(ds.schema.names)})",
            param_hint=f"'{option}'",
        )


def format_of(path: str) -> str:
    try:
        return guess_format(path)
    except ValueError as exc:
        raise typer.BadParameter(f"{exc} (--format)") from None


#: The ``--storage-option`` option of every command that opens a table.
STORAGE_OPTION: Any = typer.Option(
    None,
    "--storage-option",
    "-s",
    help="An object-store option KEY=VALUE for the table (repeatable), e.g. "
    "aws_endpoint=http://host:9000; without any, the standard AWS_*, GOOGLE_* and "
    "AZURE_* environment variables are used.",
)


def parse_storage_options(values: Sequence[str] | None) -> dict[str, str] | None:
    """``KEY=VALUE`` strings as a dict (None when there are none).

    Raises
    ------
    typer.BadParameter
        A value without ``=`` or with an empty key (exit 2).
    """
    if not values:
        return None
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(
                f"expected KEY=VALUE, got {item!r}", param_hint="'--storage-option'"
            )
        out[key.strip()] = value
    return out


async def open_table(uri: str, storage: Sequence[str] | None) -> AsyncDataset:
    """:func:`lance_async.open_dataset` with the command's ``--storage-option`` values."""
    return await open_dataset(uri, storage_options=parse_storage_options(storage))
