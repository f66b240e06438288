"""The ``lance-async`` command (typer and rich; the ``demo`` extra installs them).

Commands
--------
``demo [--dir PATH]``
    The main job: the whole mission on the 2013 NYC flights (see
    :mod:`lance_async.demo`). Exit code 0 only when every check holds.
``ingest SOURCE TABLE_URI [--format F] [--shard ID]``
    Stream a file, ``-`` (stdin), ``nats://host:port/STREAM/SUBJECT`` or
    ``redis://host:port/STREAM`` into the table's MemWAL; every message is
    acknowledged once its rows are durable. A file is checked whole first
    (it is replayable), so a bad line writes nothing.
``merge SOURCE TABLE_URI --on KEY``
    Upsert a file into the table (merge_insert on a replayable source).
``scan TABLE_URI [--filter EXPR] [--columns A,B] [--format table|ndjson|ipc]``
    Stream rows to standard output.
``info TABLE_URI``
    Versions, rows, MemWAL shards and their generations.
``serve [--root DIR]``
    The example FastAPI app (``fastapi`` extra).

Errors print a clear message on standard error and exit with 2 for a bad
argument -- an unknown option value, column or join key, a filter the engine
cannot parse, a missing file, no table at the URI -- and with 1 for anything
else (bad data, conflicts, a table in the wrong state, a broker or engine
failure). "Nothing was written" is said only when it is true: a file checked
whole before the first write (``ingest``'s default), or a ``merge`` (which
commits all or nothing).

Output is encoded and written, and input decoded, on the library's worker
threads (``stream`` limiter), never on the event loop.
"""

from __future__ import annotations

import os

# The engine logs harmless lines at ERROR level on some MemWAL calls ("Index
# __lance_mem_wal has no fields"); a command's stderr is for our messages.
# It reads LANCE_LOG once, when pylance is imported: so before any import of it.
os.environ.setdefault("LANCE_LOG", "critical")

import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import anyio
import pyarrow as pa

try:
    import typer
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - the demo extra provides them
    raise SystemExit(
        "the lance-async command needs typer and rich: pip install 'lance-async[demo]'"
    ) from exc

from . import errors
from ._threads import run_sync, stream_limiter
from .dataset import AsyncDataset, open_dataset
from .feeds import Feed, IngestStats, IterableFeed, ingest
from .memwal.retired import current_epoch, derived_shard_id
from .sources.decoders import make_decoder
from .sources.files import file_source, guess_format

__all__ = ["app", "main"]

app = typer.Typer(
    help="Async streaming for Lance: ingest feeds into the MemWAL, upsert, scan.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


@dataclass
class _Writes:
    """Whether a command may have written rows yet (for the error message).

    ``started`` turns True just before the first write; a
    :class:`~lance_async.DecodeError` before that wrote nothing.
    """

    started: bool = False


def _run(coro_fn: Callable[[], Coroutine[Any, Any, Any]], writes: _Writes | None = None) -> Any:
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


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


# -- demo -------------------------------------------------------------------------


class _RichDemoProgress:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}

    def stage(self, name: str, total: float | None) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task(name, total=total)

    def advance(self, name: str, amount: float) -> None:
        if name in self.tasks:
            self.progress.advance(self.tasks[name], amount)

    def log(self, message: str) -> None:
        self.progress.console.print(f"  {message}")

    def done(self, name: str) -> None:
        if name in self.tasks:
            self.progress.update(self.tasks[name], total=1, completed=1)


@app.command()
def demo(
    dir: str = typer.Option("lance_async_demo", "--dir", help="Where the demo's tables go."),
) -> None:
    """Run the whole mission on the 2013 NYC flights (336,776 rows)."""
    from .demo import run_demo

    with _progress() as progress:
        report = _run(lambda: run_demo(Path(dir), _RichDemoProgress(progress)))
    summary = Table(title="lance-async demo", show_header=False)
    summary.add_row("rows ingested (durable, acked)", f"{report.rows_ingested:,}")
    summary.add_row("engine puts (group commit)", f"{report.engine_puts:,}")
    summary.add_row("ingest rows/s", f"{report.rows_per_second:,.0f}")
    summary.add_row(
        "ack latency p50 / p99",
        f"{report.ack_latency_p50 * 1000:.0f} ms / {report.ack_latency_p99 * 1000:.0f} ms",
    )
    summary.add_row("late corrections", f"{report.corrections:,}")
    summary.add_row("weather merge attempts", " ".join(str(a) for a in report.merge_attempts))
    summary.add_row(
        "LSM point lookups (p99)", f"{report.lookups:,} ({report.lookup_p99 * 1000:.0f} ms)"
    )
    summary.add_row("generations compacted", str(report.compacted_generations))
    summary.add_row("max event-loop lag", f"{report.max_loop_lag * 1000:.1f} ms")
    summary.add_row("wall time", f"{report.seconds:.1f} s")
    out.print(summary)
    for name, ok in report.checks.items():
        out.print(f"  {'[green]PASS' if ok else '[red]FAIL'}[/] {name}")
    if not report.ok:
        raise typer.Exit(1)


# -- ingest -------------------------------------------------------------------------


async def _stdin_batches(fmt: str, schema: pa.Schema) -> AsyncIterator[pa.RecordBatch]:
    """Standard input decoded as it arrives (``read1``: whatever the pipe
    holds, up to 1 MiB); the decoder runs on a worker thread."""
    decoder = make_decoder(fmt, schema)
    stdin = anyio.wrap_file(sys.stdin.buffer)
    limiter = stream_limiter()
    while chunk := await stdin.read1(1 << 20):
        for batch in await run_sync(partial(decoder.feed, chunk), limiter=limiter):
            yield batch
    for batch in await run_sync(decoder.finish, limiter=limiter):
        yield batch


def _open_feed(source: str, fmt: str | None, schema: pa.Schema, follow: bool) -> Any:
    """An async context manager (or plain feed) for SOURCE."""
    if source == "-":
        return IterableFeed(_stdin_batches(fmt or "ndjson", schema))
    url = urlparse(source)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if url.scheme == "nats":
        from .feeds.nats import JetStreamFeed

        parts = [p for p in url.path.split("/") if p]
        if len(parts) != 2:
            raise typer.BadParameter("nats source: nats://host:port/STREAM/SUBJECT")
        stream, subject = parts

        async def quiet(_error: Exception) -> None:
            return None

        return JetStreamFeed.connect(
            f"nats://{url.netloc}",
            stream=stream,
            subject=subject,
            durable=query.get("durable", f"lance-async-{stream}"),
            connect_options={
                "connect_timeout": 3,
                "max_reconnect_attempts": 2,
                "reconnect_time_wait": 0.5,
                "error_cb": quiet,
            },
        )
    if url.scheme in ("redis", "rediss"):
        from .feeds.redis import RedisStreamFeed

        stream = url.path.strip("/")
        if not stream:
            raise typer.BadParameter("redis source: redis://host:port/STREAM[?group=G&field=F]")
        return RedisStreamFeed.connect(
            f"{url.scheme}://{url.netloc}",
            stream=stream,
            group=query.get("group", "lance-async"),
            field=query.get("field", "data"),
        )
    from .feeds.files import FileFeed

    if url.scheme:
        raise typer.BadParameter(
            f"unsupported source {source!r}: use a file, '-', nats://host:port/STREAM/SUBJECT "
            "or redis://host:port/STREAM (for Kafka, use lance_async.feeds.KafkaFeed in Python)"
        )
    return FileFeed(source, format=fmt, schema=schema, follow=follow)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _check_columns(ds: AsyncDataset, names: Sequence[str], option: str) -> None:
    """Raise typer.BadParameter (exit 2) for a column the table does not have."""
    unknown = [n for n in names if n not in ds.schema.names]
    if unknown:
        raise typer.BadParameter(
            f"no column {unknown[0]!r} in the table (it has {', '.join(ds.schema.names)})",
            param_hint=f"'{option}'",
        )


def _format_of(path: str) -> str:
    try:
        return guess_format(path)
    except ValueError as exc:
        raise typer.BadParameter(f"{exc} (--format)") from None


async def _validate_file(source: str, fmt: str | None, schema: pa.Schema) -> int:
    """Decode the whole file once (it is replayable); count its rows."""
    rows = 0
    async for batch in file_source(source, format=fmt, schema=schema).open():
        rows += batch.num_rows
    return rows


@app.command(name="ingest")
def ingest_cmd(
    source: str = typer.Argument(
        ...,
        help="A file (.ndjson/.jsonl/.json, .csv, .arrow/.arrows/.ipc), '-' for stdin, "
        "nats://HOST:PORT/STREAM/SUBJECT[?durable=NAME] or "
        "redis://HOST:PORT/STREAM[?group=G&field=F].",
    ),
    table_uri: str = typer.Argument(
        ..., help="The Lance table; its MemWAL must be initialized (lance-async init-wal)."
    ),
    format: str | None = typer.Option(
        None,
        "--format",
        "-f",
        help="ndjson, csv or ipc (default: from the extension; stdin: ndjson).",
    ),
    shard: str | None = typer.Option(
        None,
        "--shard",
        help="Shard UUID. Default: derived from SOURCE, so ingesting the same source again "
        "reuses its shard (and replays its WAL); two ingests at once need two shards.",
    ),
    follow: bool = typer.Option(False, "--follow", help="Keep following a growing file."),
    validate: bool = typer.Option(
        True,
        "--validate/--no-validate",
        help="Decode a whole file once before writing, so a bad line writes nothing "
        "(--no-validate: rows before a bad line are written and acknowledged).",
    ),
    idle_timeout: float | None = typer.Option(
        None, "--idle-timeout", help="Stop after this many seconds without a message."
    ),
) -> None:
    """Stream SOURCE into TABLE_URI's MemWAL; ack each message once durable."""
    if format is not None and format not in ("ndjson", "csv", "ipc"):
        raise typer.BadParameter("--format must be ndjson, csv or ipc")
    if shard is not None:
        try:
            uuid.UUID(shard)
        except ValueError:
            raise typer.BadParameter(f"--shard must be a UUID, got {shard!r}") from None
    scheme = urlparse(source).scheme if "://" in source else ""
    if scheme and scheme not in ("nats", "redis", "rediss"):
        raise typer.BadParameter(
            f"unsupported source {source!r}: use a file, '-', nats://host:port/STREAM/SUBJECT "
            "or redis://host:port/STREAM (for Kafka, use lance_async.feeds.KafkaFeed in Python)"
        )
    is_file = source != "-" and not scheme
    if is_file and not os.path.exists(source):
        err.print(f"[red]error:[/red] no such file: {source}")
        raise typer.Exit(2)
    if is_file and format is None:
        format = _format_of(source)

    writes = _Writes()

    async def run() -> tuple[str, IngestStats]:
        ds = await open_dataset(table_uri)
        if await ds.mem_wal_index_details() is None:
            raise errors.InvalidInputError(
                f"{table_uri} has no MemWAL; initialize it first (AsyncDataset.initialize_mem_wal)"
            )
        shard_id = shard
        if shard_id is None:  # one shard per source, fresh for each MemWAL epoch
            epoch = await current_epoch(ds)
            shard_id = derived_shard_id(uuid.NAMESPACE_URL, f"lance-async-ingest:{source}", epoch)
        if is_file and validate:
            await _validate_file(source, format, ds.schema)
        feed_or_cm = _open_feed(source, format, ds.schema, follow)
        if hasattr(feed_or_cm, "__await__"):
            feed_or_cm = await feed_or_cm
        with _progress() as progress:
            task = progress.add_task(f"ingest into shard {shard_id[:8]}", total=None)

            def tick(stats: IngestStats) -> None:
                progress.update(task, completed=stats.rows)

            async with ds.mem_wal_writer(shard_id) as writer:
                feed: Feed = feed_or_cm
                writes.started = True
                try:
                    stats = await ingest(feed, writer, idle_timeout=idle_timeout, on_progress=tick)
                    return shard_id, stats
                finally:
                    with anyio.CancelScope(shield=True):
                        await feed.aclose()

    shard_id, stats = _run(run, writes)
    out.print(
        f"ingested {_count(stats.rows, 'row')} from "
        f"{_count(stats.messages, 'chunk' if is_file else 'message')} into "
        f"shard {shard_id} in {stats.seconds:.1f} s; "
        f"{_count(stats.dead_letters, 'dead letter')}"
    )


# -- merge ---------------------------------------------------------------------------


@app.command()
def merge(
    source: str = typer.Argument(..., help="A file (ndjson, csv, ipc)."),
    table_uri: str = typer.Argument(..., help="The Lance table."),
    on: list[str] = typer.Option(None, "--on", help="Join column(s); default the primary key."),
    format: str | None = typer.Option(None, "--format", "-f", help="ndjson, csv or ipc."),
) -> None:
    """Upsert SOURCE into TABLE_URI (conflicts are retried by re-reading the file)."""
    if not os.path.exists(source):
        err.print(f"[red]error:[/red] no such file: {source}")
        raise typer.Exit(2)

    async def run() -> Any:
        ds = await open_dataset(table_uri)
        keys = on or ds.primary_key
        if not keys:
            raise typer.BadParameter(
                "the table has no primary key; name the join column(s)", param_hint="'--on'"
            )
        _check_columns(ds, keys, "--on")
        schema = ds.schema
        fmt = format or _format_of(source)
        if fmt in ("ndjson", "csv"):
            src = file_source(source, format=fmt, schema=schema)
        else:
            src = file_source(source, format=fmt)
        with _progress() as progress:
            progress.add_task(f"merge {Path(source).name}", total=None)
            return await (
                ds.merge_insert(keys)
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(src)
            )

    result = _run(run, _Writes())  # a merge commits all or nothing
    out.print(
        f"inserted {result.num_inserted_rows:,}, updated {result.num_updated_rows:,}, "
        f"deleted {result.num_deleted_rows:,} rows in {result.num_attempts} attempt(s); "
        f"version {result.version}"
    )


@app.command(name="init-wal")
def init_wal(
    table_uri: str = typer.Argument(..., help="The Lance table."),
    bucket_column: str | None = typer.Option(None, "--bucket-column", help="Hash-bucket shards."),
    num_buckets: int | None = typer.Option(None, "--num-buckets", help="With --bucket-column."),
    identity_column: str | None = typer.Option(
        None, "--identity-column", help="A shard per value."
    ),
    no_durable: bool = typer.Option(False, "--no-durable", help="Writers ack before fsync."),
) -> None:
    """Initialize TABLE_URI's MemWAL (once), so rows can be ingested into it."""
    if (bucket_column is None) != (num_buckets is None):
        raise typer.BadParameter(
            "--bucket-column and --num-buckets go together", param_hint="'--num-buckets'"
        )
    if num_buckets is not None and num_buckets < 1:
        raise typer.BadParameter(f"must be >= 1, got {num_buckets}", param_hint="'--num-buckets'")

    async def run() -> dict[str, Any] | None:
        ds = await open_dataset(table_uri)
        if bucket_column:
            _check_columns(ds, [bucket_column], "--bucket-column")
        if identity_column:
            _check_columns(ds, [identity_column], "--identity-column")
        options: dict[str, Any] = {}
        if bucket_column or num_buckets:
            options.update(bucket_column=bucket_column, num_buckets=num_buckets)
        if identity_column:
            options["identity_column"] = identity_column
        if no_durable:
            options["durable_write"] = False
        await ds.initialize_mem_wal(**options)
        return await ds.mem_wal_index_details()

    details = _run(run) or {}
    specs = details.get("sharding_specs") or []
    kind = specs[0]["fields"][0]["transform"] if specs else "manual shards (--shard per writer)"
    out.print(f"MemWAL initialized on {table_uri}: {kind}")


@app.command()
def compact(
    table_uri: str = typer.Argument(..., help="The Lance table."),
) -> None:
    """Merge the MemWAL's flushed generations into TABLE_URI's base table."""

    async def run() -> Any:
        ds = await open_dataset(table_uri)
        with _progress() as progress:
            progress.add_task("compact", total=None)
            return await ds.compact_mem_wal()

    result = _run(run)
    gens = sum(len(g) for g in result.generations.values())
    out.print(
        f"compacted {_count(gens, 'generation')} from {_count(len(result.generations), 'shard')}: "
        f"{result.rows_upserted:,} rows upserted, {result.rows_deleted:,} deleted; "
        f"version {result.version}"
    )


# -- scan and info --------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


@app.command()
def scan(
    table_uri: str = typer.Argument(..., help="The Lance table."),
    filter: str | None = typer.Option(None, "--filter", help="Lance SQL filter."),
    columns: str | None = typer.Option(None, "--columns", help="Comma-separated columns."),
    limit: int | None = typer.Option(None, "--limit", help="At most this many rows."),
    format: str | None = typer.Option(
        None,
        "--format",
        "-f",
        help="table, ndjson or ipc (default: table on a terminal, ndjson in a pipe).",
    ),
    lsm: bool = typer.Option(False, "--lsm", help="Include flushed MemWAL generations."),
) -> None:
    """Stream TABLE_URI's rows to standard output."""
    fmt = format or ("table" if sys.stdout.isatty() else "ndjson")
    if fmt not in ("table", "ndjson", "ipc"):
        raise typer.BadParameter("--format must be table, ndjson or ipc")
    if limit is not None and limit < 0:
        raise typer.BadParameter(f"must be >= 0, got {limit}", param_hint="'--limit'")
    cols = [c.strip() for c in columns.split(",")] if columns else None

    async def run() -> _Preview | None:
        ds = await open_dataset(table_uri)
        if cols:
            _check_columns(ds, cols, "--columns")
        if lsm:
            stream = ds.lsm_scan(columns=cols, filter=filter, limit=limit)
        else:
            stream = ds.scan(columns=cols, filter=filter, limit=limit)
        async with stream:
            try:
                await stream.open()
            except errors.InvalidInputError as exc:
                if filter is None:
                    raise
                raise typer.BadParameter(str(exc), param_hint="'--filter'") from None
            if fmt == "ipc":
                await _write_ipc(stream)
            elif fmt == "ndjson":
                await _write_ndjson(stream)
            else:
                return await _preview(stream)
        return None

    try:
        preview = _run(run)
        if preview is not None:
            _print_preview(preview)
    except BrokenPipeError:  # `| head` closed the pipe: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _ndjson_out(batch: pa.RecordBatch) -> None:
    """Write a batch to standard output as NDJSON (blocking: encoding and write)."""
    if batch.num_rows:
        lines = [json.dumps(r, default=_json_default) for r in batch.to_pylist()]
        sys.stdout.write("\n".join(lines) + "\n")


async def _write_ndjson(stream: Any) -> None:
    limiter = stream_limiter()
    async for batch in stream:
        await run_sync(partial(_ndjson_out, batch), limiter=limiter)
    await run_sync(sys.stdout.flush, limiter=limiter)


async def _write_ipc(stream: Any) -> None:
    """The stream as an Arrow IPC stream on standard output. Its end-of-stream
    marker is written only after the last batch, so a scan that fails half
    way leaves a stream its reader sees as cut short."""
    sink = sys.stdout.buffer
    limiter = stream_limiter()
    writer = await run_sync(partial(pa.ipc.new_stream, sink, stream.schema), limiter=limiter)
    async for batch in stream:
        await run_sync(partial(writer.write_batch, batch), limiter=limiter)

    def close() -> None:
        writer.close()
        sink.flush()

    await run_sync(close, limiter=limiter)


@dataclass
class _Preview:
    """The first rows of a scan, for the ``table`` format."""

    names: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0


async def _preview(stream: Any, most: int = 1_000) -> _Preview:
    """Up to ``most`` rows as Python values (converted on a worker thread)."""
    preview = _Preview(list(stream.schema.names))
    async for batch in stream:
        preview.total += batch.num_rows
        room = most - len(preview.rows)
        if room > 0:
            part = batch.slice(0, room)
            preview.rows.extend(await run_sync(part.to_pylist, limiter=stream_limiter()))
    return preview


def _print_preview(preview: _Preview) -> None:
    """A table when narrow, one block per row when wide (after the event loop ended)."""
    names, rows = preview.names, preview.rows
    if len(names) <= 8:
        table = Table(*names)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row.values()))
        out.print(table)
    else:
        width = max(len(n) for n in names)
        for i, row in enumerate(rows):
            out.print(f"[bold]-- row {i + 1}[/bold]")
            for name, value in row.items():
                out.print(f"{name:>{width}}  {'' if value is None else value}", highlight=False)
    if preview.total > len(rows):
        err.print(f"(showing {len(rows):,} of {preview.total:,} rows; use --format ndjson for all)")


async def _info(ds: AsyncDataset) -> dict[str, Any]:
    versions = await ds.versions()
    details = await ds.mem_wal_index_details()
    snaps = await ds.shard_snapshots()
    return {
        "uri": ds.uri,
        "version": ds.version,
        "versions": len(versions),
        "rows": await ds.count_rows(),
        "schema": [
            f"{f.name}: {f.type}{' (key)' if f.name in ds.primary_key else ''}" for f in ds.schema
        ],
        "mem_wal": details is not None,
        "shards": [
            {
                "shard_id": s.shard_id,
                "current_generation": s.current_generation,
                "flushed_generations": [g for g, _ in s.sstables],
                "compacted_through": s.compacted_generation,
            }
            for s in snaps
        ],
    }


@app.command()
def info(
    table_uri: str = typer.Argument(..., help="The Lance table."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Versions, rows, MemWAL shards and generations of TABLE_URI."""

    async def run() -> dict[str, Any]:
        return await _info(await open_dataset(table_uri))

    data = _run(run)
    if as_json:
        out.print_json(json.dumps(data))
        return
    out.print(f"[bold]{data['uri']}[/bold]  version {data['version']} of {data['versions']}")
    out.print(f"rows: {data['rows']:,}")
    out.print("schema: " + ", ".join(data["schema"]))
    if not data["mem_wal"]:
        out.print("MemWAL: not initialized")
        return
    table = Table("shard", "current generation", "flushed (not compacted)", "compacted through")
    table.columns[0].no_wrap = True
    table.columns[0].min_width = 36
    for s in data["shards"]:
        table.add_row(
            s["shard_id"],
            str(s["current_generation"]),
            ", ".join(map(str, s["flushed_generations"])) or "-",
            str(s["compacted_through"]),
        )
    out.print(table)


@app.command()
def serve(
    root: str = typer.Option(".", "--root", help="Directory of <name>.lance tables."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    allow_raw_sql: bool = typer.Option(False, "--allow-raw-sql", help="Accept raw SQL filters."),
    max_body_bytes: int | None = typer.Option(None, "--max-body-bytes"),
    spool_dir: str | None = typer.Option(None, "--spool-dir", help="Where replay spools go."),
) -> None:
    """Serve a directory of Lance tables over HTTP (the 'fastapi' extra)."""
    try:
        from .web.server import main as serve_main
    except ImportError as exc:
        err.print(f"[red]error:[/red] {exc}; pip install 'lance-async[fastapi]'")
        raise typer.Exit(2) from None
    serve_main(
        host,
        port,
        Path(root),
        allow_raw_sql=allow_raw_sql,
        max_body_bytes=max_body_bytes,
        spool_dir=spool_dir,
    )


def main() -> None:
    """Entry point of the ``lance-async`` command."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
