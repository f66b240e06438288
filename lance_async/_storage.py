"""Object-store filesystems built from a table's ``storage_options`` (ground floor).

lance_async asks the engine for everything it can; the few files it reads
itself (MemWAL shard manifests, the dataset manifest's compaction record,
the example server's list of tables) are read through a pyarrow filesystem
built from the *same* ``storage_options`` the table was opened with, so no
path falls back to default credentials or the public endpoint when the
table names another. Without options, pyarrow reads the standard ``AWS_*``
environment variables, as Lance does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

__all__ = ["filesystem", "join"]


def join(root: str, name: str) -> str:
    """``root/name`` for a local path or a URI."""
    return f"{root.rstrip('/')}/{name}"


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _s3(options: Mapping[str, str]) -> pafs.FileSystem:
    """A pyarrow S3 filesystem built from Lance-style ``storage_options``.

    Keys (Lance / object_store spellings): ``aws_access_key_id`` /
    ``access_key_id``, ``aws_secret_access_key`` / ``secret_access_key``,
    ``aws_session_token`` / ``session_token``, ``aws_region`` / ``region``,
    ``aws_endpoint`` / ``aws_endpoint_url`` / ``endpoint``, ``allow_http``.
    Keys absent here fall back to the standard ``AWS_*`` environment
    variables, as Lance itself does.
    """

    def get(*keys: str) -> str | None:
        for key in keys:
            if options.get(key):
                return str(options[key])
        return None

    endpoint = get("aws_endpoint", "aws_endpoint_url", "endpoint", "endpoint_url")
    kwargs: dict[str, Any] = {}
    key_id = get("aws_access_key_id", "access_key_id")
    secret = get("aws_secret_access_key", "secret_access_key")
    if key_id and secret:
        kwargs.update(access_key=key_id, secret_key=secret)
        token = get("aws_session_token", "session_token", "token")
        if token:
            kwargs["session_token"] = token
    region = get("aws_region", "region")
    if region:
        kwargs["region"] = region
    if endpoint:
        kwargs["endpoint_override"] = endpoint
        if endpoint.startswith("http://") or _truthy(get("allow_http")):
            kwargs["scheme"] = "http"
    if _truthy(get("aws_virtual_hosted_style_request", "virtual_hosted_style_request")):
        kwargs["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**kwargs)


_FILESYSTEMS: dict[tuple[str, tuple[tuple[str, str], ...]], pafs.FileSystem] = {}


def filesystem(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding ``uri``, and the path in it.

    ``s3://`` URIs get an S3 filesystem built from ``storage_options`` (the
    table's: never the public endpoint when the table names another); other
    URIs pyarrow's own resolution.
    """
    if "://" not in uri:
        uri = os.path.abspath(uri)
    scheme, _, rest = uri.partition("://")
    if scheme in ("s3", "s3a"):
        key = ("s3", tuple(sorted((storage_options or {}).items())))
        fs = _FILESYSTEMS.get(key)
        if fs is None:
            fs = _FILESYSTEMS[key] = _s3(storage_options or {})
        return fs, rest.rstrip("/")
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")
