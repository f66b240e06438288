"""JSON text (``application/json``): an array of objects, decoded as it arrives.

A JSON body or ``.json`` file is an array of row objects (what ``httpx``'s
``json=`` and most clients send), or objects one after the other (NDJSON, or
a single object). :class:`JsonTextDecoder` turns the text into NDJSON as
chunks arrive -- the array's brackets become spaces, the commas between its
elements newlines, and newlines inside an element spaces -- and hands that
to :class:`~lance_async.sources.decoders.NdjsonDecoder`, so JSON is decoded
by the one coercion rule of :mod:`lance_async.sources.jsonrows` on every
path, with the same nesting limit. Errors name the element (``object 3 of
the array``) and the field.

The cut is vectorized (numpy): strings are found from the unescaped quotes
(a run of backslashes carried over from the previous chunk counts), the
nesting from the brackets outside strings. Nothing recurses, so deep input
costs nothing here; it is refused past :data:`~lance_async.sources.jsonrows.MAX_JSON_DEPTH`
levels before any parser sees it.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import DecodeError
from .jsonrows import MAX_JSON_DEPTH

__all__ = ["NDJSON_CHUNK", "JsonTextSplitter", "element_error", "infer_json_sample", "to_ndjson"]

_WS = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"
_STRUCT = np.zeros(256, dtype=bool)
_STRUCT[[ord(c) for c in "[]{},\n"]] = True
_STEP = np.zeros(256, dtype=np.int64)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_QUOTE, _BACKSLASH, _COMMA, _NL = ord('"'), ord("\\"), ord(","), ord("\n")
_LINE = re.compile(r"^line (\d+)")


class JsonTextSplitter:
    """JSON text in, NDJSON out, chunk by chunk (the state carries over).

    Array mode (the text starts with ``[``): one output line per element.
    Object mode (it starts with ``{``): the text is NDJSON already; newlines
    inside an object become spaces, so a pretty-printed object is one line.

    Raises
    ------
    DecodeError
        The text starts with something else, has data after the array, or
        nests deeper than :data:`MAX_JSON_DEPTH` levels (the array not
        counted).

    Notes
    -----
    Blocking CPU work, linear in the chunk (numpy); call it where the
    decoder runs (a worker thread).
    """

    def __init__(self, max_depth: int = MAX_JSON_DEPTH) -> None:
        self.mode: str | None = None  # "array" or "objects" once the first byte is seen
        self.closed = False  # the array's closing bracket was read
        self._depth = 0
        self._in_string = False
        self._backslashes = 0  # trailing backslashes of the last chunk, inside a string
        self._max = max_depth
        self._bom = True
        self._head = bytearray()  # bytes before the mode is known

    def _start(self, chunk: bytes) -> bytes:
        """Decide the mode from the first non-blank byte; drop a byte-order mark.
        Returns the text to process (empty while undecided)."""
        self._head += chunk
        if self._bom:
            if len(self._head) < len(_BOM) and _BOM.startswith(self._head):
                return b""  # perhaps a byte-order mark: decide on the next chunk
            self._head = bytearray(bytes(self._head).removeprefix(_BOM))
            self._bom = False
        head = bytes(self._head).lstrip(_WS)
        self._head = bytearray()
        if head:
            if head[:1] == b"[":
                self.mode = "array"
            elif head[:1] == b"{":
                self.mode = "objects"
            else:
                shown = head[:20].decode("utf-8", errors="replace")
                raise DecodeError(
                    f"expected a JSON array of objects (or objects), got {shown!r}..."
                )
        return head

    def feed(self, chunk: bytes) -> bytes:
        """The NDJSON text of ``chunk`` (the same length, but for leading blanks,
        a byte-order mark and what follows the array)."""
        if self.mode is None:
            chunk = self._start(chunk)  # empty while the mode is not known
            if not chunk:
                return b""
        if self.closed:
            if chunk.strip(_WS):
                raise DecodeError("data after the end of the JSON array")
            return b""
        arr = np.frombuffer(chunk, dtype=np.uint8)
        structural = np.flatnonzero(_STRUCT[arr])
        quotes = np.flatnonzero(arr == _QUOTE)
        carry = self._backslashes if self._in_string else 0
        if len(quotes):
            quotes = self._unescaped(arr, quotes, carry)
        # the trailing backslashes of this chunk, for a quote at the next one's start
        tail = len(chunk) - len(chunk.rstrip(b"\\"))
        run_to_start = tail == len(chunk)
        before = np.searchsorted(quotes, structural)  # unescaped quotes before each
        outside = ((before & 1) == 1) == self._in_string
        structural = structural[outside]
        string_after = self._in_string ^ bool(len(quotes) & 1)
        self._backslashes = (carry + tail if run_to_start else tail) if string_after else 0
        self._in_string = string_after
        if not len(structural):
            return chunk
        codes = arr[structural]
        steps = _STEP[codes]
        after = self._depth + np.cumsum(steps)
        depth_before = after - steps
        out = bytearray(chunk)
        deepest = int(after.max(initial=self._depth))
        limit = self._max + (1 if self.mode == "array" else 0)
        if deepest > limit:
            raise DecodeError(f"JSON nested deeper than {self._max} levels; nothing was decoded")
        if self.mode == "array":
            for at in structural[codes == _NL]:
                out[at] = 0x20
            for at in structural[(codes == _COMMA) & (depth_before == 1)]:
                out[at] = _NL
            opening = structural[(depth_before == 0) & (steps == 1)]
            closing = structural[(after == 0) & (steps == -1)]
            if self._depth == 0 and len(opening):
                out[opening[0]] = 0x20
                if len(opening) > 1:
                    raise DecodeError("data after the end of the JSON array")
            if len(closing):
                end = int(closing[0])
                out[end] = 0x20
                self.closed = True
                if chunk[end + 1 :].strip(_WS):
                    raise DecodeError("data after the end of the JSON array")
                del out[end + 1 :]
        else:
            for at in structural[(codes == _NL) & (depth_before > 0)]:
                out[at] = 0x20
        self._depth = int(after[-1])
        return bytes(out)

    @staticmethod
    def _unescaped(arr: np.ndarray, quotes: np.ndarray, carry: int) -> np.ndarray:
        """The quotes not escaped by an odd run of backslashes (``carry`` of
        them ended the previous chunk)."""
        bs = arr == _BACKSLASH
        if not bs.any() and not carry:
            return quotes
        idx = np.arange(len(arr))
        last_other = np.maximum.accumulate(np.where(bs, -1, idx))
        prev = quotes - 1
        runs = np.where(prev >= 0, prev - last_other[np.maximum(prev, 0)], 0)
        reaches_start = np.where(prev >= 0, last_other[np.maximum(prev, 0)] < 0, True)
        runs = runs + np.where(reaches_start, carry, 0)
        kept: np.ndarray = quotes[(runs & 1) == 0]
        return kept

    def finish(self) -> None:
        """Raise if the text ended inside the array, a string or an object."""
        if self.mode == "array" and not self.closed:
            raise DecodeError("the JSON array is not closed (the text ended inside it)")


def element_error(exc: DecodeError, mode: str | None) -> DecodeError:
    """``line N: ...`` from the NDJSON decoder as ``object N of the array: ...``."""
    if mode != "array":
        return exc
    message = _LINE.sub(lambda m: f"object {m.group(1)} of the array", str(exc))
    return DecodeError(message, offset=exc.offset, field=getattr(exc, "field", None))


def infer_json_sample(head: bytes) -> bytes:
    """The complete rows at the start of JSON text, as NDJSON (to infer a schema)."""
    splitter = JsonTextSplitter()
    text = splitter.feed(head)
    cut = text.rfind(b"\n")
    if splitter.closed:
        return text
    return text[: cut + 1] if cut >= 0 else text


NDJSON_CHUNK = 1 << 18
"""Bytes :func:`to_ndjson` cuts at a time: the cut's numpy arrays (several
bytes per structural character) stay a few MB whatever the text's size."""


def to_ndjson(data: bytes | bytearray) -> bytearray:
    """Whole JSON text as NDJSON (see :class:`JsonTextSplitter`).

    Cut :data:`NDJSON_CHUNK` bytes at a time into one buffer of the input's
    size, so a large text costs one copy of itself (returned as that
    ``bytearray``, not copied again into ``bytes``).
    """
    splitter = JsonTextSplitter()
    out = bytearray(len(data))  # the text is never longer than the input
    view = memoryview(data)
    end = 0
    for start in range(0, len(data), NDJSON_CHUNK):
        piece = splitter.feed(bytes(view[start : start + NDJSON_CHUNK]))
        out[end : end + len(piece)] = piece
        end += len(piece)
    splitter.finish()
    del out[end:]
    return out
