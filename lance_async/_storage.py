"""Object-store filesystems built from a table's ``storage_options`` (ground floor).

lance_async asks the engine for everything it can; the few files it reads
itself (MemWAL shard manifests, the dataset manifest's compaction record,
the example server's list of tables) are read through a pyarrow filesystem
built from the *same* ``storage_options`` the table was opened with, so no
path falls back to default credentials or the public endpoint when the
table names another. A key the options lack is read from the environment
under the names Lance's object store reads (``AWS_ENDPOINT``,
``AWS_ALLOW_HTTP``, ``AWS_REGION``, ``AZURE_STORAGE_ACCOUNT_NAME``, ...), so a
table configured the way pylance is configured -- options, environment or
both -- is read the same way here.

:func:`unknown_option` names a storage option no store takes, and the key
it was most likely meant to be.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

__all__ = ["KNOWN_OPTIONS", "filesystem", "join", "unknown_option"]


def join(root: str, name: str) -> str:
    """``root/name`` for a local path or a URI."""
    return f"{root.rstrip('/')}/{name}"


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _getter(options: Mapping[str, str]) -> Any:
    """Look keys up in ``options`` (any case), then the same names upper-cased
    in the environment (object_store's ``from_env``)."""
    lowered = {str(k).lower(): v for k, v in options.items()}

    def get(*keys: str) -> str | None:
        for key in keys:
            if lowered.get(key):
                return str(lowered[key])
        for key in keys:
            if os.environ.get(key.upper()):
                return os.environ[key.upper()]
        return None

    return get


def _s3(options: Mapping[str, str]) -> pafs.FileSystem:
    """A pyarrow S3 filesystem built from Lance-style ``storage_options``.

    Keys (Lance / object_store spellings): ``aws_access_key_id`` /
    ``access_key_id``, ``aws_secret_access_key`` / ``secret_access_key``,
    ``aws_session_token`` / ``session_token``, ``aws_region`` / ``region``,
    ``aws_endpoint`` / ``aws_endpoint_url`` / ``endpoint``, ``allow_http``,
    ``aws_virtual_hosted_style_request``. Keys absent here are read from the
    environment as Lance reads them (``AWS_ENDPOINT``, ``AWS_ENDPOINT_URL``,
    ``AWS_ALLOW_HTTP``, ``AWS_REGION``, ``AWS_DEFAULT_REGION``, ...); what
    neither gives is left to pyarrow's own default chain.
    """
    get = _getter(options)
    endpoint = get("aws_endpoint", "aws_endpoint_url", "aws_endpoint_url_s3", "endpoint")
    kwargs: dict[str, Any] = {}
    key_id = get("aws_access_key_id", "access_key_id")
    secret = get("aws_secret_access_key", "secret_access_key")
    if key_id and secret:
        kwargs.update(access_key=key_id, secret_key=secret)
        token = get("aws_session_token", "aws_token", "session_token", "token")
        if token:
            kwargs["session_token"] = token
    region = get("aws_region", "region", "aws_default_region", "default_region")
    if region:
        kwargs["region"] = region
    if endpoint:
        kwargs["endpoint_override"] = endpoint
        if endpoint.startswith("http://") or _truthy(get("aws_allow_http", "allow_http")):
            kwargs["scheme"] = "http"
    if _truthy(get("aws_virtual_hosted_style_request", "virtual_hosted_style_request")):
        kwargs["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**kwargs)


def _azure(options: Mapping[str, str]) -> pafs.FileSystem:
    """A pyarrow Azure filesystem from Lance-style options or the environment
    (``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``, ...)."""
    get = _getter(options)
    kwargs: dict[str, Any] = {
        "account_name": get("azure_storage_account_name", "account_name") or "",
    }
    key = get("azure_storage_account_key", "azure_storage_access_key", "account_key", "access_key")
    if key:
        kwargs["account_key"] = key
    token = get("azure_storage_sas_key", "azure_storage_sas_token", "sas_key", "sas_token")
    if token:
        kwargs["sas_token"] = token
    endpoint = get("azure_storage_endpoint", "azure_endpoint", "endpoint")
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(blob_storage_authority=host or scheme, blob_storage_scheme=scheme or "https")
    return pafs.AzureFileSystem(**kwargs)


_ENV = ("AWS_", "AZURE_")
_FILESYSTEMS: dict[tuple[Any, ...], pafs.FileSystem] = {}


def filesystem(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding ``uri``, and the path in it.

    ``s3://`` (and Azure's ``az://``, ``abfs[s]://``) URIs get a filesystem
    built from ``storage_options`` and then the environment, as Lance
    builds its object store (never the public endpoint when the table names
    another); other URIs (``gs://``: pyarrow reads the same Google
    variables) pyarrow's own resolution.
    """
    if "://" not in uri:
        uri = os.path.abspath(uri)
    scheme, _, rest = uri.partition("://")
    if scheme in ("s3", "s3a", "az", "abfs", "abfss"):
        azure = scheme != "s3" and scheme != "s3a"
        environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV)))
        key = (scheme, tuple(sorted((storage_options or {}).items())), environment)
        fs = _FILESYSTEMS.get(key)
        if fs is None:
            build = _azure if azure else _s3
            fs = _FILESYSTEMS[key] = build(storage_options or {})
        if azure and "@" in rest:  # abfss://container@account.dfs.core.windows.net/path
            container, _, tail = rest.partition("@")
            rest = f"{container}/{tail.partition('/')[2]}"
        return fs, rest.rstrip("/")
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


#: Storage option keys that Lance's object stores take (object_store's S3,
#: Google and Azure keys with their aliases, the client's, and Lance's own).
_KEYS = """
    aws_access_key_id access_key_id aws_secret_access_key secret_access_key
    aws_session_token aws_token session_token token aws_region region
    aws_default_region default_region aws_endpoint aws_endpoint_url endpoint
    endpoint_url aws_bucket aws_bucket_name bucket bucket_name
    aws_virtual_hosted_style_request virtual_hosted_style_request aws_s3_express
    s3_express aws_imdsv1_fallback imdsv1_fallback aws_metadata_endpoint
    metadata_endpoint aws_unsigned_payload unsigned_payload aws_checksum_algorithm
    checksum_algorithm aws_container_credentials_relative_uri
    aws_container_credentials_full_uri aws_skip_signature skip_signature
    aws_copy_if_not_exists copy_if_not_exists aws_conditional_put conditional_put
    aws_server_side_encryption aws_sse_kms_key_id aws_sse_bucket_key_enabled
    aws_sse_customer_key_base64 aws_request_payer request_payer aws_disable_tagging
    disable_tagging aws_web_identity_token_file aws_role_arn aws_role_session_name
    aws_sts_endpoint aws_allow_http aws_profile
    google_service_account service_account google_service_account_path
    service_account_path google_service_account_key service_account_key
    google_bucket google_bucket_name google_application_credentials
    google_skip_signature
    azure_storage_account_name account_name azure_storage_account_key
    azure_storage_access_key account_key access_key azure_storage_master_key
    master_key azure_storage_client_id azure_client_id client_id
    azure_storage_client_secret azure_client_secret client_secret
    azure_storage_tenant_id azure_storage_authority_id azure_tenant_id
    azure_authority_id tenant_id authority_id azure_storage_sas_key
    azure_storage_sas_token sas_key sas_token azure_storage_token bearer_token
    azure_storage_use_emulator use_emulator azure_storage_endpoint azure_endpoint
    azure_msi_endpoint azure_identity_endpoint identity_endpoint msi_endpoint
    azure_object_id object_id azure_msi_resource_id msi_resource_id
    azure_federated_token_file federated_token_file azure_use_fabric_endpoint
    use_fabric_endpoint azure_use_azure_cli use_azure_cli azure_skip_signature
    azure_container_name container_name azure_disable_tagging
    azure_fabric_token_service_url azure_fabric_workload_host
    azure_fabric_session_token azure_fabric_cluster_identifier
    allow_http allow_invalid_certificates connect_timeout default_content_type
    http1_only http2_only http2_keep_alive_interval http2_keep_alive_timeout
    http2_keep_alive_while_idle pool_idle_timeout pool_max_idle_per_host proxy_url
    proxy_ca_certificate proxy_excludes timeout user_agent randomize_addresses
    client_max_retries client_retry_timeout download_retry_count expires_at_millis
    use_opendal
"""
KNOWN_OPTIONS = frozenset(_KEYS.split())


def unknown_option(key: str) -> str | None:
    """Why ``key`` is not a storage option any store takes (naming the key it
    was most likely meant to be), or None when it is one (pure).

    Keys are compared in lower case, as object_store reads them. Lance's own
    dotted keys (``lance.*``) pass.
    """
    name = key.strip().lower()
    if name in KNOWN_OPTIONS or name.startswith("lance."):
        return None
    close = difflib.get_close_matches(name, sorted(KNOWN_OPTIONS), n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown storage option {key!r}{hint}"
