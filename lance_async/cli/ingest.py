"""The ``ingest`` command: a file, stdin, NATS JetStream or Redis Streams into the MemWAL."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

import anyio
import typer

from .common import (
    COMMIT,
    MIN_PUT_INTERVAL,
    STORAGE_OPTION,
    Progress,
    Writes,
    app,
    count,
    err,
    file_size,
    number,
    open_table,
    out,
    require_mem_wal,
    run_command,
    writer_options,
)
from .deadletters import DEAD_LETTER, check_dead_letter, open_dead_letter
from .inputs import ROWS_FORMAT, check_format, check_source, format_of, with_csv_line
from .worker import exclusive_ingest

if TYPE_CHECKING:
    import pyarrow as pa

    from ..feeds import Feed, IngestStats

T = TypeVar("T")

#: Exit status of an ingest that stopped idle while its feed still reported
#: messages it could not fetch (held by another consumer, unacknowledged).
NO_PROGRESS = 3


async def _close_shielded(feed: Feed) -> None:
    """Close ``feed``, even while the run is being cancelled."""
    with anyio.CancelScope(shield=True):
        await feed.aclose()


async def _outstanding(feed: Feed) -> int | None:
    """The feed's backlog after an idle stop, when it can tell (brokers)."""
    backlog = getattr(feed, "backlog", None)
    if backlog is None or feed.exhausted:
        return None
    try:
        value: int | None = await backlog()
    except Exception:  # an unanswerable backlog is not the run's failure
        return None
    return value


async def _validate_file(source: str, fmt: str | None, schema: pa.Schema) -> int:
    """Decode the whole file once (it is replayable); count its rows."""
    from ..sources.files import file_source

    rows = 0
    size = await file_size(source)
    with Progress("check", size, unit="bytes") as progress:
        src = file_source(source, format=fmt, schema=schema, on_read=progress.update)
        try:
            async for batch in src.open():
                rows += batch.num_rows
        except Exception as exc:
            located = await with_csv_line(exc, source, os.path.basename(source), fmt, schema)
            if located is exc:
                raise
            raise located from exc
    return rows


class _GracefulStop:
    """SIGINT and SIGTERM as a clean stop of ``ingest``, as ``worker`` stops on SIGTERM.

    The first signal stops reading: the ingest's ``stop`` event is set, a
    fetch in progress ends within its timeout, the micro-batches sent are
    acknowledged as their rows become durable (offsets committed for
    durable rows only), the writer flushes and closes, and the command
    prints its summary and exits 0. During start-up (before the first row
    could be written) it ends the start-up instead. A second signal
    interrupts at once: nothing more is acknowledged, exit 130.
    """

    def __init__(self) -> None:
        self.ingesting = False
        self.signal_name: str | None = None
        self._early: list[int] = []
        self._previous: Any = None

    def install_early(self) -> None:
        """Keep a SIGTERM that comes before the event loop runs (imports,
        options): its default action would kill the process (143)."""
        self._previous = signal.signal(
            signal.SIGTERM, lambda signum, _f: self._early.append(signum)
        )

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    async def run(self, body: Callable[[anyio.Event], Awaitable[T]]) -> T | None:
        """``await body(stop)`` with the signals watched; None when a signal
        ended the start-up."""
        stop = anyio.Event()
        interrupted = False
        result: T | None = None
        async with anyio.create_task_group() as tg:
            startup = anyio.CancelScope()

            def received(signum: int) -> None:
                nonlocal interrupted
                name = signal.Signals(signum).name
                if stop.is_set():  # the second one: at once
                    interrupted = True
                    tg.cancel_scope.cancel()
                    return
                self.signal_name = name
                stop.set()
                if not self.ingesting:
                    startup.cancel()
                    return
                err.print(
                    f"ingest: {name}: stopping (no more reads; what is in flight is written "
                    "and acknowledged; a second signal stops at once)",
                    markup=False,
                )

            async def watch() -> None:
                try:
                    receiver = anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)
                    with receiver as signals:
                        for signum in self._early:
                            received(signum)
                        async for signum in signals:
                            received(signum)
                except (ValueError, RuntimeError, NotImplementedError):
                    return  # not the main thread (an embedding app): its own signals

            tg.start_soon(watch)
            with startup:
                result = await body(stop)
            tg.cancel_scope.cancel()
        if interrupted:
            raise KeyboardInterrupt
        return result


@app.command(name="ingest")
def ingest_cmd(
    source: str = typer.Argument(
        ...,
        metavar="SOURCE",
        help="A file (.ndjson/.jsonl, .json, .csv, .arrow/.arrows/.ipc), '-' for stdin, "
        "nats://HOST:PORT/STREAM/SUBJECT[?durable=NAME&ack_wait=S&max_ack_pending=N] or "
        "redis://HOST:PORT/STREAM[?group=G&consumer=NAME&min_idle=S&field=F]. "
        "Exit status 3: stopped idle with messages out of reach.",
    ),
    table_uri: str = typer.Argument(
        ...,
        metavar="TABLE_URI",
        help="The Lance table; its MemWAL must be initialized (lance-async init-wal).",
    ),
    format: str | None = ROWS_FORMAT,
    shard: str | None = typer.Option(
        None,
        "--shard",
        metavar="UUID",
        help="Write only this shard (UUID); rows of other shards are refused. Default: every "
        "row goes to its own shard by the table's sharding spec (a table with manual shards: "
        "to lance_async's one default shard).",
    ),
    follow: bool = typer.Option(False, "--follow", help="Keep following a growing file."),
    validate: bool = typer.Option(
        True,
        "--validate/--no-validate",
        help="Decode a whole file once before writing, so a bad line writes nothing "
        "(--no-validate: rows before a bad line are written and acknowledged).",
    ),
    idle_timeout: float | None = typer.Option(
        None,
        "--idle-timeout",
        metavar="SECONDS",
        help="Stop after this many seconds without a message.",
        callback=number("--idle-timeout", maximum=1e9),
    ),
    dead_letter: str | None = DEAD_LETTER,
    max_bad: int = typer.Option(
        0,
        "--max-bad",
        metavar="N",
        help="Bad messages set aside in --dead-letter before the next one stops the ingest "
        "(0: the first stops it, nothing set aside).",
        callback=number("--max-bad"),
    ),
    storage_option: list[str] | None = STORAGE_OPTION,
    commit: str | None = COMMIT,
    min_put_interval: float | None = MIN_PUT_INTERVAL,
) -> None:
    """Stream SOURCE into TABLE_URI's MemWAL; ack each message once durable.

    A message that cannot be decoded stops the ingest (the messages before
    it are written and acknowledged); with --dead-letter FILE|URL --max-bad N,
    up to N bad messages are recorded there (a file, or a Redis stream, a
    NATS subject, a Kafka topic) and acknowledged instead. SIGINT or
    SIGTERM stops it cleanly (what is in flight written and acknowledged,
    the summary, exit 0); a second one at once (130).
    """
    check_format(format)
    options = writer_options(commit, min_put_interval)
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
    if (dead_letter is not None or max_bad) and not scheme:
        raise typer.BadParameter(
            "bad messages are set aside for broker feeds (nats://, redis://); a file or "
            "standard input is decoded in chunks, and a bad line stops the ingest: fix it "
            "and ingest again",
            param_hint="'--dead-letter'",
        )
    if dead_letter is not None and not max_bad:
        raise typer.BadParameter(
            "give --max-bad N too: how many bad messages to set aside before one stops the ingest",
            param_hint="'--dead-letter'",
        )
    if max_bad and dead_letter is None:
        raise typer.BadParameter(
            "give --dead-letter FILE|URL too: where the bad messages go", param_hint="'--max-bad'"
        )
    check_dead_letter(dead_letter)
    if not scheme:
        check_source(source)
    if is_file and format is None:
        format = format_of(source)

    writes = Writes()
    # SIGINT and SIGTERM stop the ingest gracefully (see _GracefulStop); one
    # that comes while the command still imports is kept for it
    graceful = _GracefulStop()
    graceful.install_early()

    async def run() -> tuple[str, IngestStats, int | None] | None:
        return await graceful.run(body)

    async def body(stop: anyio.Event) -> tuple[str, IngestStats, int | None]:
        from ..feeds import ingest
        from ..memwal.compactor import CompactionPolicy, Compactor
        from .feeds import open_feed

        ds = await open_table(table_uri, storage_option)
        await require_mem_wal(ds, table_uri)
        sharding = await ds.sharding()
        shard_id = shard
        if shard_id is None and not sharding.sharded:
            shard_id = sharding.default_shard()
        target = "every shard by key" if shard_id is None else f"shard {shard_id}"
        total = None
        if is_file and validate:
            total = await _validate_file(source, format, ds.schema)
        feed_or_cm = open_feed(source, format, ds.schema, follow)
        if hasattr(feed_or_cm, "__await__"):
            feed_or_cm = await feed_or_cm
        with Progress("ingest", None if follow else total, unit="rows") as progress:

            def tick(stats: IngestStats) -> None:
                progress.update(stats.rows)

            feed: Feed = feed_or_cm
            async with contextlib.AsyncExitStack() as stack:
                # the dead-letter sink first: a broker that is not there writes nothing
                stack.push_async_callback(_close_shielded, feed)
                hook = await open_dead_letter(dead_letter, max_bad, source)
                if hook is not None:
                    await stack.enter_async_context(hook)
                writer = ds.mem_wal_writer(shard_id, **options)
                await stack.enter_async_context(writer)
                await stack.enter_async_context(Compactor(ds, CompactionPolicy()))
                writes.started = True
                gc.freeze()  # start-up objects out of the collector's way (docs/memwal.md)
                graceful.ingesting = True
                stats = await ingest(
                    feed,
                    writer,
                    idle_timeout=idle_timeout,
                    on_progress=tick,
                    dead_letter=hook,
                    stop=stop,
                )
                outstanding = None if stop.is_set() else await _outstanding(feed)
                return target, stats, outstanding

    # one ingest per table and broker: a second refuses (exit 2) before it fences anything
    try:
        ran = run_command(exclusive_ingest(source, table_uri, run), writes)
    finally:
        graceful.restore()
    if ran is None:  # stopped by a signal before the first row could be written
        err.print(
            f"ingest: stopped by {graceful.signal_name} during start-up; nothing was written",
            markup=False,
        )
        return
    target, stats, outstanding = ran
    if graceful.signal_name is not None:
        err.print(
            f"ingest: stopped by {graceful.signal_name}: every row acknowledged is durable",
            markup=False,
        )
    out.print(
        f"ingested {count(stats.rows, 'row')} from "
        f"{count(stats.messages, 'chunk' if is_file else 'message')} into "
        f"{target} in {stats.seconds:.1f} s; "
        f"{count(stats.dead_letters, 'dead letter')}",
        markup=False,
    )
    if source == "-" and stats.messages == 0 and stats.rows == 0:
        err.print("standard input was empty: nothing was written", markup=False)
    if outstanding:
        err.print(
            f"[red]stopped with {count(outstanding, 'message')} outstanding[/red]: the feed "
            "holds messages this run could not fetch (delivered to another consumer and "
            "not yet acknowledged?); exit status 3"
        )
        raise typer.Exit(NO_PROGRESS)
