"""A pre-imported Python process that forks one fresh child per measured run.

Starting Python and importing pyarrow, pylance and lance_async takes 1-2 s
here, and LanceDB another 3-6 s; a run measured in a fresh interpreter would
spend most of its time importing. This server imports once, runs nothing
else, and for each request forks a child that runs exactly one
``module:function(**params)`` and exits. The child is a new process: its
peak RSS (``ru_maxrss``, which starts at the RSS it inherits at the fork) and
its ``write_bytes`` counter are its own, and no earlier run touched the
memory it starts from. No engine call runs before a fork, so no engine thread
pool exists yet to be lost by it.

Protocol: argv[1] is a JSON list of modules to import. Each line on stdin is
``{"target": "module:function", "params": {...}, "timeout": seconds}``; each
line on stdout is ``{"ok": true, "result": {...}}`` or
``{"ok": false, "error": "traceback text"}``. The children's own output goes
to stderr.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import sys
import time
import traceback
import warnings
from typing import Any

from ._common import peak_rss_mib


def _child(request: dict[str, Any], fd: int) -> None:
    try:
        os.dup2(2, 1)  # stray prints must not reach the protocol pipe
        module_name, func_name = request["target"].split(":")
        func = getattr(importlib.import_module(module_name), func_name)
        result = dict(func(**request["params"]))
        result["peak_rss_mib"] = peak_rss_mib()
        payload = json.dumps({"ok": True, "result": result})
    except BaseException:
        payload = json.dumps({"ok": False, "error": traceback.format_exc()})
    data = payload.encode()
    while data:
        written = os.write(fd, data)
        data = data[written:]
    os.close(fd)


def _read_all(fd: int, deadline: float) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def serve(preload: list[str]) -> None:
    """Import ``preload``, then answer requests until stdin closes."""
    # pylance warns on every fork once imported, and LanceDB on a fork after its
    # import; both concern engine state, and none exists here: nothing but
    # imports ran before the fork (the forkserver model both recommend).
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    warnings.filterwarnings("ignore", message="lancedb fork support is experimental")
    for name in preload:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()  # keep the collector from touching (and copying) inherited objects
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: run one measurement, then leave at once
            os.close(read_fd)
            code = 0
            try:
                _child(request, write_fd)
            except BaseException:
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.close(write_fd)
        data = _read_all(read_fd, time.monotonic() + float(request.get("timeout", 600)))
        os.close(read_fd)
        if data is None:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if data is None:
            response: dict[str, Any] = {"ok": False, "error": "timed out; child killed"}
        elif not data:
            response = {"ok": False, "error": f"child died (wait status {status})"}
        else:
            response = json.loads(data)
        sys.stdout.write(json.dumps(response) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
