"""The ``cleanup`` command: what no reader inside the retention needs, removed (or listed)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import typer

from .common import STORAGE_OPTION, app, count, open_table, out, run_command

if TYPE_CHECKING:
    from ..memwal.cleanup import CleanupStats

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> timedelta:
    """``"90"``, ``"90s"``, ``"30m"``, ``"1h"``, ``"7d"`` as a timedelta.

    Raises
    ------
    typer.BadParameter
        Anything else (a negative number included).
    """
    match = _DURATION.match(text)
    if match is None:
        raise typer.BadParameter(
            f"{text!r} is not a duration: give seconds, or a number with s, m, h or d (1h)",
            param_hint="'--retention'",
        )
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


def _entries(n: int) -> str:
    return f"{n:,} WAL entr{'y' if n == 1 else 'ies'}"


@app.command()
def cleanup(
    table_uri: str = typer.Argument(..., metavar="TABLE_URI", help="The Lance table."),
    retention: str = typer.Option(
        "1h",
        "--retention",
        help="Keep what a reader that opened its view this long ago may read "
        "(seconds, or 90s, 30m, 1h, 7d). 0: keep only what the current state needs.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List what would be removed; remove nothing."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Remove old versions and the MemWAL files no reader inside the retention needs.

    Superseded base versions (through the engine), generation folders every
    kept version has compacted, WAL entries every kept shard manifest has
    flushed (fence sentinels stay), superseded shard manifests. Safe beside
    running writers, readers and compactors.
    """
    keep = parse_duration(retention)

    async def run() -> CleanupStats:
        from ..memwal.cleanup import cleanup_table

        ds = await open_table(table_uri, storage_option)
        return await cleanup_table(ds, keep, dry_run=dry_run)

    stats = run_command(run)
    plan = stats.plan
    assert plan is not None
    if as_json:
        data: dict[str, Any] = {
            "dry_run": stats.dry_run,
            "retention_seconds": keep.total_seconds(),
            "base_versions": list(plan.base_versions),
            "retained_versions": list(plan.retained_versions),
            "bytes_removed": stats.bytes_removed,
            "wal_entries": stats.wal_entries_removed,
            "generations": stats.generations_removed,
            "manifests": stats.manifests_removed,
            "mem_wal_bytes": stats.mem_wal_bytes_removed,
            "failed_deletes": stats.failed_deletes,
            "shards": [
                {
                    "shard_id": s.shard_id,
                    "wal_entries": list(s.wal_entries),
                    "generations": list(s.generations),
                    "manifests": list(s.manifests),
                    "wal_left": s.wal_left,
                    "fences_kept": s.fences_kept,
                    "generations_left": s.generations_left,
                    "manifests_left": s.manifests_left,
                }
                for s in plan.shards
            ],
        }
        out.print_json(json.dumps(data))
        return
    if dry_run:
        for line in plan.lines():
            out.print(f"would remove {line}", markup=False, highlight=False)
    verb = "would remove" if dry_run else "removed"
    left_wal = sum(s.wal_left for s in plan.shards)
    left_gens = sum(s.generations_left for s in plan.shards)
    out.print(
        f"{verb} {count(stats.old_versions, 'base version')}, "
        f"{count(stats.generations_removed, 'generation folder')}, "
        f"{_entries(stats.wal_entries_removed)}, "
        f"{count(stats.manifests_removed, 'shard manifest')} "
        f"({(stats.bytes_removed + stats.mem_wal_bytes_removed) / 1e6:,.1f} MB"
        f"{'' if not dry_run else ' of WAL and manifests, base files not counted'}); "
        f"kept {count(len(plan.retained_versions), 'version')}, "
        f"{count(left_gens, 'generation folder')}, {_entries(left_wal)}",
        markup=False,
        highlight=False,
    )
    if stats.failed_deletes:
        out.print(f"{stats.failed_deletes:,} deletions failed (logged); run it again", markup=False)
        raise typer.Exit(1)
