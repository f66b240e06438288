"""Reading MemWAL state that the engine does not expose (read-only).

The engine has no public API that lists a shard's flushed generations
(SSTables), where its WAL replay starts, or the generations already
compacted into the base table, so lance_async reads them from storage,
defensively. What is relied on (the MemWAL layout of the pylance release
``pyproject.toml`` pins; docs/engine-notes.md):

Shard manifests
    ``<table>/_mem_wal/<shard uuid>/manifest/<64 binary digits>.binpb``. The
    file name is the manifest version written in binary, least significant
    bit first; ``version_hint.json`` holds ``{"version": N}`` but may lag.
    Each file is a protobuf ``ShardManifest``: field 1 version, 2
    writer_epoch, 3 replay_after_wal_entry_position (the last WAL position a
    flushed generation covers; absent means 0), 4 wal_entry_position_last_seen
    (a hint), 5 shard_spec_id, 6 current_generation, 8 repeated SSTable
    entries ``{1 generation, 2 path, 4 rows}``, 11 the shard id. ``path`` is
    the generation folder (``<8 hex>_gen_<N>``) relative to the shard folder,
    which is how ``ShardSnapshot.with_sstable`` wants it.
Compaction progress
    Kept in the dataset manifest, in the ``__lance_mem_wal`` index's details
    (``google.protobuf.Any`` with type URL ``/lance.table.MemWalIndexDetails``):
    field 9, repeated ``{1 {1 shard uuid (16 bytes)}, 2 generation}`` -- the
    highest generation compacted per shard. Read from the dataset manifest
    file of the version in hand (``_versions/``, V2 or V1 naming).

Any file that does not decode as expected raises :class:`ManifestFormatError`
(never a wrong answer): the read fails loudly rather than guessing, and the
error names the file. A shard's newest manifest that is half-written is
skipped for the one before it (up to three).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from .._storage import filesystem
from ..errors import ManifestFormatError

__all__ = [
    "ManifestFile",
    "ShardManifest",
    "SsTableEntry",
    "compacted_generations",
    "list_shards",
    "manifest_files",
    "parse_position",
    "position_name",
    "read_manifest_file",
    "read_shard_manifest",
]

_U64_MAX = (1 << 64) - 1
_MEMWAL_TYPE_URL = b"/lance.table.MemWalIndexDetails"


# -- protobuf wire format (just enough) ---------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ManifestFormatError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((num, value))
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ManifestFormatError("truncated field")
            out.append((num, buf[i : i + n]))
            i += n
        elif wire == 1:
            out.append((num, buf[i : i + 8]))
            i += 8
        elif wire == 5:
            out.append((num, buf[i : i + 4]))
            i += 4
        else:
            raise ManifestFormatError(f"unsupported wire type {wire}")
    return out


# -- storage ------------------------------------------------------------------


def _fs(uri: str, storage_options: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    return filesystem(uri, storage_options)


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return bytes(f.read())


def _children(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    try:
        return list(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))
    except FileNotFoundError:
        return []


# -- shard manifests -----------------------------------------------------------


@dataclass(frozen=True)
class SsTableEntry:
    """One flushed generation of a shard."""

    generation: int
    path: str
    rows: int | None = None


@dataclass(frozen=True)
class ShardManifest:
    """The decoded newest manifest of one shard.

    Attributes
    ----------
    replay_after : int
        The last WAL position that a flushed generation covers (0: none): a
        writer reopening the shard replays the WAL entries after it.
    last_seen : int
        The newest WAL position its writer had seen when it wrote the
        manifest (a hint, not authoritative).
    """

    shard_id: str
    version: int
    writer_epoch: int
    spec_id: int
    current_generation: int
    sstables: tuple[SsTableEntry, ...] = field(default_factory=tuple)
    replay_after: int = 0
    last_seen: int = 0


def _decode_shard_manifest(data: bytes, shard_id: str) -> ShardManifest:
    version = epoch = spec = current = replay_after = last_seen = 0
    sstables: list[SsTableEntry] = []
    for num, value in _fields(data):
        if num == 1 and isinstance(value, int):
            version = value
        elif num == 2 and isinstance(value, int):
            epoch = value
        elif num == 3 and isinstance(value, int):
            replay_after = value
        elif num == 4 and isinstance(value, int):
            last_seen = value
        elif num == 5 and isinstance(value, int):
            spec = value
        elif num == 6 and isinstance(value, int):
            current = value
        elif num == 8 and isinstance(value, bytes):
            gen = 0
            path = ""
            rows: int | None = None
            for n2, v2 in _fields(value):
                if n2 == 1 and isinstance(v2, int):
                    gen = v2
                elif n2 == 2 and isinstance(v2, bytes):
                    path = v2.decode("utf-8")
                elif n2 == 4 and isinstance(v2, int):
                    rows = v2
            if gen <= 0 or "_gen_" not in path or not path.endswith(f"_gen_{gen}"):
                raise ManifestFormatError(f"unexpected SSTable entry {gen!r} {path!r}")
            sstables.append(SsTableEntry(gen, path, rows))
    if version <= 0 or current <= 0:
        raise ManifestFormatError("shard manifest without version or current generation")
    return ShardManifest(
        shard_id,
        version,
        epoch,
        spec,
        current,
        tuple(sorted(sstables, key=lambda s: s.generation)),
        replay_after,
        last_seen,
    )


def position_name(position: int, suffix: str) -> str:
    """The file name of a manifest version or WAL position: its 64 bits, least
    significant first (the engine's bit-reversed naming), then ``suffix``."""
    return format(position, "064b")[::-1] + suffix


def parse_position(name: str, suffix: str = ".binpb") -> int | None:
    """The position a file name encodes (:func:`position_name`), or None."""
    stem = name[: -len(suffix)] if name.endswith(suffix) else None
    if stem is None or len(stem) != 64 or set(stem) - {"0", "1"}:
        return None
    return int(stem[::-1], 2)


def list_shards(uri: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """Shard ids that have a folder under ``<uri>/_mem_wal`` (blocking)."""
    fs, root = _fs(uri, storage_options)
    out = []
    for info in _children(fs, root + "/_mem_wal"):
        if info.type == pafs.FileType.Directory:
            name = info.base_name
            try:
                uuid.UUID(name)
            except ValueError:
                continue
            out.append(name)
    return sorted(out)


_CACHE_SIZE = 1024
# Manifest files never change once written: decoded ones are kept, keyed by
# path, size and mtime (so a table deleted and created again is not confused).
_decoded: dict[str, ShardManifest] = {}
_compacted: dict[tuple[str, str], dict[str, int]] = {}


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    if len(cache) >= _CACHE_SIZE:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def read_shard_manifest(
    uri: str, shard_id: str, storage_options: Mapping[str, str] | None = None
) -> ShardManifest | None:
    """The newest decodable manifest of a shard, or None if it has none (blocking).

    Raises
    ------
    ManifestFormatError
        Manifest files exist but none decodes as expected.
    """
    fs, root = _fs(uri, storage_options)
    folder = f"{root}/_mem_wal/{shard_id}/manifest"
    versions: list[tuple[int, str, str]] = []
    for info in _children(fs, folder):
        v = parse_position(info.base_name)
        if v is not None:  # the cache key also tells a re-created file apart
            versions.append((v, info.path, f"{info.path}:{info.size}:{info.mtime_ns}"))
    if not versions:
        return None
    errors: list[str] = []
    for _v, path, key in sorted(versions, reverse=True)[:3]:
        if key in _decoded:
            return _decoded[key]
        try:
            manifest = _decode_shard_manifest(read_bytes(fs, path), shard_id)
        except (ManifestFormatError, OSError) as exc:  # a newer file may be mid-write
            errors.append(f"{path}: {exc}")
            continue
        result: ShardManifest = _remember(_decoded, key, manifest)
        return result
    raise ManifestFormatError("no shard manifest decodes: " + "; ".join(errors))


@dataclass(frozen=True)
class ManifestFile:
    """One stored version of a shard manifest.

    Attributes
    ----------
    version : int
    path : str
        In the table's filesystem (:func:`lance_async._storage.filesystem`).
    mtime_ns : int
        When the store wrote it, in nanoseconds since the epoch (the store's clock).
    size : int
        Bytes.
    """

    version: int
    path: str
    mtime_ns: int
    size: int

    @property
    def mtime(self) -> float:
        """``mtime_ns`` in seconds."""
        return self.mtime_ns / 1e9


def manifest_files(
    uri: str, shard_id: str, storage_options: Mapping[str, str] | None = None
) -> list[ManifestFile]:
    """Every stored version of a shard's manifest, oldest first (blocking; one listing)."""
    fs, root = _fs(uri, storage_options)
    out = []
    for info in _children(fs, f"{root}/_mem_wal/{shard_id}/manifest"):
        v = parse_position(info.base_name)
        if v is not None and info.type == pafs.FileType.File:
            out.append(ManifestFile(v, info.path, info.mtime_ns or 0, info.size or 0))
    return sorted(out, key=lambda m: m.version)


def read_manifest_file(
    uri: str, shard_id: str, file: ManifestFile, storage_options: Mapping[str, str] | None = None
) -> ShardManifest:
    """One stored manifest version, decoded (blocking; cached: versions never change).

    Raises
    ------
    ManifestFormatError
        It does not decode as a shard manifest.
    OSError
        The store failed (FileNotFoundError: it was removed meanwhile).
    """
    key = f"{file.path}:{file.size}:{file.mtime_ns}"
    hit = _decoded.get(key)
    if hit is not None:
        return hit
    fs, _root = _fs(uri, storage_options)
    manifest = _decode_shard_manifest(read_bytes(fs, file.path), shard_id)
    result: ShardManifest = _remember(_decoded, key, manifest)
    return result


# -- compaction progress --------------------------------------------------------


def _dataset_manifest_path(fs: pafs.FileSystem, root: str, version: int) -> pafs.FileInfo:
    for name in (f"{_U64_MAX - version:020d}.manifest", f"{version}.manifest"):
        info = fs.get_file_info(f"{root}/_versions/{name}")
        if info.type == pafs.FileType.File:
            return info
    raise ManifestFormatError(f"no manifest file for version {version} under {root}/_versions")


def compacted_generations(
    uri: str, version: int, storage_options: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Highest compacted generation per shard id, as of dataset ``version`` (blocking).

    Returns
    -------
    dict of str to int
        Empty when the MemWAL index records no compaction.

    Raises
    ------
    ManifestFormatError
        The MemWAL index details are present but not in the known layout.
    """
    fs, root = _fs(uri, storage_options)
    info = _dataset_manifest_path(fs, root, version)
    key = (info.path, f"{info.size}:{info.mtime_ns}")
    cached = _compacted.get(key)
    if cached is not None:
        return dict(cached)
    data = read_bytes(fs, info.path)
    at = data.rfind(_MEMWAL_TYPE_URL)
    if at < 0:
        _remember(_compacted, key, {})
        return {}
    i = at + len(_MEMWAL_TYPE_URL)
    if i >= len(data) or data[i] != 0x12:
        raise ManifestFormatError("MemWalIndexDetails: no value after the type URL")
    n, i = _varint(data, i + 1)
    details = data[i : i + n]
    out: dict[str, int] = {}
    for num, value in _fields(details):
        if num != 9 or not isinstance(value, bytes):
            continue
        shard: str | None = None
        gen: int | None = None
        for n2, v2 in _fields(value):
            if n2 == 1 and isinstance(v2, bytes):
                inner = [v for k, v in _fields(v2) if k == 1 and isinstance(v, bytes)]
                if len(inner) != 1 or len(inner[0]) != 16:
                    raise ManifestFormatError("compacted SSTable entry without a 16-byte shard id")
                shard = str(uuid.UUID(bytes=inner[0]))
            elif n2 == 2 and isinstance(v2, int):
                gen = v2
        if shard is None or gen is None:
            raise ManifestFormatError("incomplete compacted SSTable entry")
        out[shard] = max(out.get(shard, 0), gen)
    _remember(_compacted, key, dict(out))
    return out
