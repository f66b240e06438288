"""The soak's child processes (``bench/soak.py``).

``python -m bench.soak_proc writer|reader URI SECONDS RATE KEYS RETENTION LOG``
"""

from __future__ import annotations

import sys

import anyio

from .soak import reader, writer


def main(argv: list[str]) -> None:
    mode, uri, seconds, rate, keys, retention, log = argv
    if mode == "writer":
        anyio.run(writer, uri, float(seconds), float(rate), int(keys), float(retention), log)
    else:
        anyio.run(reader, uri, float(seconds), int(keys), log)


if __name__ == "__main__":
    main(sys.argv[1:])
