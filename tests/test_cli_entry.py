"""The ``lance-async`` command through its installed entry point: exit codes,
standard input, one-line errors, plain help and output off a terminal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lance

from .helpers import kv_table

ROWS = [{"id": i, "value": i, "name": f"r{i}"} for i in range(10)]


def cli(
    *args: str, stdin: str | None = None, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("lance-async")
    command = str(script) if script.exists() else shutil.which("lance-async")
    assert command, "lance-async is not installed"
    return subprocess.run(
        [command, *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env},
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_help_is_plain_and_version_prints() -> None:
    top = cli("--help")
    assert top.returncode == 0
    assert "create" in top.stdout and "<bool>" not in top.stdout
    merge = cli("merge", "--help")
    # typer's own plain help (configured, not subclassed): arguments by name,
    # options by what they take, no panels
    assert "Usage: lance-async merge [OPTIONS] {SOURCE} {TABLE_URI}" in merge.stdout
    assert "--on COLUMN" in merge.stdout and "--allow-non-key" in merge.stdout
    for tag in ("<bool>", "<list[str]>", "<float>", "{source}", "{table_uri}", "╭"):
        assert tag not in merge.stdout, tag
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("lance-async ")
    assert "pylance 14." in version.stdout


def test_create_from_a_schema_needs_a_key_then_merge_stdin(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    one_line_error(cli("create", uri, "--schema", "id:int64,value:int64,name:string"), 2, "--key")
    assert not Path(uri).exists()
    one_line_error(
        cli("create", uri, "--schema", "id:int64,value:fancy", "--key", "id"), 2, "fancy"
    )
    made = cli("create", uri, "--schema", "id:int64,value:int64,name:string", "--key", "id")
    assert made.returncode == 0, made.stderr
    assert "primary key id" in made.stdout
    assert lance.dataset(uri).count_rows() == 0
    again = cli("create", uri, "--schema", "id:int64", "--key", "id")
    one_line_error(again, 1, "exists")
    body = "".join(json.dumps(r) + "\n" for r in ROWS)
    merged = cli("merge", "-", uri, stdin=body)
    assert merged.returncode == 0, merged.stderr
    assert "inserted 10" in merged.stdout
    table = lance.dataset(uri).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(10))
    assert table.schema.field("id").metadata[b"lance-schema:unenforced-primary-key"] == b"true"


def test_create_from_a_json_array_file_then_init_wal_ingest_and_info(tmp_path: Path) -> None:
    src = tmp_path / "rows.json"
    src.write_text(json.dumps(ROWS, indent=2))
    uri = str(tmp_path / "j.lance")
    made = cli("create", uri, "--from", str(src), "--key", "id")
    assert made.returncode == 0, made.stderr
    assert lance.dataset(uri).count_rows() == 10
    # a table without a MemWAL: ingest, compact and check all say to run init-wal
    for command in ("compact", "check"):
        one_line_error(cli(command, uri), 1, f"lance-async init-wal {uri}")
    more = tmp_path / "more.json"
    more.write_text(json.dumps([{"id": i, "value": 1, "name": "m"} for i in range(100, 120)]))
    one_line_error(cli("ingest", str(more), uri), 1, f"lance-async init-wal {uri}")
    assert cli("init-wal", uri).returncode == 0
    one_line_error(cli("init-wal", uri), 1, "already initialized")
    ingested = cli("ingest", str(more), uri)
    assert ingested.returncode == 0, ingested.stderr
    info = cli("info", uri, "--json")
    data = json.loads(info.stdout)
    assert data["base_rows"] == 10 and data["flushed_rows"] == 20
    assert data["unflushed_rows"] == 0 and data["lsm_rows"] == 30
    assert data["generations"] >= 1 and len(data["shards"]) >= 1
    text = cli("info", uri)
    assert "10 in the base table, 20 in" in text.stdout
    assert "an LSM scan sees 30" in text.stdout


def test_merge_on_a_column_that_is_not_the_key_is_refused_unless_asked(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(5)), uri)
    src = tmp_path / "rows.ndjson"
    src.write_text(json.dumps({"id": 50, "value": 9, "name": "n1"}) + "\n")
    refused = cli("merge", str(src), uri, "--on", "name")
    one_line_error(refused, 2, "not the table's primary key", "--allow-non-key")
    assert lance.dataset(uri).version == 1
    allowed = cli("merge", str(src), uri, "--on", "name", "--allow-non-key")
    assert allowed.returncode == 0, allowed.stderr
    rows = {r["name"]: r["id"] for r in lance.dataset(uri).to_table().to_pylist()}
    assert rows["n1"] == 50


def test_errors_are_one_line_with_the_documented_codes(tmp_path: Path) -> None:
    one_line_error(cli("serve", "--root", str(tmp_path / "missing")), 2, "not a directory")
    one_line_error(cli("scan", str(tmp_path / "nope.lance")), 2, "lance-async create")
    one_line_error(cli("merge", str(tmp_path / "none.ndjson"), "x.lance"), 2, "no such file")
    one_line_error(cli("merge"), 2, "Missing argument", "lance-async merge --help")
    one_line_error(cli("scan", "x", "--limit", "many"), 2, "--limit")
    one_line_error(cli("nope"), 2, "No such command")


def test_progress_off_a_terminal_is_plain_lines(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(1)), uri)
    src = tmp_path / "rows.ndjson"
    src.write_text(
        "".join(json.dumps({"id": i, "value": i, "name": "x"}) + "\n" for i in range(1, 50))
    )
    merged = cli("merge", str(src), uri, LANCE_ASYNC_PROGRESS_INTERVAL="0")
    assert merged.returncode == 0, merged.stderr
    lines = merged.stderr.splitlines()
    assert lines and all(line.startswith("merge rows.ndjson: ") for line in lines), lines
    assert lines[-1].startswith("merge rows.ndjson: done, ") and " KiB of " in lines[-1]
    # no spinner frames, no cursor movement: stderr is a pipe here
    assert "\x1b[" not in merged.stderr and "\r" not in merged.stderr
    for frame in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏":
        assert frame not in merged.stderr
