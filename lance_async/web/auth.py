"""API keys with scopes, as a FastAPI dependency: :class:`ApiKeyAuth`.

A client sends its key as a bearer token (``Authorization: Bearer <token>``,
RFC 6750) or in ``X-API-Key`` -- the two forms FastAPI's security classes
document and object stores' HTTP front ends use. Each key has an id (what
logs and errors name, never the secret) and a :class:`Scope`: ``read``
(tables, rows, lookups), ``write`` (merge and ingest, and read) or
``admin`` (everything). The server keeps only a SHA-256 digest of each token
(as GitHub and most API-key services do for random tokens: a token of 256
random bits needs no slow hash), and compares the digest of what a client
sends with every key's in constant time (:func:`hmac.compare_digest`, no
early exit), so neither the secrets nor which key nearly matched leak
through timing.

Routes ask for a scope the FastAPI way, ``Security(auth, scopes=["write"])``
(FastAPI's OAuth2-scopes pattern); :class:`ApiKeyAuth` reads the scopes
from :class:`fastapi.security.SecurityScopes`. An app with its own
authentication (OAuth2, JWT, mTLS at a proxy) passes its own dependency
instead -- any callable FastAPI can resolve, reading ``SecurityScopes`` if it
cares about scopes -- to :func:`lance_async.web.routes.table_router` or
:func:`lance_async.web.server.create_app`.

Keys come from the serve settings (:mod:`lance_async.web.settings`): inline
(an id, a scope and a ``sha256`` digest or, less safely, the ``token``
itself) or from a file of hashed keys, one per line::

    # id     scope   digest of the token
    ci       write   sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    grafana  read    sha256:...

``lance-async keygen ID --scope SCOPE >> keys.txt`` makes a token, prints
it on standard error (once: only its digest is kept) and the line on
standard output. ``lance-async serve`` watches the file: a key added or
removed there is accepted or refused from the next request on, without a
restart (:mod:`lance_async.web.keyfile`).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import (
    APIKeyHeader,
    HTTPAuthorizationCredentials,
    HTTPBearer,
    SecurityScopes,
)

from .errors import AuthenticationError, PermissionDeniedError

__all__ = [
    "PRINCIPAL_SCOPE_KEY",
    "ApiKey",
    "ApiKeyAuth",
    "Principal",
    "Scope",
    "check_scope",
    "hash_token",
    "new_token",
    "parse_key_lines",
    "read_key_file",
]

#: The largest credential looked at (longer ones match no key).
MAX_TOKEN_CHARS = 1024
#: The shortest token a key may be made from.
MIN_TOKEN_CHARS = 16
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces
_DIGEST = re.compile(r"[0-9a-fA-F]{64}")

#: The ASGI scope key under which :class:`ApiKeyAuth` leaves the :class:`Principal`.
PRINCIPAL_SCOPE_KEY = "lance_async.principal"


class Scope(str, enum.Enum):
    """What a key may do; each scope covers the ones before it.

    ``READ`` lists tables and reads rows; ``WRITE`` also merges and ingests;
    ``ADMIN`` may do everything (and is what ``/metrics`` and ``/docs`` may
    be set to need).
    """

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        """0 for read, 1 for write, 2 for admin."""
        return _RANKS[self]

    def covers(self, needed: Scope) -> bool:
        """True when a key of this scope may do what ``needed`` allows."""
        return self.rank >= needed.rank

    @classmethod
    def parse(cls, value: str | Scope) -> Scope:
        """The scope named ``value`` (``"read"``, ``"write"``, ``"admin"``).

        Raises
        ------
        ValueError
            No scope has that name.
        """
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"unknown scope {str(value)[:32]!r}: use read, write or admin"
            ) from None


_RANKS = {Scope.READ: 0, Scope.WRITE: 1, Scope.ADMIN: 2}


def new_token() -> str:
    """A new random token: ``la_`` and 43 URL-safe characters (256 bits).

    Uses :func:`secrets.token_urlsafe`; does not block.
    """
    return "la_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> bytes:
    """The SHA-256 digest (32 bytes) of a token's UTF-8 bytes, as stored."""
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


@dataclass(frozen=True)
class ApiKey:
    """One key the server accepts: an id, a scope and the digest of its token.

    Attributes
    ----------
    id : str
        The name logs and errors use (``[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}``).
    scope : Scope
    sha256 : bytes
        The SHA-256 digest of the token (32 bytes); the token itself is not kept.

    Raises
    ------
    ValueError
        A bad id, or a digest that is not 32 bytes.
    """

    id: str
    scope: Scope
    sha256: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _KEY_ID.fullmatch(self.id):
            raise ValueError(
                f"invalid key id {str(self.id)[:64]!r}: letters, digits, '_', '.', '@', '-' "
                "(at most 64, starting with a letter or digit)"
            )
        object.__setattr__(self, "scope", Scope.parse(self.scope))
        if not isinstance(self.sha256, bytes) or len(self.sha256) != 32:
            raise ValueError(f"key {self.id!r}: the sha256 digest must be 32 bytes")

    def __repr__(self) -> str:  # never print the digest
        return f"ApiKey(id={self.id!r}, scope={self.scope.value!r})"

    @classmethod
    def from_token(cls, id: str, scope: Scope | str, token: str) -> ApiKey:
        """The key of a token (only its digest is kept).

        Raises
        ------
        ValueError
            The token is shorter than 16 characters, or not printable ASCII
            without spaces; or a bad id or scope.
        """
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise ValueError(f"key {id!r}: a token is printable ASCII without spaces")
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"key {id!r}: a token of {len(token)} characters is too easy to guess; use at "
                f"least {MIN_TOKEN_CHARS} random ones (lance-async keygen makes 256-bit ones)"
            )
        return cls(id, Scope.parse(scope), hash_token(token))

    @classmethod
    def from_hex(cls, id: str, scope: Scope | str, digest: str) -> ApiKey:
        """The key of a hex SHA-256 digest (64 hex digits, an optional ``sha256:`` prefix).

        Raises
        ------
        ValueError
            Not 64 hex digits; or a bad id or scope.
        """
        text = digest.removeprefix("sha256:") if isinstance(digest, str) else ""
        if not _DIGEST.fullmatch(text):
            raise ValueError(f"key {id!r}: a sha256 digest is 64 hex digits")
        return cls(id, Scope.parse(scope), bytes.fromhex(text))

    def line(self) -> str:
        """This key as a line of a key file: ``ID SCOPE sha256:HEX``."""
        return f"{self.id} {self.scope.value} sha256:{self.sha256.hex()}"


def parse_key_lines(text: str, *, source: str = "keys") -> list[ApiKey]:
    """Keys from the text of a key file (``ID SCOPE sha256:HEX`` per line, ``#`` comments).

    Raises
    ------
    ValueError
        A line that does not parse, naming ``source`` and the line number.
    """
    keys = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("sha256:"):
            raise ValueError(f"{source} line {number}: expected 'ID SCOPE sha256:HEX'")
        try:
            keys.append(ApiKey.from_hex(parts[0], parts[1], parts[2]))
        except ValueError as exc:
            raise ValueError(f"{source} line {number}: {exc}") from None
    return keys


def read_key_file(path: str | os.PathLike[str]) -> list[ApiKey]:
    """Keys from a file of hashed keys (see :func:`parse_key_lines`; blocks: read it at startup).

    Raises
    ------
    ValueError
        The file cannot be read, or a line does not parse.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the key file {os.fspath(path)!r}: {exc}") from None
    return parse_key_lines(text, source=f"key file {os.fspath(path)!r}")


@dataclass(frozen=True)
class Principal:
    """Who a request is: the id and scope of the key it came with.

    Attributes
    ----------
    key_id : str
    scope : Scope
    """

    key_id: str
    scope: Scope


_BEARER = HTTPBearer(auto_error=False, description="A lance_async API key as a bearer token")
_API_KEY = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="A lance_async API key (alternative header)"
)


class ApiKeyAuth:
    """A FastAPI dependency that admits requests carrying a known key of the scope asked for.

    Parameters
    ----------
    keys : iterable of ApiKey
        The keys accepted; ids must be unique, digests too.

    Raises
    ------
    ValueError
        No keys, or a repeated id or digest.

    Notes
    -----
    Use it as ``Security(auth, scopes=["write"])`` (the highest scope named
    is needed; none: any known key). It returns the :class:`Principal` and
    leaves it in the request scope for the audit log. A request without
    credentials is a 401 :class:`~lance_async.web.errors.AuthenticationError`
    (``WWW-Authenticate: Bearer realm="lance_async"``), one whose token
    matches no key a 401 with ``error="invalid_token"``, a key whose scope
    is too narrow a 403 :class:`~lance_async.web.errors.PermissionDeniedError`.
    Runs on the event loop: one SHA-256 and one constant-time comparison per
    key, no I/O.
    """

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._keys = _checked_keys(keys)

    def replace_keys(self, keys: Iterable[ApiKey]) -> None:
        """Accept ``keys`` from now on instead of the current ones (a key file reloaded).

        The set is checked whole first (the rules of the constructor); a set
        that fails them changes nothing. Requests already admitted keep
        running; the next one is checked against the new keys. Runs on the
        event loop; does not block.

        Raises
        ------
        ValueError, TypeError
            No keys, a repeated id or digest, or an object that is not an
            :class:`ApiKey` (the current keys stay).
        """
        self._keys = _checked_keys(keys)

    def __repr__(self) -> str:
        return f"ApiKeyAuth({len(self._keys)} keys)"

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """The keys accepted."""
        return self._keys

    def authenticate(self, token: str | None) -> Principal:
        """The principal of a presented token (no scope check).

        Raises
        ------
        AuthenticationError
            No token, or no key matches it.
        """
        if not token:
            raise AuthenticationError(
                "authentication required: send 'Authorization: Bearer <token>' "
                "(or 'X-API-Key: <token>')",
                reason="missing",
            )
        digest = hash_token(token[:MAX_TOKEN_CHARS])
        found: ApiKey | None = None
        for key in self._keys:  # every key, always: no early exit to time
            if hmac.compare_digest(digest, key.sha256) and len(token) <= MAX_TOKEN_CHARS:
                found = key
        if found is None:
            raise AuthenticationError("the token matches no key of this server", reason="invalid")
        return Principal(found.id, found.scope)

    def authorize(self, token: str | None, scopes: Iterable[str] = ()) -> Principal:
        """The principal of a token whose key covers every scope in ``scopes``.

        Raises
        ------
        AuthenticationError
            No token, or no key matches it.
        PermissionDeniedError
            The key's scope does not cover the highest scope asked for.
        ValueError
            An unknown scope name in ``scopes`` (a mistake in the app).
        """
        principal = self.authenticate(token)
        check_scope(principal, scopes)
        return principal

    async def __call__(
        self,
        request: Request,
        security_scopes: SecurityScopes,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
        api_key: Annotated[str | None, Depends(_API_KEY)],
    ) -> Principal:
        """The dependency: the token from ``Authorization: Bearer`` (or
        ``X-API-Key``), checked against the scopes the route asks for."""
        token = bearer.credentials if bearer is not None else api_key
        principal = self.authenticate(token)
        request.scope[PRINCIPAL_SCOPE_KEY] = principal  # for the audit log, even if refused
        check_scope(principal, security_scopes.scopes)
        return principal


def _checked_keys(keys: Iterable[ApiKey]) -> tuple[ApiKey, ...]:
    """``keys`` as a tuple, once checked: at least one, all :class:`ApiKey`,
    ids and digests unique."""
    checked = tuple(keys)
    if not checked:
        raise ValueError("ApiKeyAuth needs at least one key")
    for key in checked:
        if not isinstance(key, ApiKey):
            raise TypeError(f"keys must be ApiKey objects, got {type(key).__name__}")
    ids = [k.id for k in checked]
    if len(set(ids)) != len(ids):
        raise ValueError(f"key ids must be unique: {sorted(i for i in ids if ids.count(i) > 1)}")
    if len({k.sha256 for k in checked}) != len(checked):
        raise ValueError("two keys have the same token")
    return checked


def check_scope(principal: Principal, scopes: Iterable[str]) -> None:
    """Raise unless ``principal``'s scope covers the highest of ``scopes`` (none: any).

    Raises
    ------
    PermissionDeniedError
        It does not.
    ValueError
        An unknown scope name (a mistake in the app).
    """
    needed = [Scope.parse(s) for s in scopes]
    if not needed:
        return
    top = max(needed, key=lambda s: s.rank)
    if not principal.scope.covers(top):
        raise PermissionDeniedError(
            f"key {principal.key_id!r} has scope {principal.scope.value!r}; "
            f"this needs {top.value!r}",
            required=top.value,
            key_id=principal.key_id,
        )
