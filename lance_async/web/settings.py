"""The example server's settings: command-line options, environment, or a config file.

:class:`ServeSettings` is a pydantic-settings model, so a deployment can
configure ``lance-async serve`` without a command line: every field reads
``LANCE_ASYNC_SERVE_<FIELD>`` from the environment (mappings as JSON, e.g.
``LANCE_ASYNC_SERVE_STORAGE_OPTIONS='{"aws_region": "eu-west-1"}'``), and
``--config FILE`` (or ``LANCE_ASYNC_SERVE_CONFIG``) reads a JSON or TOML file
of the same fields. Precedence, highest first: command-line options, the
environment, the config file, the defaults.

The tables' root may be a local directory or an object-store prefix
(``s3://bucket/tables``) read with ``storage_options``.

Exposure: API keys (``api_keys`` inline, ``api_keys_file`` of hashed keys;
see :mod:`lance_async.web.auth`), TLS (``ssl_certfile`` and ``ssl_keyfile``,
handed to uvicorn), limits on request heads (``max_head_bytes``,
``max_headers``, ``head_timeout``; see :mod:`lance_async.web.headlimits`).
:meth:`ServeSettings.check_exposure` refuses an address beyond loopback
without keys unless ``dangerously_serve_without_auth`` is set.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from .auth import ApiKeyAuth
    from .headlimits import HeadLimits
    from .keyfile import KeyFileWatcher
    from .limits import BodyLimits

__all__ = ["KeySetting", "ServeSettings", "is_loopback"]

Access = Literal["read", "write", "admin", "open", "off"]


class KeySetting(BaseModel):
    """One API key in the settings: its id, its scope, and either the SHA-256
    digest of its token (``sha256``, 64 hex digits) or the token itself
    (``token``; kept only as its digest, but it sits in the environment or
    the file: prefer the digest)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    scope: Literal["read", "write", "admin"] = "read"
    sha256: str | None = None
    token: SecretStr | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> KeySetting:
        if (self.sha256 is None) == (self.token is None):
            raise ValueError(f"key {self.id!r}: give exactly one of sha256 or token")
        return self


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback one (127.0.0.0/8,
    ``::1``, ``localhost``); blocks to resolve a name (at startup only).
    An empty host, ``0.0.0.0``, ``::`` or a name that does not resolve is not."""
    text = host.strip().strip("[]")
    if not text:
        return False
    try:
        return ipaddress.ip_address(text.split("%", 1)[0]).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(text, None)
    except (OSError, UnicodeError):
        return False
    addresses = {str(info[4][0]).split("%", 1)[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


class ServeSettings(BaseSettings):
    """How ``lance-async serve`` runs (see the module notes for where values come from).

    Attributes
    ----------
    root : str
        The tables: every ``<name>.lance`` under this directory or prefix.
    host, port : str, int
        Where to listen (default 127.0.0.1:8000).
    storage_options : dict of str to str
        Object-store options of the root and every table in it.
    writer_options : dict
        Options of the MemWAL writers (``AsyncShardWriter``'s and pylance's
        ``mem_wal_writer`` keywords).
    allow_raw_sql : bool
        Accept raw Lance SQL filters (trusted clients only).
    max_body_bytes : int or None
        Largest request body (default 1 GiB).
    body_idle_timeout : float or None
        Seconds an upload may pause between body chunks (default 30; 0: no limit).
    min_body_rate : float or None
        Bytes per second an upload must average once ``body_rate_grace`` has
        passed (default 1,024; 0: no limit).
    body_rate_grace : float or None
        Seconds from an upload's first bytes before ``min_body_rate`` applies
        (default 10).
    max_body_time : float or None
        Seconds an upload may take in all (default 3,600; 0: no limit).
        Passing any of these four is a 408 that writes nothing
        (see :class:`lance_async.fastapi.BodyLimits`).
    spool_dir : str or None
        Where merge and ingest bodies are spooled.
    log_level : str
        uvicorn's log level.
    metrics : bool
        Serve ``GET /metrics`` for Prometheus (the ``metrics`` extra).
    lance_metrics : bool
        With ``metrics``, pylance's own object-store instruments too.
    api_keys : list of KeySetting
        API keys, inline (``LANCE_ASYNC_SERVE_API_KEYS`` as JSON:
        ``[{"id": "ci", "scope": "write", "sha256": "..."}]``).
    api_keys_file : str or None
        A file of hashed keys, one ``ID SCOPE sha256:HEX`` per line; watched
        while the server runs (see :mod:`lance_async.web.keyfile`).
    api_keys_poll_interval : float
        Seconds between two looks at ``api_keys_file`` (default 1; 0: only
        on SIGHUP).
    dangerously_serve_without_auth : bool
        Listen beyond loopback with no key at all: anyone who reaches the
        port reads and writes every table. Off: such a start is refused.
    metrics_access, docs_access : str
        With keys: the scope ``/metrics`` and ``/docs`` need (``read``, the
        default, ``write``, ``admin``), ``open``, or ``off``.
    ssl_certfile, ssl_keyfile : str or None
        TLS certificate (PEM, chain included) and private key, as uvicorn
        takes them; both or neither.
    ssl_keyfile_password : str or None
        The private key's password.
    max_head_bytes, max_headers, head_timeout : int, int, float
        Limits on a request head (32 KiB, 100 header lines, 10 s; see
        :class:`~lance_async.web.headlimits.HeadLimits`).
    """

    model_config = SettingsConfigDict(env_prefix="LANCE_ASYNC_SERVE_", extra="forbid")

    root: str = "."
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    storage_options: dict[str, str] = Field(default_factory=dict)
    writer_options: dict[str, Any] = Field(default_factory=dict)
    allow_raw_sql: bool = False
    max_body_bytes: int | None = Field(default=None, ge=1)
    body_idle_timeout: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    min_body_rate: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    body_rate_grace: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    max_body_time: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    spool_dir: str | None = None
    log_level: str = "info"
    metrics: bool = False
    lance_metrics: bool = False
    api_keys: list[KeySetting] = Field(default_factory=list)
    api_keys_file: str | None = None
    api_keys_poll_interval: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    dangerously_serve_without_auth: bool = False
    metrics_access: Access = "read"
    docs_access: Access = "read"
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_keyfile_password: SecretStr | None = None
    max_head_bytes: int = Field(default=32 * 1024, ge=1)
    max_headers: int = Field(default=100, ge=1)
    head_timeout: float = Field(default=10.0, ge=0, allow_inf_nan=False)

    @property
    def has_keys(self) -> bool:
        """True when keys are configured (inline or in a file)."""
        return bool(self.api_keys) or self.api_keys_file is not None

    @property
    def tls(self) -> bool:
        """True when a TLS certificate is configured."""
        return self.ssl_certfile is not None

    def auth(self) -> ApiKeyAuth | None:
        """The :class:`~lance_async.web.auth.ApiKeyAuth` of the configured keys
        (None without keys). Reads ``api_keys_file`` (blocks; at startup).

        Raises
        ------
        ValueError
            A key that does not parse, a repeated id, or a key file with no key.
        """
        if not self.has_keys:
            return None
        from .auth import ApiKey, ApiKeyAuth, read_key_file

        keys = []
        for entry in self.api_keys:
            if entry.token is not None:
                keys.append(
                    ApiKey.from_token(entry.id, entry.scope, entry.token.get_secret_value())
                )
            else:
                keys.append(ApiKey.from_hex(entry.id, entry.scope, entry.sha256 or ""))
        if self.api_keys_file is not None:
            from_file = read_key_file(self.api_keys_file)
            if not from_file:
                raise ValueError(f"the key file {self.api_keys_file!r} holds no key")
            keys.extend(from_file)
        return ApiKeyAuth(keys)

    def key_watcher(self, auth: ApiKeyAuth | None) -> KeyFileWatcher | None:
        """The :class:`~lance_async.web.keyfile.KeyFileWatcher` that keeps
        ``auth`` in step with ``api_keys_file`` (None without a key file)."""
        if auth is None or self.api_keys_file is None:
            return None
        from .keyfile import KeyFileWatcher

        inline = auth.keys[: len(self.api_keys)]  # auth() puts the inline keys first
        return KeyFileWatcher(
            auth, self.api_keys_file, inline=inline, interval=self.api_keys_poll_interval
        )

    def head_limits(self) -> HeadLimits:
        """The :class:`~lance_async.web.headlimits.HeadLimits` of these settings."""
        from .headlimits import HeadLimits

        return HeadLimits(
            max_head_bytes=self.max_head_bytes,
            max_headers=self.max_headers,
            head_timeout=self.head_timeout,
        )

    def check_exposure(self) -> None:
        """Refuse what would expose the tables by mistake (resolves ``host``; blocks).

        Raises
        ------
        ValueError
            ``host`` is not a loopback address and no key is configured,
            unless ``dangerously_serve_without_auth``; only one of
            ``ssl_certfile`` and ``ssl_keyfile``; a TLS file that is not
            readable, or a certificate and key that do not load together
            (:meth:`check_tls`).
        """
        exposed = not self.has_keys and not self.dangerously_serve_without_auth
        if exposed and not is_loopback(self.host):
            raise ValueError(
                f"refusing to serve {self.host} without authentication: give API keys "
                "(--api-keys-file FILE; 'lance-async keygen ID --scope SCOPE' makes one), "
                "or pass --dangerously-serve-without-auth to let anyone who reaches the "
                "port read and write every table"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("TLS needs both --ssl-certfile and --ssl-keyfile")
        for path in (self.ssl_certfile, self.ssl_keyfile):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"cannot read the TLS file {path!r}")
        self.check_tls()

    def check_tls(self) -> None:
        """Load the TLS certificate and key as the server will (reads both files; blocks).

        Raises
        ------
        ValueError
            A file that is not PEM, a certificate that does not match its
            key, a wrong key password: one line naming both files and what
            OpenSSL said.
        """
        if self.ssl_certfile is None:
            return
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        password = (
            self.ssl_keyfile_password.get_secret_value()
            if self.ssl_keyfile_password is not None
            else None
        )
        try:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=password or "")
        except (ssl.SSLError, OSError, ValueError) as exc:
            text = " ".join(str(getattr(exc, "strerror", None) or exc).split())
            reason = str(getattr(exc, "reason", None) or "")
            if "PEM lib" in text and not reason:
                reason = "PEM_LIB"  # OpenSSL 3 names no reason for a file that is not PEM
            hint = {
                "KEY_VALUES_MISMATCH": "the certificate does not match the private key",
                "PEM_LIB": "a file is not a PEM certificate or key",
                "NO_START_LINE": "a file is not a PEM certificate or key",
                "BAD_DECRYPT": "the private key's password is wrong",
            }.get(reason, text)
            raise ValueError(
                f"cannot use the TLS certificate {self.ssl_certfile!r} with the key "
                f"{self.ssl_keyfile!r}: {hint}"
            ) from None

    def exposure_report(self, auth: object | None) -> list[tuple[int, str]]:
        """What a starting server says about its exposure: (log level, line) pairs."""
        scheme = "https" if self.tls else "http"
        loopback = is_loopback(self.host)
        keys = getattr(auth, "keys", ())
        who = (
            f"API keys required ({len(keys)}: {', '.join(k.id for k in keys)})"
            if auth is not None
            else "NO AUTHENTICATION"
        )
        lines = [(logging.INFO, f"lance_async.serve: {scheme}://{self.host}:{self.port}; {who}")]
        if auth is None and not loopback:
            lines.append(
                (
                    logging.WARNING,
                    f"lance_async.serve: {self.host} is not loopback and there is no "
                    "authentication (--dangerously-serve-without-auth): anyone who reaches "
                    "the port can read and write every table",
                )
            )
        if auth is not None and not self.tls and not loopback:
            lines.append(
                (
                    logging.WARNING,
                    "lance_async.serve: API keys travel in clear text over http; give "
                    "--ssl-certfile and --ssl-keyfile, or put TLS in front of the server",
                )
            )
        if self.allow_raw_sql and not loopback:
            lines.append(
                (logging.WARNING, "lance_async.serve: raw SQL filters are on (--allow-raw-sql)")
            )
        return lines

    def body_limits(self) -> BodyLimits | None:
        """The :class:`~lance_async.fastapi.BodyLimits` these settings ask for
        (None: every limit at its default)."""
        from .limits import BodyLimits

        given = {
            name: getattr(self, name)
            for name in (
                "max_body_bytes",
                "body_idle_timeout",
                "min_body_rate",
                "body_rate_grace",
                "max_body_time",
            )
            if getattr(self, name) is not None
        }
        return BodyLimits(**given) if given else None

    @classmethod
    def load(cls, config: str | os.PathLike[str] | None = None, **overrides: Any) -> ServeSettings:
        """Settings from ``config`` (JSON or TOML), the environment, then ``overrides``.

        ``overrides`` whose value is None are ignored (an option not given).

        Raises
        ------
        ValueError
            The config file cannot be read or parsed, or a value is invalid
            (pydantic's ``ValidationError`` is a ``ValueError``).
        """
        path = config or os.environ.get("LANCE_ASYNC_SERVE_CONFIG")
        from_file: dict[str, Any] = {}
        if path:
            text_path = Path(path)
            try:
                raw = text_path.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read the config file {str(path)!r}: {exc}") from None
            try:
                if text_path.suffix.lower() == ".toml":
                    try:
                        toml = importlib.import_module("tomllib")
                    except ImportError:  # Python 3.10
                        raise ValueError("TOML config files need Python 3.11; use JSON") from None
                    from_file = toml.loads(raw.decode())
                else:
                    from_file = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ValueError(f"the config file {str(path)!r} does not parse: {exc}") from None
            if not isinstance(from_file, dict):
                raise ValueError(f"the config file {str(path)!r} must hold a table of settings")
        env = cls()  # the environment (and the defaults)
        explicit_env = env.model_fields_set
        merged: dict[str, Any] = {**from_file}
        merged.update({k: getattr(env, k) for k in explicit_env})
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(merged)
