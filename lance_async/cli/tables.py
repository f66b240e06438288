"""The table commands: ``merge``, ``init-wal``, ``compact``, ``info``, ``check``."""

from __future__ import annotations

import json
import signal
from collections.abc import Awaitable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import typer

from .common import (
    STORAGE_OPTION,
    Progress,
    Writes,
    app,
    check_columns,
    count,
    err,
    escape,
    file_size,
    open_table,
    out,
    require_mem_wal,
    run_command,
)
from .create import spooled_stdin
from .inputs import (
    ROWS_FORMAT,
    check_format,
    check_source,
    format_of,
    source_schema,
    with_csv_line,
)

if TYPE_CHECKING:
    from ..dataset import AsyncDataset
    from ..memwal.check import ShardCheck
    from ..memwal.sharding import Sharding
    from ..merge import MergeResult

T = TypeVar("T")
_DEFAULT_NUM_BUCKETS = 4  # memwal.sharding.DEFAULT_NUM_BUCKETS (a test keeps them equal)


def non_key_reason(on: list[str], key: list[str]) -> str:
    """Why merging on columns other than the primary key is refused by default."""
    return (
        f"{', '.join(on)} is not the table's primary key ({', '.join(key)}): every table row "
        "whose value matches a file row would be overwritten with that whole row, its key "
        "included, so rows sharing a value end up with one key; pass --allow-non-key if that "
        "is what you want"
    )


@app.command()
def merge(
    source: str = typer.Argument(
        ...,
        metavar="SOURCE",
        help="A file (.ndjson/.jsonl, .json, .csv, .arrow/.arrows/.ipc), or '-' for stdin.",
    ),
    table_uri: str = typer.Argument(..., metavar="TABLE_URI", help="The Lance table."),
    on: list[str] = typer.Option(
        None, "--on", metavar="COLUMN", help="Join column(s); default the primary key."
    ),
    allow_non_key: bool = typer.Option(
        False,
        "--allow-non-key",
        help="Join on --on columns that are not the primary key (matched rows are overwritten, "
        "key included).",
    ),
    base_table: bool = typer.Option(
        False,
        "--base-table",
        help="On a table with a MemWAL, merge into the base table instead of the MemWAL "
        "(refused while the MemWAL holds any of the file's keys: compact first).",
    ),
    format: str | None = ROWS_FORMAT,
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Upsert SOURCE into TABLE_URI: matched rows are updated, the others inserted.

    The merge commits all or nothing; a conflict with another writer is
    retried by reading the file again (standard input is first copied to a
    temporary file, so it can be read again). Columns the file lacks keep
    their stored values in updated rows and are null in inserted ones. A
    table with a MemWAL takes the merge through it (compact folds it into
    the base table), unless --base-table. Ctrl-C or SIGTERM before the
    commit stops the merge and commits nothing (exit 130); once committed,
    the version is printed.
    """
    check_format(format)
    check_source(source)
    fmt = format or ("ndjson" if source == "-" else format_of(source))
    interrupted: list[int] = []

    async def run() -> MergeResult | None:
        from .._threads import run_sync
        from ..sources.files import file_source

        ds = await open_table(table_uri, storage_option)
        keys = on or ds.primary_key
        if not keys:
            raise typer.BadParameter(
                "the table has no primary key; name the join column(s)", param_hint="'--on'"
            )
        check_columns(ds, keys, "--on")
        if on and ds.primary_key and sorted(on) != sorted(ds.primary_key) and not allow_non_key:
            raise typer.BadParameter(non_key_reason(on, ds.primary_key), param_hint="'--on'")
        async with spooled_stdin(source) as path:
            size = await file_size(path)
            label = "stdin" if source == "-" else Path(source).name
            try:
                schema = await run_sync(partial(source_schema, path, fmt, ds.schema))
            except Exception as exc:  # a CSV header that cannot be read: said at its line
                located = await with_csv_line(exc, path, label, fmt, ds.schema)
                if located is exc:
                    raise
                raise located from exc
            builder = ds.merge_insert(keys).when_matched_update_all().when_not_matched_insert_all()
            if base_table:
                builder = builder.via_base_table()
            with Progress(f"merge {label}", size, unit="bytes") as progress:
                options: dict[str, Any] = {"on_read": progress.update}
                if schema is not None:
                    options["schema"] = schema
                src = file_source(path, format=fmt, **options)
                try:
                    done = await until_interrupted(builder.execute(src), interrupted)
                except Exception as exc:
                    located = await with_csv_line(exc, path, label, fmt, ds.schema)
                    if located is exc:
                        raise
                    raise located from exc
        # interrupted after the commit (or the MemWAL's put) began: it ended, and is kept
        return done if done is not None else builder.last_result

    result = run_command(run, Writes())  # a merge commits all or nothing
    if result is None:
        err.print("interrupted before the commit: nothing was committed", markup=False)
        raise typer.Exit(130)
    if not result.committed:
        what = "standard input" if source == "-" else source
        out.print(f"nothing to merge: {what} holds no rows; nothing was committed", markup=False)
        return
    if result.mem_wal is not None:
        out.print(
            f"upserted {count(result.mem_wal.rows, 'row')} through the MemWAL (durable; LSM reads "
            f"see them now, the base table after lance-async compact {table_uri}); "
            f"no new version (version {result.version})",
            markup=False,
        )
        return
    out.print(
        f"inserted {result.num_inserted_rows:,}, updated {result.num_updated_rows:,}, "
        f"deleted {result.num_deleted_rows:,} rows in {result.num_attempts} attempt(s); "
        f"version {result.version}",
        markup=False,
    )


async def until_interrupted(work: Awaitable[T], interrupted: list[int]) -> T | None:
    """``await work``, unless SIGINT or SIGTERM comes first: then ``work`` is
    cancelled (a merge stops reading and commits nothing; a commit in flight
    ends first, and is kept by the builder), the signal is appended to
    ``interrupted`` and None returned."""
    from .._loop import unwrap_groups

    result: T | None = None
    with unwrap_groups():  # the merge's own error, not a group of one
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        interrupted.append(signum)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch)
            result = await work
            tg.cancel_scope.cancel()
    return result


@app.command(name="init-wal")
def init_wal(
    table_uri: str = typer.Argument(..., metavar="TABLE_URI", help="The Lance table."),
    bucket_column: str | None = typer.Option(
        None,
        "--bucket-column",
        metavar="COLUMN",
        help="Hash-bucket shards on this column (default: the key).",
    ),
    num_buckets: int | None = typer.Option(
        None,
        "--num-buckets",
        metavar="N",
        help=f"Buckets, one shard each (default {_DEFAULT_NUM_BUCKETS}).",
    ),
    identity_column: str | None = typer.Option(
        None, "--identity-column", metavar="COLUMN", help="A shard per value of this column."
    ),
    unsharded: bool = typer.Option(False, "--unsharded", help="One shard for every row."),
    manual_shards: bool = typer.Option(
        False, "--manual-shards", help="No sharding spec: writers name their shards."
    ),
    no_durable: bool = typer.Option(False, "--no-durable", help="Writers ack before fsync."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Initialize TABLE_URI's MemWAL (once), so rows can be ingested into it.

    By default the MemWAL is bucket-sharded on the table's primary key, so
    every key has one shard whoever writes it.
    """
    modes = [
        name
        for name, on in (
            ("--bucket-column/--num-buckets", bucket_column is not None or num_buckets is not None),
            ("--identity-column", identity_column is not None),
            ("--unsharded", unsharded),
            ("--manual-shards", manual_shards),
        )
        if on
    ]
    if len(modes) > 1:
        raise typer.BadParameter(f"choose one of {', '.join(modes)}", param_hint=f"'{modes[1]}'")
    if num_buckets is not None and not 1 <= num_buckets <= 1024:
        raise typer.BadParameter(
            f"must be in 1..1024, got {num_buckets}", param_hint="'--num-buckets'"
        )

    async def run() -> Sharding:
        from .. import errors
        from ..memwal.sharding import DEFAULT_NUM_BUCKETS

        ds = await open_table(table_uri, storage_option)
        if bucket_column:
            check_columns(ds, [bucket_column], "--bucket-column")
        if identity_column:
            check_columns(ds, [identity_column], "--identity-column")
        if await ds.mem_wal_index_details() is not None:
            now = describe_sharding(await ds.sharding())
            raise errors.InvalidInputError(
                f"the MemWAL of {table_uri} is already initialized ({now}); "
                f"see it with: lance-async info {table_uri}"
            )
        if not ds.primary_key:
            raise errors.InvalidInputError(
                f"{table_uri} has no primary key, and a MemWAL needs one: create the table "
                "with one (lance-async create --key COLUMN)"
            )
        options: dict[str, Any] = {}
        if bucket_column is not None or num_buckets is not None:
            column = bucket_column or ds.primary_key[0]
            options.update(bucket_column=column, num_buckets=num_buckets or DEFAULT_NUM_BUCKETS)
        if identity_column:
            options["identity_column"] = identity_column
        if unsharded:
            options["unsharded"] = True
        if no_durable:
            options["durable_write"] = False
        await ds.initialize_mem_wal(manual_shards=manual_shards, **options)
        return await ds.sharding()

    sharding = run_command(run)
    out.print(f"MemWAL initialized on {table_uri}: {describe_sharding(sharding)}", markup=False)


def describe_sharding(sharding: Sharding) -> str:
    """One line on how rows map to shards."""
    if sharding.kind == "bucket":
        return f"bucket sharding on {sharding.column!r} into {sharding.num_buckets} shards"
    if sharding.kind == "identity":
        return f"a shard per value of {sharding.column!r}"
    if sharding.kind == "unsharded":
        return "one shard"
    return "manual shards (each writer names its shard; keep every key in one)"


@app.command()
def compact(
    table_uri: str = typer.Argument(..., metavar="TABLE_URI", help="The Lance table."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Merge the MemWAL's flushed generations into TABLE_URI's base table."""

    async def run() -> Any:
        ds = await open_table(table_uri, storage_option)
        await require_mem_wal(ds, table_uri)
        snaps = await ds.lsm.snapshots()
        gens = sum(len(s.sstables) for s in snaps)
        with Progress("compact", gens, unit="generations") as progress:
            result = await ds.compact_mem_wal()
            progress.update(sum(len(g) for g in result.generations.values()))
            return result

    result = run_command(run)
    gens = sum(len(g) for g in result.generations.values())
    out.print(
        f"compacted {count(gens, 'generation')} from {count(len(result.generations), 'shard')}: "
        f"{result.rows_upserted:,} rows upserted, {result.rows_deleted:,} deleted; "
        f"version {result.version}",
        markup=False,
    )


async def table_info(ds: AsyncDataset) -> dict[str, Any]:
    """What ``info`` prints: versions, rows, schema and the MemWAL's figures.

    Rows are counted in three places: the base table, the flushed MemWAL
    generations not compacted yet (from the shard manifests), and the WAL
    tails: durable rows no generation holds yet, which every LSM read shows
    already. ``lsm_rows`` is what an LSM scan sees: the newest row per key
    over every level (counted only when the MemWAL holds rows).
    """
    from .._threads import run_sync
    from ..lsm.manifest import read_shard_manifest

    versions = await ds.versions()
    details = await ds.mem_wal_index_details()
    base_rows = await ds.count_rows()
    data: dict[str, Any] = {
        "uri": ds.uri,
        "version": ds.version,
        "versions": len(versions),
        "rows": base_rows,
        "base_rows": base_rows,
        "primary_key": list(ds.primary_key),
        "schema": [
            f"{f.name}: {f.type}{' (key)' if f.name in ds.primary_key else ''}" for f in ds.schema
        ],
        "mem_wal": details is not None,
        "sharding": None,
        "shards": [],
    }
    if details is None:
        return data
    data["sharding"] = describe_sharding(await ds.sharding())
    storage = ds.storage_options

    def figures(shard_id: str, flushed: list[int]) -> int:
        manifest = read_shard_manifest(ds.uri, shard_id, storage)
        rows = {e.generation: e.rows or 0 for e in manifest.sstables} if manifest else {}
        return sum(rows.get(g, 0) for g in flushed)

    tails = await ds.lsm.unflushed_rows()
    for snap in await ds.lsm.snapshots():
        flushed = [g for g, _ in snap.sstables]
        flushed_rows = await run_sync(partial(figures, snap.shard_id, flushed))
        unflushed = tails.get(snap.shard_id, 0)
        data["shards"].append(
            {
                "shard_id": snap.shard_id,
                "current_generation": snap.current_generation,
                "flushed_generations": flushed,
                "flushed_rows": flushed_rows,
                "unflushed_rows": unflushed,
                "compacted_through": snap.compacted_generation,
            }
        )
    data["flushed_rows"] = sum(s["flushed_rows"] for s in data["shards"])
    data["unflushed_rows"] = sum(s["unflushed_rows"] for s in data["shards"])
    data["generations"] = sum(len(s["flushed_generations"]) for s in data["shards"])
    if (data["generations"] or data["unflushed_rows"]) and ds.primary_key:
        lsm = await ds.lsm.scan(columns=list(ds.primary_key)).to_table()
        data["lsm_rows"] = lsm.num_rows
    else:
        data["lsm_rows"] = base_rows
    return data


@app.command()
def info(
    table_uri: str = typer.Argument(..., metavar="TABLE_URI", help="The Lance table."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Versions, rows, schema and the MemWAL (shards, generations, rows) of TABLE_URI."""

    async def run() -> dict[str, Any]:
        return await table_info(await open_table(table_uri, storage_option))

    data = run_command(run)
    if as_json:
        out.print_json(json.dumps(data))
        return
    out.print(
        f"[bold]{escape(data['uri'])}[/bold]  version {data['version']} of {data['versions']}"
    )
    out.print("schema: " + ", ".join(data["schema"]), highlight=False, markup=False)
    if not data["mem_wal"]:
        out.print(f"rows: {data['rows']:,}")
        out.print(f"MemWAL: not initialized (lance-async init-wal {table_uri})", markup=False)
        return
    out.print(
        f"rows: {data['base_rows']:,} in the base table, {data['flushed_rows']:,} in "
        f"{count(data['generations'], 'flushed generation')}, {data['unflushed_rows']:,} "
        f"durable in the WAL, not flushed yet; an LSM scan sees {data['lsm_rows']:,} "
        "(newest per key, every level)"
    )
    out.print(f"MemWAL: {data['sharding']}, {count(len(data['shards']), 'shard')}", markup=False)
    from rich.table import Table

    table = Table("shard", "gen", "flushed gens", "flushed rows", "unflushed")
    table.columns[0].no_wrap = True
    table.columns[0].min_width = 36
    for s in data["shards"]:
        table.add_row(
            s["shard_id"],
            str(s["current_generation"]),
            ", ".join(map(str, s["flushed_generations"])) or "-",
            f"{s['flushed_rows']:,}",
            f"{s['unflushed_rows']:,}",
        )
    out.print(table)


@app.command()
def check(
    table_uri: str = typer.Argument(..., metavar="TABLE_URI", help="The Lance table."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Find keys in more than one MemWAL shard (exit 1 when there are any).

    Reads the flushed, not yet compacted generations and the WAL tails of
    every shard.
    """

    async def run() -> tuple[ShardCheck, int]:
        ds = await open_table(table_uri, storage_option)
        await require_mem_wal(ds, table_uri)
        found = await ds.check_shards()
        return found, sum((await ds.lsm.unflushed_rows()).values())

    report, unflushed = run_command(run)
    if as_json:
        import dataclasses

        data = dataclasses.asdict(report) | {"ok": report.ok, "unflushed_rows": unflushed}
        out.print_json(json.dumps(data, default=str))
    else:
        out.print(
            f"{report.shards} shard(s), {report.generations} flushed generation(s) not yet "
            f"compacted, {report.rows:,} rows read in them and in the WAL tails "
            f"({unflushed:,} of them not flushed yet; {report.sharding} sharding): "
            f"{report.split_keys:,} key(s) in more than one shard, "
            f"{report.misplaced_keys:,} in the wrong shard",
            markup=False,
        )
        # what check reads is what the files hold; info's figures come from elsewhere
        err.print(
            "note: these are the rows stored in the flushed generations and the WAL tails "
            "(deletions included); info's figures can differ (its generation counts are the "
            "shard manifests', its LSM figure the newest row per key); the base table is "
            "not checked",
            markup=False,
        )
        for example in report.examples:
            where = ", ".join(example["shards"])
            expected = f" (belongs to {example['expected']})" if example["expected"] else ""
            out.print(f"  key {example['key']!r}: shard {where}{expected}", markup=False)
        if report.compacted_shards:
            err.print(
                f"note: {report.compacted_shards} shard(s) have generations compacted already; "
                "their rows are in the base table and were not checked"
            )
    if not report.ok:
        raise typer.Exit(1)
