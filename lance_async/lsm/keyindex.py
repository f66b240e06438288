"""Primary-key membership and positions, built once and probed per batch: :class:`KeyIndex`.

The LSM reads ask two questions millions of times: "is this base row's key
shadowed by a newer level?" and "where is this key's newest version?". The
answer must cost O(batch), not O(levels): ``pyarrow.compute.is_in`` builds
its hash table again on every call, which is what makes a per-batch anti-join
slow. So each immutable set of keys is indexed once, as numpy arrays:

* a single integer-like key column (integers, dates, timestamps, times,
  durations) is its own exact 64-bit code: a dense position table when the
  keys are compact, else a sorted array and ``searchsorted``;
* any other key (strings, binary, floats, composite keys) gets a 64-bit hash
  code (simple tabulation hashing over the bytes, vectorized), a sorted array
  of codes, and every hit is verified against the real key values, so a hash
  collision costs time, never a wrong answer.

Integer keys index themselves (a bitmap-like position table), any other key
by a verified hash, as the hash indexes of columnar engines do; exact, and
without pandas.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["KeyIndex", "exact_codes", "first_occurrence", "key_codes"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TABLE = np.random.default_rng(0x1A4CE).integers(0, 2**63, size=(64, 256), dtype=np.uint64) * 2 + 1
_DENSE_MAX = 1 << 25  # entries of a dense position table (int32 each) at most
_EMPTY_I64 = np.zeros(0, dtype=np.int64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def _combine(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


def exact_codes(arr: pa.Array) -> np.ndarray | None:
    """int64 codes equal iff the values are equal, for integer-like arrays.

    Returns None for other types. Blocking (O(rows), usually zero-copy).
    """
    t = arr.type
    values: np.ndarray
    if pa.types.is_integer(t):
        values = arr.to_numpy(zero_copy_only=False)
    elif pa.types.is_temporal(t) and t.bit_width in (32, 64):
        values = arr.view(pa.int64() if t.bit_width == 64 else pa.int32()).to_numpy(
            zero_copy_only=False
        )
    else:
        return None
    if values.dtype == np.uint64:
        return values.view(np.int64)
    return values.astype(np.int64, copy=False)


def _hash_binary(arr: pa.Array) -> np.ndarray:
    """64-bit codes of strings or binary values: tabulation hashing of the bytes.

    One vectorized pass per byte position (keys are short); values longer
    than 256 bytes take a per-byte pass instead.
    """
    n = len(arr)
    big = arr.cast(pa.large_binary())
    buffers = big.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[big.offset : big.offset + n + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    starts = offsets[:-1]
    lengths = np.diff(offsets)
    out = np.zeros(n, dtype=np.uint64)
    longest = int(lengths.max()) if n else 0
    if longest <= 256:
        rows = np.arange(n)
        for j in range(longest):
            if j and j % 8 == 0:
                keep = lengths[rows] > j
                rows = rows[keep]
            at = starts[rows] + j
            live = lengths[rows] > j
            vals = _TABLE[j & 63, data[at[live]]]
            rot = np.uint64(j // 64 % 63 + 1)
            out[rows[live]] ^= (vals << rot) | (vals >> (np.uint64(64) - rot))
    else:
        first = int(offsets[0])
        chunk = data[first : int(offsets[-1])]
        rel = starts - first
        nonempty = lengths > 0
        pos = np.arange(len(chunk), dtype=np.int64) - np.repeat(rel, lengths)
        vals = _TABLE[pos & 63, chunk]
        rot = ((pos >> 6) % 63 + 1).astype(np.uint64)  # 1..63: a defined shift
        vals = (vals << rot) | (vals >> (np.uint64(64) - rot))
        out[nonempty] = np.bitwise_xor.reduceat(vals, rel[nonempty])
    return _mix(out ^ (lengths.astype(np.uint64) * _GOLDEN))


def _column_codes(arr: pa.Array) -> np.ndarray:
    """uint64 codes of one key column (equal values, equal codes)."""
    exact = exact_codes(arr)
    if exact is not None:
        return exact.view(np.uint64)
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        return _hash_binary(arr)
    if pa.types.is_large_binary(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _hash_binary(arr)
    if pa.types.is_floating(t):
        values: np.ndarray = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
        return np.where(values == 0.0, 0.0, values).view(np.uint64)  # -0.0 == 0.0
    if pa.types.is_boolean(t):
        flags: np.ndarray = arr.to_numpy(zero_copy_only=False)
        return flags.astype(np.uint64)
    # anything else: Python's hash of each value (slow, but equal values agree)
    return np.array([hash(v) for v in arr.to_pylist()], dtype=np.int64).view(np.uint64)


def key_codes(columns: Sequence[pa.Array | pa.ChunkedArray]) -> tuple[np.ndarray, bool]:
    """64-bit codes of primary-key rows, and whether they are exact.

    Parameters
    ----------
    columns : sequence of pa.Array
        The key columns, equal lengths (n rows).

    Returns
    -------
    codes : np.ndarray of int64, shape (n,)
    exact : bool
        True when equal codes mean equal keys (a single integer-like
        column); otherwise codes are hashes and hits must be verified.

    Notes
    -----
    Blocking, O(n) numpy work (O(bytes) for strings).
    """
    cols = [_combine(c) for c in columns]
    if len(cols) == 1:
        exact = exact_codes(cols[0])
        if exact is not None:
            return exact, True
    acc = np.full(len(cols[0]) if cols else 0, 0x243F6A8885A308D3, dtype=np.uint64)
    for col in cols:
        acc = _mix(acc * _GOLDEN + _column_codes(col))
    return acc.view(np.int64), False


class KeyIndex:
    """Positions of primary keys in one immutable set of rows.

    Parameters
    ----------
    columns : sequence of pa.Array
        The set's key columns (n rows). A key that occurs more than once
        resolves to its first position.

    Notes
    -----
    Building is blocking: O(n log n) (a sort), or O(n) for compact integer
    keys. Probing m keys is O(m log n) or O(m). Both run on worker threads.
    Thread-safe once built (read only).
    """

    def __init__(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> None:
        self.columns = [_combine(c) for c in columns]
        codes, self.exact = key_codes(self.columns)
        self.size = len(codes)
        self._lo = 0
        self._dense: np.ndarray | None = None
        self._sorted = _EMPTY_I64
        self._order = _EMPTY_I64
        if self.size == 0:
            return
        if self.exact and self.size < 2**31:
            lo, hi = int(codes.min()), int(codes.max())
            span = hi - lo + 1
            if span <= _DENSE_MAX and span <= 32 * self.size + (1 << 16):
                table = np.full(span, -1, dtype=np.int32)
                rev = np.arange(self.size - 1, -1, -1, dtype=np.int64)
                table[codes[rev] - lo] = rev  # the first position wins (assigned last)
                self._lo, self._dense = lo, table
                return
        order = np.argsort(codes)
        ordered = codes[order]
        if len(ordered) > 1 and bool(np.any(ordered[1:] == ordered[:-1])):
            order = np.argsort(codes, kind="stable")  # equal codes: first position first
            ordered = codes[order]
        self._order, self._sorted = order, ordered

    def __len__(self) -> int:
        return self.size

    def find(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
        """Position of each probe key in the set, -1 where absent.

        Parameters
        ----------
        columns : sequence of pa.Array
            Probe key columns (m rows), of the same types as the set's.

        Returns
        -------
        np.ndarray of int64, shape (m,)
        """
        probe = [_combine(c) for c in columns]
        m = len(probe[0]) if probe else 0
        if self.size == 0 or m == 0:
            return np.full(m, -1, dtype=np.int64)
        codes, _ = key_codes(probe)
        if self._dense is not None:
            i = codes - self._lo
            inside = (i >= 0) & (i < len(self._dense))
            out = np.full(m, -1, dtype=np.int64)
            out[inside] = self._dense[i[inside]]
            return out
        if m > 64 and bool(np.any(codes[1:] < codes[:-1])):
            perm = np.argsort(codes)  # sorted probes: searchsorted stays in cache
            left = np.empty(m, dtype=np.int64)
            left[perm] = np.searchsorted(self._sorted, codes[perm], side="left")
        else:
            left = np.searchsorted(self._sorted, codes, side="left")
        clipped = np.minimum(left, self.size - 1)
        hit = self._sorted[clipped] == codes
        out = np.where(hit, self._order[clipped], -1)
        if self.exact or not hit.any():
            return out
        return self._verify(probe, codes, out, left)

    def contains(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
        """Boolean mask: which probe keys are in the set (see :meth:`find`)."""
        if self.size == 0:
            m = len(columns[0]) if columns else 0
            return np.zeros(m, dtype=bool)
        return self.find(columns) >= 0

    def _verify(
        self, probe: list[pa.Array], codes: np.ndarray, out: np.ndarray, left: np.ndarray
    ) -> np.ndarray:
        """Drop hash hits whose key differs; resolve codes shared by several keys."""
        idx = np.flatnonzero(out >= 0)
        same = self._equal(probe, idx, out[idx])
        right = np.searchsorted(self._sorted, codes[idx], side="right")
        crowded = (right - left[idx]) > 1
        out[idx[~same & ~crowded]] = -1
        for j in np.flatnonzero(crowded):  # rare: several set keys share this code
            row = int(idx[j])
            out[row] = -1
            want = [c[row].as_py() for c in probe]
            for p in self._order[left[row] : right[j]]:
                if [c[int(p)].as_py() for c in self.columns] == want:
                    out[row] = p
                    break
        return out

    def _equal(self, probe: list[pa.Array], rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        if len(rows) == 0:
            return np.zeros(0, dtype=bool)
        take_rows, take_pos = pa.array(rows), pa.array(positions)
        same = np.ones(len(rows), dtype=bool)
        for mine, theirs in zip(self.columns, probe, strict=True):
            eq = pc.equal(theirs.take(take_rows), mine.take(take_pos))
            same &= np.asarray(pc.fill_null(eq, False).to_numpy(zero_copy_only=False))
        return same


def first_occurrence(columns: list[pa.Array], total: int) -> np.ndarray:
    """Mask of the first row of each distinct key (exact, whatever the key type).

    Parameters
    ----------
    columns : list of pa.Array
        Key columns, ``total`` rows each.
    total : int

    Returns
    -------
    np.ndarray of bool, shape (total,)

    Notes
    -----
    Blocking: a sort of the key codes (an exact integer key), or Arrow's
    hash group-by (any other key, so hash collisions cannot merge keys).
    """
    codes, exact = key_codes(columns)
    win = np.zeros(total, dtype=bool)
    if exact:
        _, first = np.unique(codes, return_index=True)
        win[first] = True
        return win
    t = pa.table(
        [*columns, pa.array(np.arange(total))], names=[*map(str, range(len(columns))), "__o"]
    )
    first = t.group_by([str(i) for i in range(len(columns))], use_threads=False).aggregate(
        [("__o", "min")]
    )
    win[first.column("__o_min").to_numpy()] = True
    return win
