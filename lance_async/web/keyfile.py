"""A key file watched while the server runs: keys revoked or added without a restart.

:class:`KeyFileWatcher` keeps an :class:`~lance_async.web.auth.ApiKeyAuth`
in step with its key file (``--api-keys-file``). It looks at the file's
``stat`` every ``interval`` seconds (inode, size, modification and change
times: an editor that renames a new file over the old one and one that
rewrites it in place are both seen) and re-reads it at once on ``SIGHUP``,
the signal daemons reload their configuration on (nginx, sshd, HAProxy).
A key removed from the file is refused (401) from the next request on; a
key added is accepted.

A file that does not parse (a half-written line, a bad digest, a repeated
id), that holds no key, or that cannot be read keeps the last good keys, and
the log says so at WARNING, once per version of the file; the next good
version is taken as soon as it is seen. Keys given inline in the settings
(``api_keys``) stay whatever the file says.

The idea is the one of nginx's ``nginx -s reload`` and of Kubernetes'
projected secrets (files that change under a running process, polled by it):
polling needs no inotify and sees a file replaced through a link, as
Kubernetes swaps its ``..data`` link.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread

from .._threads import stream_limiter
from .auth import ApiKey, ApiKeyAuth, read_key_file

__all__ = ["DEFAULT_POLL_INTERVAL", "KeyFileWatcher"]

log = logging.getLogger("lance_async.web")

DEFAULT_POLL_INTERVAL = 1.0
"""Seconds between two looks at the key file's ``stat``."""

_Stamp = tuple[int, int, int, int]


def _stamp(path: str) -> _Stamp | None:
    """What tells one version of the file from the next (None: cannot stat it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeyFileWatcher:
    """Reload an :class:`ApiKeyAuth`'s keys from their file as it changes (see the module).

    Parameters
    ----------
    auth : ApiKeyAuth
        The dependency whose keys are replaced (:meth:`ApiKeyAuth.replace_keys`).
    path : str or PathLike
        The key file (``ID SCOPE sha256:HEX`` per line).
    inline : sequence of ApiKey
        Keys that come from elsewhere (the settings) and stay (default none).
    interval : float
        Seconds between two looks at the file (default 1; 0: only on SIGHUP).
    sighup : bool
        Re-read the file at once on ``SIGHUP`` (default True). Signals can
        only be received in the main thread: a watcher elsewhere polls only.

    Attributes
    ----------
    reloads : int
        Versions of the file taken so far (after the one read at startup).
    refused : int
        Versions refused (the last good keys kept).

    Notes
    -----
    :meth:`run` lives in the server's lifespan (``create_app(key_watcher=...)``).
    The file is read on a worker thread (the ``stream`` limiter); the keys
    are swapped on the event loop, between two requests' checks.
    """

    def __init__(
        self,
        auth: ApiKeyAuth,
        path: str | os.PathLike[str],
        *,
        inline: Sequence[ApiKey] = (),
        interval: float = DEFAULT_POLL_INTERVAL,
        sighup: bool = True,
    ) -> None:
        if not isinstance(auth, ApiKeyAuth):
            raise TypeError(f"auth must be an ApiKeyAuth, got {type(auth).__name__}")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
            raise ValueError(f"interval must be a number of seconds >= 0, got {interval!r}")
        self.auth = auth
        self.path = os.fspath(path)
        self.inline = tuple(inline)
        self.interval = float(interval)
        self.sighup = sighup
        self.reloads = 0
        self.refused = 0
        self._seen = _stamp(self.path)  # the version read at startup
        self._wake = anyio.Event()

    def __repr__(self) -> str:
        return f"<KeyFileWatcher {self.path!r} keys={len(self.auth.keys)}>"

    async def reload(self) -> bool:
        """Read the file now and take its keys if they are good.

        Returns
        -------
        bool
            True when the keys were replaced, False when the file was
            refused (logged at WARNING; the last good keys stay).
        """
        stamp = await anyio.to_thread.run_sync(_stamp, self.path, limiter=stream_limiter())
        self._seen = stamp
        before = {k.id for k in self.auth.keys}
        try:
            keys = await anyio.to_thread.run_sync(self._read, limiter=stream_limiter())
            self.auth.replace_keys([*self.inline, *keys])
        except (ValueError, TypeError) as exc:
            self.refused += 1
            log.warning(
                "lance_async.serve: the key file %r was not reloaded (%s); keeping the last "
                "good keys (%d: %s)",
                self.path,
                " ".join(str(exc).split()),
                len(before),
                ", ".join(sorted(before)),
            )
            return False
        after = {k.id for k in self.auth.keys}
        self.reloads += 1
        log.info(
            "lance_async.serve: reloaded the key file %r: %d keys (added: %s; removed: %s)",
            self.path,
            len(after),
            ", ".join(sorted(after - before)) or "none",
            ", ".join(sorted(before - after)) or "none",
        )
        return True

    def _read(self) -> list[ApiKey]:
        keys = read_key_file(self.path)
        if not keys:
            raise ValueError("it holds no key (an empty file revokes nothing: stop the server)")
        return keys

    def wake(self) -> None:
        """Look at the file now instead of at the next interval (does not block)."""
        self._wake.set()

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the file until cancelled (see the class); started in a task group.

        Raises nothing: a file that cannot be read is logged, not fatal.
        """
        async with anyio.create_task_group() as tg:
            if self.sighup:
                tg.start_soon(self._signals)
            task_status.started()
            while True:
                if self.interval > 0:
                    with anyio.move_on_after(self.interval):
                        await self._wake.wait()
                else:
                    await self._wake.wait()
                woken = self._wake.is_set()
                self._wake = anyio.Event()
                stamp = await anyio.to_thread.run_sync(_stamp, self.path, limiter=stream_limiter())
                if woken or stamp != self._seen:
                    await self.reload()

    async def _signals(self) -> None:
        try:
            receiver = anyio.open_signal_receiver(signal.SIGHUP)
            with receiver as received:
                async for _ in received:
                    log.info("lance_async.serve: SIGHUP: reading the key file %r", self.path)
                    self.wake()
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            log.debug("lance_async.serve: no SIGHUP here; the key file is polled only")
