"""The table commands: ``merge``, ``init-wal``, ``compact``, ``info``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from ..dataset import AsyncDataset
from ..memwal.check import ShardCheck
from ..memwal.sharding import DEFAULT_NUM_BUCKETS, Sharding
from ..sources.files import file_source
from .common import (
    STORAGE_OPTION,
    Writes,
    app,
    check_columns,
    count,
    err,
    format_of,
    open_table,
    out,
    progress_bar,
    run_command,
)


@app.command()
def merge(
    source: str = typer.Argument(..., help="A file (ndjson, csv, ipc)."),
    table_uri: str = typer.Argument(..., help="The Lance table."),
    on: list[str] = typer.Option(None, "--on", help="Join column(s); default the primary key."),
    format: str | None = typer.Option(None, "--format", "-f", help="ndjson, csv or ipc."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Upsert SOURCE into TABLE_URI (conflicts are retried by re-reading the file)."""
    if not os.path.exists(source):
        err.print(f"[red]error:[/red] no such file: {source}")
        raise typer.Exit(2)

    async def run() -> Any:
        ds = await open_table(table_uri, storage_option)
        keys = on or ds.primary_key
        if not keys:
            raise typer.BadParameter(
                "the table has no primary key; name the join column(s)", param_hint="'--on'"
            )
        check_columns(ds, keys, "--on")
        schema = ds.schema
        fmt = format or format_of(source)
        if fmt in ("ndjson", "csv"):
            src = file_source(source, format=fmt, schema=schema)
        else:
            src = file_source(source, format=fmt)
        with progress_bar() as progress:
            progress.add_task(f"merge {Path(source).name}", total=None)
            return await (
                ds.merge_insert(keys)
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(src)
            )

    result = run_command(run, Writes())  # a merge commits all or nothing
    out.print(
        f"inserted {result.num_inserted_rows:,}, updated {result.num_updated_rows:,}, "
        f"deleted {result.num_deleted_rows:,} rows in {result.num_attempts} attempt(s); "
        f"version {result.version}"
    )


@app.command(name="init-wal")
def init_wal(
    table_uri: str = typer.Argument(..., help="The Lance table."),
    bucket_column: str | None = typer.Option(
        None, "--bucket-column", help="Hash-bucket shards on this column (default: the key)."
    ),
    num_buckets: int | None = typer.Option(
        None, "--num-buckets", help=f"Buckets, one shard each (default {DEFAULT_NUM_BUCKETS})."
    ),
    identity_column: str | None = typer.Option(
        None, "--identity-column", help="A shard per value of this column."
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
        ds = await open_table(table_uri, storage_option)
        if bucket_column:
            check_columns(ds, [bucket_column], "--bucket-column")
        if identity_column:
            check_columns(ds, [identity_column], "--identity-column")
        options: dict[str, Any] = {}
        if bucket_column is not None or num_buckets is not None:
            column = bucket_column or next(iter(ds.primary_key), None)
            if column is None:
                raise typer.BadParameter(
                    "the table has no primary key; name the column", param_hint="'--bucket-column'"
                )
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
    out.print(f"MemWAL initialized on {table_uri}: {describe_sharding(sharding)}")


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
    table_uri: str = typer.Argument(..., help="The Lance table."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Merge the MemWAL's flushed generations into TABLE_URI's base table."""

    async def run() -> Any:
        ds = await open_table(table_uri, storage_option)
        with progress_bar() as progress:
            progress.add_task("compact", total=None)
            return await ds.compact_mem_wal()

    result = run_command(run)
    gens = sum(len(g) for g in result.generations.values())
    out.print(
        f"compacted {count(gens, 'generation')} from {count(len(result.generations), 'shard')}: "
        f"{result.rows_upserted:,} rows upserted, {result.rows_deleted:,} deleted; "
        f"version {result.version}"
    )


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
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Versions, rows, MemWAL shards and generations of TABLE_URI."""

    async def run() -> dict[str, Any]:
        return await _info(await open_table(table_uri, storage_option))

    data = run_command(run)
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
def check(
    table_uri: str = typer.Argument(..., help="The Lance table."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Find keys in more than one MemWAL shard (exit 1 when there are any).

    Reads the flushed, not yet compacted generations of every shard; close
    the writers first so their memtables are flushed.
    """

    async def run() -> ShardCheck:
        return await (await open_table(table_uri, storage_option)).check_shards()

    report = run_command(run)
    if as_json:
        out.print_json(json.dumps(dataclasses.asdict(report) | {"ok": report.ok}, default=str))
    else:
        out.print(
            f"{report.shards} shard(s), {report.generations} flushed generation(s), "
            f"{report.rows:,} rows read ({report.sharding} sharding): "
            f"{report.split_keys:,} key(s) in more than one shard, "
            f"{report.misplaced_keys:,} in the wrong shard"
        )
        for example in report.examples:
            where = ", ".join(example["shards"])
            expected = f" (belongs to {example['expected']})" if example["expected"] else ""
            out.print(f"  key {example['key']!r}: shard {where}{expected}")
        if report.compacted_shards:
            err.print(
                f"note: {report.compacted_shards} shard(s) have generations compacted already; "
                "their rows are in the base table and were not checked"
            )
    if not report.ok:
        raise typer.Exit(1)
