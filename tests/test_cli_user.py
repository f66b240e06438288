"""The command as a new user meets it (issue 26), on real processes: signals,
pipes, brokers with a bad message, object storage through ``AWS_*``, lookups.

Every test runs ``python -m lance_async`` (this checkout) against real tables.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import lance
import pytest

from .feeds.support import entry_id
from .helpers import kv_table
from .services import S3Bucket

ROOT = Path(__file__).resolve().parent.parent


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "lance_async", *args]


def env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **extra,
    }


def run(
    *args: str, stdin: str = "", timeout: float = 120, environ: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The command with ``args``; ``environ``'s variables over this process's."""
    return subprocess.run(
        command(*args),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env(**(environ or {})),
    )


def wait_for_line(stream: IO[str], pattern: str, timeout: float = 120) -> str:
    """The first line of ``stream`` matching ``pattern`` (the overall timeout
    only stops a hung test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            raise AssertionError(f"the stream ended before a line matching {pattern!r}")
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s")


def big_ndjson(path: Path, rows: int) -> Path:
    with path.open("w") as f:
        step = 100_000
        for lo in range(0, rows, step):
            f.write(
                "".join(
                    f'{{"id": {i}, "value": {i}, "name": "big{i}"}}\n'
                    for i in range(lo, min(lo + step, rows))
                )
            )
    return path


# -- 1. Ctrl-C during a merge --------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_before_the_commit_stops_the_merge_and_commits_nothing(
    tmp_path: Path, signum: signal.Signals
) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(10)), uri)
    src = big_ndjson(tmp_path / "big.ndjson", 1_000_000)
    with subprocess.Popen(
        command("merge", str(src), uri),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(LANCE_ASYNC_PROGRESS_INTERVAL="0"),
    ) as proc:
        try:
            assert proc.stderr is not None
            wait_for_line(proc.stderr, r"^merge big\.ndjson: ")  # the engine reads the file
            proc.send_signal(signum)
            out, rest = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 130, (out, rest)
    assert "nothing was committed" in rest and "version" not in out
    table = lance.dataset(uri)
    assert table.version == 1 and table.count_rows() == 10


def test_an_interrupt_near_the_commit_leaves_what_the_command_said(tmp_path: Path) -> None:
    """Sent once the engine read the whole file (merging, or committing): either
    the commit landed and its version is printed (exit 0), or nothing was
    committed (exit 130) -- never a silent commit."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(10)), uri)
    src = big_ndjson(tmp_path / "big.ndjson", 300_000)
    with subprocess.Popen(
        command("merge", str(src), uri),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(LANCE_ASYNC_PROGRESS_INTERVAL="0"),
    ) as proc:
        try:
            assert proc.stderr is not None
            while True:  # the line whose amount is the whole file
                line = wait_for_line(proc.stderr, r"^merge big\.ndjson: ")
                done, _, total = line.split(": ", 1)[1].partition(" of ")
                if total.startswith(done.strip()):
                    break
            proc.send_signal(signal.SIGINT)
            out, rest = proc.communicate(timeout=120)
        finally:
            proc.kill()
    table = lance.dataset(uri)
    if proc.returncode == 0:
        assert f"version {table.version}" in out and table.count_rows() == 300_000
    else:
        assert proc.returncode == 130, (out, rest)
        assert "nothing was committed" in rest and table.version == 1


# -- 4. streaming standard input ------------------------------------------------


def mem_wal_table(path: Path) -> str:
    uri = str(path)
    ds = lance.write_dataset(kv_table(range(5)), uri)
    ds.initialize_mem_wal()
    return uri


def test_rows_piped_into_ingest_are_durable_while_the_pipe_stays_open(tmp_path: Path) -> None:
    uri = mem_wal_table(tmp_path / "t.lance")
    with subprocess.Popen(
        command("ingest", "-", uri),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    ) as proc:
        try:
            assert proc.stdin is not None
            for i in (100, 101):
                proc.stdin.write(json.dumps({"id": i, "value": i, "name": f"p{i}"}) + "\n")
                proc.stdin.flush()
                deadline = time.monotonic() + 60  # only stops a hung test
                # durable, so in an LSM read of another process (the WAL tail), pipe still open
                while run("lookup", uri, str(i)).returncode != 0:
                    assert proc.poll() is None, "the ingest ended with the pipe still open"
                    assert time.monotonic() < deadline, "the piped row never became durable"
                    time.sleep(0.1)
            out, err = proc.communicate(timeout=120)  # closes the pipe: the end of the input
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    assert "ingested 2 rows" in out
    found = run("lookup", uri, "100", "101", "--format", "ndjson")
    assert [json.loads(line)["name"] for line in found.stdout.splitlines()] == ["p100", "p101"]


def test_idle_timeout_ends_an_ingest_from_a_pipe_that_stays_open(tmp_path: Path) -> None:
    uri = mem_wal_table(tmp_path / "t.lance")
    with subprocess.Popen(
        command("ingest", "-", uri, "--idle-timeout", "1"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    ) as proc:
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"id": 7, "value": 7, "name": "idle"}) + "\n")
            proc.stdin.flush()  # and the pipe stays open (communicate() would close it)
            proc.wait(timeout=120)
            assert proc.stdout is not None and proc.stderr is not None
            out, err = proc.stdout.read(), proc.stderr.read()
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    assert "ingested 1 row" in out


# -- 5. poison messages ----------------------------------------------------------

BAD = b'{"id": 2, "nme": "typo"}'  # a field the table lacks


def lsm_ids_of(uri: str) -> list[int]:
    found = run("scan", uri, "--lsm", "--columns", "id", "--format", "ndjson")
    assert found.returncode == 0, found.stderr
    return sorted(json.loads(line)["id"] for line in found.stdout.splitlines())


def row(i: int) -> bytes:
    return json.dumps({"id": i, "value": i, "name": f"r{i}"}).encode()


@pytest.mark.broker
def test_a_bad_redis_message_is_set_aside_and_the_good_ones_around_it_written(
    tmp_path: Path,
) -> None:
    import uuid

    import redis

    from .conftest import broker_or_skip

    broker_or_skip("Redis", 6379)
    client = redis.Redis(port=6379)
    key = f"la-dl-{uuid.uuid4().hex}"
    source = f"redis://127.0.0.1:6379/{key}"
    try:
        ids = [entry_id(client.xadd(key, {"data": p})) for p in (row(101), BAD, row(103))]
        uri = mem_wal_table(tmp_path / "stop.lance")
        # by default the bad message stops the ingest; the one before it is written
        stopped = run("ingest", source, uri, "--idle-timeout", "2")
        assert stopped.returncode == 1, stopped.stderr
        assert "unknown field 'nme'" in stopped.stderr and ids[1] in stopped.stderr
        assert lsm_ids_of(uri) == [0, 1, 2, 3, 4, 101]  # the one before it written, not after
        # --dead-letter --max-bad: recorded, acknowledged, and the good ones written
        letters = tmp_path / "dead.ndjson"
        uri = mem_wal_table(tmp_path / "aside.lance")
        done = run(
            "ingest",
            f"{source}?group=aside",
            uri,
            "--dead-letter",
            str(letters),
            "--max-bad",
            "5",
            "--idle-timeout",
            "2",
        )
        assert done.returncode == 0, done.stderr
        assert "1 dead letter" in done.stdout
        assert lsm_ids_of(uri) == [0, 1, 2, 3, 4, 101, 103]
        assert lance_async_row(uri, 103) == "r103"
        (record,) = [json.loads(line) for line in letters.read_text().splitlines()]
        assert record["offset"] == ids[1] and record["message"] == BAD.decode()
        assert "nme" in record["error"] and record["feed"] == f"redis://127.0.0.1:6379/{key}"
        assert client.xpending(key, "aside")["pending"] == 0  # every message acknowledged
    finally:
        client.delete(key)
        client.close()


def lance_async_row(uri: str, key: int) -> str:
    found = run("lookup", uri, str(key), "--columns", "name", "--format", "ndjson")
    assert found.returncode == 0, found.stderr
    return str(json.loads(found.stdout)["name"])


@pytest.mark.broker
def test_a_bad_nats_message_is_set_aside_within_the_limit_and_stops_past_it(
    tmp_path: Path,
) -> None:
    import asyncio
    import uuid

    import nats

    from .conftest import broker_or_skip

    broker_or_skip("NATS", 4222)
    stream = f"LADL{uuid.uuid4().hex[:12]}"
    subject = f"{stream}.rows"

    async def publish() -> None:
        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[subject])
        for payload in (row(10), BAD, row(12), BAD, row(14)):
            await js.publish(subject, payload)
        await nc.close()

    async def drop() -> None:
        nc = await nats.connect("nats://127.0.0.1:4222")
        await nc.jetstream().delete_stream(stream)
        await nc.close()

    asyncio.run(publish())
    try:
        letters = tmp_path / "dead.ndjson"
        uri = mem_wal_table(tmp_path / "t.lance")
        url = f"nats://127.0.0.1:4222/{stream}/{subject}"
        args = ["--dead-letter", str(letters), "--idle-timeout", "2"]
        over = run("ingest", url, uri, *args, "--max-bad", "1")
        assert over.returncode == 1, over.stderr
        assert "--max-bad" in over.stderr and "sequence" not in over.stderr
        assert [json.loads(line)["offset"] for line in letters.read_text().splitlines()] == [2]
        assert lsm_ids_of(uri) == [0, 1, 2, 3, 4, 10, 12]  # up to the second bad message
        again = run("ingest", url, uri, *args, "--max-bad", "5")  # resumes after the first
        assert again.returncode == 0, again.stderr
        offsets = [json.loads(line)["offset"] for line in letters.read_text().splitlines()]
        assert offsets == [2, 4]
        assert lsm_ids_of(uri) == [0, 1, 2, 3, 4, 10, 12, 14]
    finally:
        asyncio.run(drop())


@pytest.mark.broker
def test_bad_redis_messages_go_to_a_jetstream_subject_and_a_missing_broker_writes_nothing(
    tmp_path: Path,
) -> None:
    import asyncio
    import uuid

    import nats
    import redis

    from .conftest import broker_or_skip

    broker_or_skip("Redis", 6379)
    broker_or_skip("NATS", 4222)
    client = redis.Redis(port=6379)
    key = f"la-dl-{uuid.uuid4().hex}"
    dead = f"LADEAD{uuid.uuid4().hex[:10]}"
    source = f"redis://127.0.0.1:6379/{key}?group=g"
    uri = mem_wal_table(tmp_path / "t.lance")
    try:
        ids = [entry_id(client.xadd(key, {"data": p})) for p in (row(101), BAD, row(103))]
        # a dead-letter broker that is not there: refused before anything is written
        nowhere = run(
            "ingest", source, uri, "--dead-letter", "redis://127.0.0.1:1/dead", "--max-bad", "1"
        )
        assert nowhere.returncode != 0 and "Traceback" not in nowhere.stderr
        assert lsm_ids_of(uri) == [0, 1, 2, 3, 4]
        # an unknown form of destination: a usage error, before any I/O
        odd = run(
            "ingest", source, uri, "--dead-letter", "nats://127.0.0.1:4222/x", "--max-bad", "1"
        )
        assert odd.returncode == 2 and "dead-letter destination" in odd.stderr
        subject = f"{dead}.letters"
        done = run(
            "ingest",
            source,
            uri,
            "--dead-letter",
            f"nats://127.0.0.1:4222/{dead}/{subject}",
            "--max-bad",
            "1",
            "--idle-timeout",
            "2",
        )
        assert done.returncode == 0, done.stderr
        assert "1 dead letter" in done.stdout
        assert lsm_ids_of(uri) == [0, 1, 2, 3, 4, 101, 103]
        assert client.xpending(key, "g")["pending"] == 0

        async def letters() -> list[tuple[bytes, dict[str, str]]]:
            nc = await nats.connect("nats://127.0.0.1:4222")
            js = nc.jetstream()
            try:
                info = await js.stream_info(dead)
                out: list[tuple[bytes, dict[str, str]]] = []
                for seq in range(1, info.state.messages + 1):
                    msg = await js.get_msg(dead, seq)
                    assert msg.data is not None
                    out.append((msg.data, dict(msg.headers or {})))
                await js.delete_stream(dead)
                return out
            finally:
                await nc.close()

        ((body, headers),) = asyncio.run(letters())
        assert body == BAD
        assert json.loads(headers["dead-letter-offset"]) == ids[1]
        assert headers["dead-letter-feed"] == f"redis://127.0.0.1:6379/{key}"
    finally:
        client.delete(key)
        client.close()


@pytest.mark.broker
def test_ingest_applies_lance_op_delete_as_a_worker_does(tmp_path: Path) -> None:
    """One rule on every path: a message with ``lance-op: delete`` deletes its
    key through ``ingest`` too (it used to be written as a row of nulls)."""
    import uuid

    import redis

    from .conftest import broker_or_skip

    broker_or_skip("Redis", 6379)
    client = redis.Redis(port=6379)
    key = f"la-op-{uuid.uuid4().hex}"
    uri = mem_wal_table(tmp_path / "t.lance")
    try:
        client.xadd(key, {"data": row(700)})
        client.xadd(key, {"data": json.dumps({"id": 700}).encode(), "lance-op": b"delete"})
        client.xadd(key, {"data": json.dumps({"id": 3}).encode(), "lance-op": b"delete"})
        client.xadd(key, {"data": row(701)})
        done = run("ingest", f"redis://127.0.0.1:6379/{key}", uri, "--idle-timeout", "2")
        assert done.returncode == 0, done.stderr
        assert lsm_ids_of(uri) == [0, 1, 2, 4, 701]  # 700 put then deleted; 3 deleted
    finally:
        client.delete(key)
        client.close()


# -- 6. object storage configured the way pylance is -------------------------------


@pytest.mark.timeout(300)  # seven commands, each a process: minutes on a loaded machine
def test_every_command_reads_a_bucket_through_the_aws_environment_alone(
    tmp_path: Path, s3_bucket: S3Bucket
) -> None:
    aws = {
        "AWS_ACCESS_KEY_ID": s3_bucket.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_bucket.secret_key,
        "AWS_REGION": s3_bucket.region,
        "AWS_ENDPOINT": s3_bucket.endpoint,  # object_store's name; pyarrow reads another
        "AWS_ALLOW_HTTP": "true",
    }
    uri = s3_bucket.uri("t.lance")
    rows = tmp_path / "rows.ndjson"
    rows.write_text("".join(row(i).decode() + "\n" for i in range(10)))
    steps = [
        ("create", uri, "--from", str(rows), "--key", "id"),
        ("init-wal", uri),
        ("ingest", str(rows), uri),
        ("merge", str(rows), uri),
        ("check", uri),
        ("scan", uri, "--lsm", "--format", "ndjson"),
        ("lookup", uri, "3", "--format", "ndjson"),
        ("compact", uri),
        ("info", uri, "--json"),
    ]
    results = {}
    for args in steps:
        done = run(*args, environ=aws)
        assert done.returncode == 0, (args, done.stderr)
        results[args[0]] = done
    assert len(results["scan"].stdout.splitlines()) == 10
    assert json.loads(results["lookup"].stdout)["name"] == "r3"
    assert json.loads(results["info"].stdout)["base_rows"] == 10
    # an unknown -s key is refused by name; no credentials at all: one line
    typo = run("info", uri, "-s", f"aws_endpont={s3_bucket.endpoint}", environ=aws)
    assert typo.returncode == 2 and "did you mean 'aws_endpoint'" in typo.stderr
    bare = {k: v for k, v in aws.items() if "KEY" not in k}
    missing = run("info", uri, environ=bare)
    assert missing.returncode == 2, missing.stderr
    (line,) = missing.stderr.splitlines()
    assert line.startswith(f"error: no credentials for {uri}: set AWS_ACCESS_KEY_ID"), line


# -- 8. reading back: serve finds tables made after it started; lookup -----------------


def test_serve_sees_tables_created_after_it_started(tmp_path: Path) -> None:
    import httpx

    from .web.serving import free_port, start

    lance.write_dataset(kv_table(range(3)), str(tmp_path / "first.lance"))
    port = free_port()
    argv = command("serve", "--root", str(tmp_path), "--port", str(port))
    with start(argv, port, tmp_path, tmp_path / "server.log", env=env()) as server:
        base = server.url
        mem_wal_table(tmp_path / "later.lance")  # made after the start, with a MemWAL
        body = "".join(row(i).decode() + "\n" for i in (40, 41))
        ingested = httpx.post(
            f"{base}/tables/later/ingest",
            content=body,
            headers={"content-type": "application/x-ndjson"},
            timeout=60,
        )
        assert ingested.status_code == 200, ingested.text
        assert httpx.get(f"{base}/tables/later/lookup/41", timeout=30).json()["row"] == {
            "id": 41,
            "value": 41,
            "name": "r41",
        }
        assert sorted(httpx.get(f"{base}/tables", timeout=30).json()) == ["first", "later"]
        assert httpx.get(f"{base}/tables/none/rows", timeout=30).status_code == 404


def test_lookup_reads_the_newest_row_of_each_key(tmp_path: Path) -> None:
    uri = mem_wal_table(tmp_path / "t.lance")
    rows = tmp_path / "rows.ndjson"
    rows.write_text(json.dumps({"id": 2, "value": 20, "name": "newer"}) + "\n")
    assert run("ingest", str(rows), uri).returncode == 0
    found = run("lookup", uri, "2", "4", "77", "--format", "ndjson")
    assert found.returncode == 1  # a key without a row
    assert [json.loads(line)["name"] for line in found.stdout.splitlines()] == ["newer", "n4"]
    assert found.stderr.strip() == "no row for key 77"
    base = run("lookup", uri, "2", "--base", "--format", "ndjson")
    assert base.returncode == 0 and json.loads(base.stdout)["name"] == "n2"
    bad = run("lookup", uri, "two")
    assert bad.returncode == 2 and "is not a value of type int64" in bad.stderr


# -- 9. the small ones ---------------------------------------------------------------


def test_create_with_a_narrower_schema_refuses_instead_of_dropping_columns(
    tmp_path: Path,
) -> None:
    lines = ["id,value,name", *(f"{i},{i},n{i}" for i in range(6_000))]
    src = tmp_path / "rows.csv"
    src.write_text("\n".join(lines) + "\n")
    uri = tmp_path / "t.lance"
    narrow = run("create", str(uri), "--from", str(src), "--schema", "id:int64", "--key", "id")
    assert narrow.returncode == 2 and "'value', 'name'" in narrow.stderr
    assert not uri.exists()
    lines[5_001] = "5000,1,n,extra"  # past what a small sample would read, within inference's
    src.write_text("\n".join(lines) + "\n")
    inferred = run("create", str(uri), "--from", str(src), "--key", "id")
    assert inferred.returncode == 1
    assert "line 5002 of rows.csv: expected 3 columns, got 4" in inferred.stderr
    assert not uri.exists()


def test_compact_and_check_say_what_they_count(tmp_path: Path) -> None:
    uri = mem_wal_table(tmp_path / "t.lance")
    rows = tmp_path / "rows.ndjson"
    rows.write_text("".join(row(i).decode() + "\n" for i in range(100, 120)))
    for _ in range(2):  # every key twice: 40 rows in the generations, 20 keys
        assert run("ingest", str(rows), uri).returncode == 0
    info = json.loads(run("info", uri, "--json").stdout)
    checked = run("check", uri, "--json")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["rows"] == info["flushed_rows"] + info["unflushed_rows"]
    assert info["flushed_rows"] + info["unflushed_rows"] == 40
    assert "deletions included" in run("check", uri).stderr
    compacted = run("compact", uri, environ={"LANCE_ASYNC_PROGRESS_INTERVAL": "0"})
    assert compacted.returncode == 0, compacted.stderr
    gens = info["generations"]
    assert compacted.stderr.splitlines()[-1].startswith(
        f"compact: done, {gens} of {gens} generations"
    )
    assert (
        f"compacted {gens} generations" in compacted.stdout
        and "20 rows upserted" in compacted.stdout
    )


# -- 3. one rule for partial rows -----------------------------------------------------


def test_a_field_missing_from_every_merged_row_keeps_the_stored_value(tmp_path: Path) -> None:
    # issue 26 case 3: `echo '{"id":3,"name":"C"}' | lance-async merge - t.lance` nulled `value`
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(5), value=7), uri)
    body = '{"id": 3, "name": "C"}\n{"id": 9, "name": "new"}\n'
    merged = run("merge", "-", uri, stdin=body)
    assert merged.returncode == 0, merged.stderr
    rows = {r["id"]: r for r in lance.dataset(uri).to_table().to_pylist()}
    assert rows[3] == {"id": 3, "value": 7, "name": "C"}  # updated: value kept
    assert rows[9] == {"id": 9, "value": None, "name": "new"}  # inserted: value null
    explicit = run("merge", "-", uri, stdin='{"id": 4, "value": null, "name": "D"}\n')
    assert explicit.returncode == 0, explicit.stderr
    assert lance.dataset(uri).to_table(filter="id = 4").to_pylist()[0]["value"] is None
