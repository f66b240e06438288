"""``--dead-letter FILE|URL`` of ``ingest`` and ``worker``: the option, its
checks before any I/O, and the sink it opens (:mod:`lance_async.feeds.deadletter`,
:mod:`lance_async.feeds.deadletter_brokers`)."""

from __future__ import annotations

import re
from typing import Any

import typer

__all__ = ["DEAD_LETTER", "check_dead_letter", "open_dead_letter"]


DEAD_LETTER: Any = typer.Option(
    None,
    "--dead-letter",
    metavar="FILE|URL",
    help="Set bad messages aside and acknowledge them, up to --max-bad: FILE appends NDJSON "
    "records (offset, raw message, error); redis://HOST:PORT/STREAM, "
    "nats://HOST:PORT/STREAM/SUBJECT or kafka://HOST:PORT/TOPIC keeps the raw message in the "
    "broker, the error in its headers (fields). Broker feeds only.",
)

_DEAD_LETTER_URLS = (
    "redis://HOST:PORT/STREAM, nats://HOST:PORT/STREAM/SUBJECT or kafka://HOST:PORT/TOPIC"
)


def _redacted(url: str) -> str:
    """``url`` without a password (for messages)."""
    return re.sub(r"//([^/@:]*):[^/@]*@", r"//\1:***@", url)


def check_dead_letter(destination: str | None) -> None:
    """Refuse a ``--dead-letter`` destination that cannot work, before any
    broker I/O: a URL of an unknown scheme or shape, a bad port, a NATS
    subject with wildcards, a file that cannot be created or appended to.

    Raises
    ------
    typer.BadParameter
        Saying what is wrong (a URL's password is not repeated).
    """
    if destination is None:
        return
    hint = "'--dead-letter'"
    if "://" not in destination:
        try:
            with open(destination, "ab"):
                pass
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot append dead letters to {destination!r}: {exc.strerror or exc}",
                param_hint=hint,
            ) from None
        return
    from urllib.parse import urlparse

    shown = _redacted(destination)
    try:
        url = urlparse(destination)
        url.port  # noqa: B018  (a bad port raises here)
    except ValueError as exc:
        raise typer.BadParameter(f"{shown}: {exc}", param_hint=hint) from None
    path = [p for p in url.path.split("/") if p]
    wanted = {"redis": 1, "rediss": 1, "nats": 2, "kafka": 1}.get(url.scheme)
    if wanted is None or len(path) != wanted or not url.hostname:
        raise typer.BadParameter(
            f"a dead-letter destination is a FILE or {_DEAD_LETTER_URLS}, got {shown!r}",
            param_hint=hint,
        )
    if url.scheme == "nats" and any(c in path[1] for c in "*> "):
        raise typer.BadParameter(
            f"a dead-letter subject is one subject, without wildcards: got {path[1]!r}",
            param_hint=hint,
        )


def _same_feed(destination: str, source: str) -> bool:
    """Whether dead letters sent to ``destination`` would come back through
    ``source`` (the same Redis stream -- or one of a partitioned feed's
    ``KEY:N`` streams -- on the same server and database)."""
    from urllib.parse import parse_qs, urlparse

    dest, src = urlparse(destination), urlparse(source)
    if dest.scheme not in ("redis", "rediss") or src.scheme not in ("redis", "rediss"):
        return False

    def where(u: Any) -> tuple[str, int, str]:
        db = parse_qs(u.query).get("db", ["0"])[-1]
        return (u.hostname or "").lower(), u.port or 6379, db

    if where(dest) != where(src):
        return False
    stream, key = dest.path.strip("/"), src.path.strip("/")
    head, _, tail = stream.rpartition(":")
    return stream == key or (head == key and tail.isdigit())


async def open_dead_letter(destination: str | None, max_bad: int | None, source: str) -> Any:
    """The dead-letter sink of ``--dead-letter`` (a file or a broker URL), or None.

    ``source`` is the feed's URL; what is recorded of it drops credentials
    and the query. A broker sink is connected here (its stream or subject
    checked or created); use the result as an async context manager. A
    Redis sink writes the payload to the source's own payload field
    (``?field=``, default ``data``).

    Raises
    ------
    typer.BadParameter
        A destination :func:`check_dead_letter` refuses, or one the feed
        itself reads (its dead letters would come back for ever).
    Exception
        The broker is not reachable, or its key, stream or subject is unfit
        (:class:`~lance_async.InvalidInputError`).
    """
    if destination is None:
        return None
    from urllib.parse import parse_qs, urlparse

    from ..feeds.deadletter import DeadLetterFile

    url = urlparse(source)
    host = url.hostname or ""
    feed = f"{url.scheme}://{host}{f':{url.port}' if url.port else ''}{url.path}"
    check_dead_letter(destination)
    if "://" not in destination:
        return DeadLetterFile(destination, max_bad=max_bad, feed=feed)
    if _same_feed(destination, source):
        raise typer.BadParameter(
            f"{_redacted(destination)} is what the feed reads: its dead letters would come "
            "back to it for ever; name another stream",
            param_hint="'--dead-letter'",
        )
    from ..feeds import deadletter_brokers as sinks

    where = urlparse(destination)
    path = [p for p in where.path.split("/") if p]
    if where.scheme in ("redis", "rediss"):
        field = (
            parse_qs(url.query).get("field", ["data"])[-1]
            if url.scheme.startswith("redis")
            else "data"
        )
        query = f"?{where.query}" if where.query else ""
        return await sinks.RedisDeadLetterStream.connect(
            f"{where.scheme}://{where.netloc}/{query}",
            path[0],
            field=field,
            max_bad=max_bad,
            feed=feed,
        )
    if where.scheme == "nats":
        sink = await sinks.JetStreamDeadLetters.connect(
            f"nats://{where.netloc}", path[0], path[1], max_bad=max_bad, feed=feed
        )
        fed = [p for p in url.path.split("/") if p]
        if url.scheme == "nats" and fed and sink.stream == fed[0]:
            await sink.aclose()
            raise typer.BadParameter(
                f"the dead-letter subject {path[1]!r} is kept by the stream {fed[0]!r}, which "
                "the feed reads: its dead letters would come back for ever; use a subject of "
                "another stream",
                param_hint="'--dead-letter'",
            )
        return sink
    return await sinks.KafkaDeadLetterTopic.connect(
        where.netloc, path[0], max_bad=max_bad, feed=feed
    )
