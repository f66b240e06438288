"""Storage failures read from what the engine gives (ground floor).

pylance raises plain ``OSError`` / ``ValueError`` for every object-store
failure. The text is object_store's (``Generic S3 error: ... Server returned
non-2xx status code: 403 Forbidden: <Error><Code>AccessDenied</Code>...``)
or, for the files lance_async reads itself, pyarrow's (``AWS Error
ACCESS_DENIED during HeadObject operation``, ``AWS Error UNKNOWN (HTTP status
503)``); a local disk's failure ends in ``(os error 28)``. :func:`storage_fault`
reads the exception's type and ``errno`` first, then the HTTP status, the
store's error code, the OS error and a few phrases of object_store and of the
HTTP client, and says which kind of failure it is. ``_engine_errors.map_engine_error``
turns that into the typed error; each phrase has a test in
``tests/test_errors.py``. Imports nothing of lance_async.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

__all__ = ["Fault", "storage_fault", "strip_engine_prefix"]

_ENGINE_PREFIX = re.compile(r"LanceError\(\w+\):\s*")
_STATUS = re.compile(r"(?:status code: |HTTP status )(\d{3})\b")
_STORE_CODE = re.compile(r"<Code>(\w+)</Code>|AWS Error ([A-Z_]+)")
_OS_ERROR = re.compile(r"\(os error (\d+)\)")

#: Error codes of S3 (and pyarrow's spelling of them), GCS and Azure.
_PERMISSION_CODES = frozenset(
    [
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "AuthorizationPermissionMismatch",
        "AuthenticationFailed",
        "ACCESS_DENIED",
        "INVALID_ACCESS_KEY_ID",
        "SIGNATURE_DOES_NOT_MATCH",
        "EXPIRED_TOKEN",
        "INVALID_CLIENT_TOKEN_ID",
        "MISSING_AUTHENTICATION_TOKEN",
        "UNRECOGNIZED_CLIENT",
    ]
)
_BUCKET_CODES = frozenset(["NoSuchBucket", "ContainerNotFound", "NO_SUCH_BUCKET"])
_OBJECT_CODES = frozenset(["NoSuchKey", "BlobNotFound", "NO_SUCH_KEY", "RESOURCE_NOT_FOUND"])
_UNAVAILABLE_CODES = frozenset(
    [
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "ServerBusy",
        "SLOW_DOWN",
        "SERVICE_UNAVAILABLE",
        "INTERNAL_FAILURE",
        "THROTTLING",
        "NETWORK_CONNECTION",
    ]
)
#: Phrases (lower case) of object_store's error kinds, the OS and the HTTP client.
_PERMISSION_PHRASES = (
    "lacked the necessary privileges",  # object_store's PermissionDenied
    "lacked valid authentication credentials",  # object_store's Unauthenticated
    "permission denied",
)
_FULL_PHRASES = ("no space left on device", "disk quota exceeded")
_UNAVAILABLE_PHRASES = (
    "error sending request",
    "connection refused",
    "connection reset",
    "connection closed before message completed",
    "broken pipe",
    "dns error",
)
_TIMEOUT_PHRASES = ("operation timed out", "deadline has elapsed", "timed out after")
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
_UNAVAILABLE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH})


@dataclass(frozen=True)
class Fault:
    """What kind of storage failure an exception is.

    Attributes
    ----------
    kind : str
        ``"permission"``, ``"bucket"`` (no such bucket), ``"object"`` (no
        such object), ``"unavailable"`` (throttled, 5xx, refused
        connection), ``"full"`` (no space) or ``"timeout"``.
    status : int or None
        The HTTP status the store answered, when the text gives it.
    code : str or None
        The store's error code (``"AccessDenied"``, ``"SLOW_DOWN"``, ...).
    """

    kind: str
    status: int | None = None
    code: str | None = None

    def describe(self, message: str) -> str:
        """What happened, the engine's ``message``, and what to do."""
        what, advice = _WORDS[self.kind]
        return f"{what}: {message}. {advice}"


#: Per kind: what happened, what to do.
_WORDS = {
    "permission": (
        "the store refused the request (permission denied)",
        "Check the credentials (storage_options, or the AWS_* / GOOGLE_* / AZURE_* "
        "variables) and the bucket's policy",
    ),
    "bucket": ("the bucket does not exist", "Check the bucket in the URI, or create it"),
    "object": (
        "a file of the table is not in the store",
        "Something deleted it (a cleanup of old versions?); open the table again",
    ),
    "unavailable": (
        "the store is unavailable or throttling, after the engine's retries",
        "Retry later",
    ),
    "full": (
        "no space left on the device holding the table",
        "Free space, then retry (a MemWAL writer: open a new one on the shard; it replays the WAL)",
    ),
    "timeout": ("the store did not answer in time", "Retry later"),
}


def strip_engine_prefix(text: str) -> str:
    """``text`` without the engine's ``LanceError(IO): `` prefixes (leading or inside)."""
    return _ENGINE_PREFIX.sub("", text)


def _by_type(exc: BaseException) -> Fault | None:
    if not isinstance(exc, OSError):
        return None
    if isinstance(exc, PermissionError) or exc.errno in _PERMISSION_ERRNOS:
        return Fault("permission")
    if exc.errno in _FULL_ERRNOS:
        return Fault("full")
    if isinstance(exc, TimeoutError) or exc.errno == errno.ETIMEDOUT:
        return Fault("timeout")
    if isinstance(exc, ConnectionError) or exc.errno in _UNAVAILABLE_ERRNOS:
        return Fault("unavailable")
    return None


def storage_fault(exc: BaseException, text: str | None = None) -> Fault | None:
    """The kind of storage failure ``exc`` is, or None when it is none.

    Parameters
    ----------
    exc : BaseException
        An exception of the engine or of a pyarrow filesystem.
    text : str, optional
        Its message (default ``str(exc)``), for example a part of it.

    Notes
    -----
    The type and ``errno`` decide first (``PermissionError``,
    ``TimeoutError``, ``ConnectionError``, ENOSPC / EDQUOT); then the text:
    a full disk, a refusal (401 / 403, a permission code or phrase), a
    missing bucket or object (its code, or a 404 from the store), an
    unavailable store (429 / 5xx, its code, a refused or reset connection),
    a timeout. Does not block.
    """
    found = _by_type(exc)
    if found is not None:
        return found
    text = str(exc) if text is None else text
    lowered = text.lower()
    match = _STATUS.search(text)
    status = int(match.group(1)) if match else None
    match = _STORE_CODE.search(text)
    code = (match.group(1) or match.group(2)) if match else None
    errnos = {int(n) for n in _OS_ERROR.findall(text)}
    if errnos & _FULL_ERRNOS or any(p in lowered for p in _FULL_PHRASES):
        return Fault("full", status, code)
    if (
        code in _PERMISSION_CODES
        or status in (401, 403)
        or errnos & _PERMISSION_ERRNOS
        or any(p in lowered for p in _PERMISSION_PHRASES)
    ):
        return Fault("permission", status, code)
    if code in _BUCKET_CODES:
        return Fault("bucket", status, code)
    if code in _OBJECT_CODES or (status == 404 and "non-2xx" in text):
        return Fault("object", status, code)
    timed_out = errno.ETIMEDOUT in errnos or any(p in lowered for p in _TIMEOUT_PHRASES)
    if (
        code in _UNAVAILABLE_CODES
        or (status is not None and (status == 429 or 500 <= status < 600))
        or errnos & _UNAVAILABLE_ERRNOS
        or any(p in lowered for p in _UNAVAILABLE_PHRASES)
    ):
        return Fault("timeout" if timed_out and status is None else "unavailable", status, code)
    if timed_out:
        return Fault("timeout", status, code)
    return None
