"""API keys with scopes on ``lance-async serve`` (issue 27), on a real uvicorn.

One module-scoped server, started as an operator would: a file of hashed keys
(read, write and admin), one more key given whole in the environment,
``--metrics``. Every test here either only reads, or writes rows of its own.
The key logic itself (parsing, scopes, constant-time matching) is tested
without a server below.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request, Security
from fastapi.security import SecurityScopes

from lance_async.web import (
    ApiKey,
    ApiKeyAuth,
    AuthenticationError,
    PermissionDeniedError,
    Principal,
    Scope,
    install_error_handlers,
)
from lance_async.web.audit import install_audit_log
from lance_async.web.auth import hash_token, new_token, parse_key_lines, read_key_file
from lance_async.web.settings import ServeSettings

from .serving import Serve, serve, threaded
from .test_fastapi import NDJSON, contents, kv_block, make_table, ndjson, version

TOKENS = {name: new_token() for name in ("reader", "writer", "admin", "envkey")}
SCOPES = {"reader": "read", "writer": "write", "admin": "admin", "envkey": "write"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    base = tmp_path_factory.mktemp("auth")
    root = base / "tables"
    root.mkdir()
    make_table(root / "kv.lance", kv_block(0, 20, 0))
    make_table(root / "events.lance", kv_block(0, 10, 0), mem_wal=True)
    keys = base / "keys.txt"
    keys.write_text(
        "# the keys of the test server\n"
        + "".join(
            ApiKey.from_token(name, SCOPES[name], TOKENS[name]).line() + "\n"
            for name in ("reader", "writer", "admin")
        )
    )
    env = {
        "LANCE_ASYNC_SERVE_API_KEYS": json.dumps(
            [{"id": "envkey", "scope": "write", "token": TOKENS["envkey"]}]
        )
    }
    srv = serve(root, base / "server.log", "--api-keys-file", str(keys), "--metrics", env=env)
    try:
        yield srv
    finally:
        srv.stop()


TABLE_ROUTES = [
    ("GET", "/tables"),
    ("GET", "/tables/kv/rows"),
    ("GET", "/tables/kv/lookup/1"),
    ("GET", "/tables/events/rows"),
    ("POST", "/tables/kv/merge"),
    ("POST", "/tables/events/ingest"),
    ("GET", "/tables/nosuch/rows"),  # 401, not 404: no table names for strangers
]


def test_every_table_route_is_401_without_credentials(secured: Serve) -> None:
    before = version(secured.table("kv"))
    body = ndjson([{"id": 1, "value": 9, "name": "x"}])
    with secured.client() as client:
        for method, path in TABLE_ROUTES:
            response = client.request(
                method,
                path,
                content=body if method == "POST" else None,
                headers={"content-type": NDJSON},
            )
            assert response.status_code == 401, (path, response.text)
            assert response.headers["www-authenticate"] == 'Bearer realm="lance_async"'
            assert response.json()["error"] == "AuthenticationError"
        for headers in ({"authorization": "Bearer nope-not-a-key"}, {"x-api-key": "nope"}):
            response = client.get("/tables", headers=headers)
            assert response.status_code == 401
            assert 'error="invalid_token"' in response.headers["www-authenticate"]
        # a scheme other than Bearer is no credential at all
        response = client.get("/tables", auth=("reader", TOKENS["reader"]))
        assert response.status_code == 401
    assert version(secured.table("kv")) == before


def test_health_stays_open_and_names_no_table(secured: Serve) -> None:
    with secured.client() as client:
        health = client.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    assert "tables" not in health.json()
    assert "kv" not in health.text


def test_a_read_key_reads_and_is_403_on_writes(secured: Serve) -> None:
    before = version(secured.table("kv"))
    body = ndjson([{"id": 1, "value": 9, "name": "x"}])
    with secured.client(TOKENS["reader"]) as client:
        assert set(client.get("/tables").json()) == {"kv", "events"}
        assert client.get("/tables/kv/rows", params={"limit": 3}).status_code == 200
        assert client.get("/tables/kv/lookup/1").json()["row"]["value"] == 0
        assert client.get("/tables/events/rows").status_code == 200
        for path in ("/tables/kv/merge", "/tables/events/ingest"):
            response = client.post(path, content=body, headers={"content-type": NDJSON})
            assert response.status_code == 403, response.text
            assert response.json()["error"] == "PermissionDeniedError"
            assert (
                'error="insufficient_scope", scope="write"'
                in (response.headers["www-authenticate"])
            )
            assert "'reader' has scope 'read'" in response.json()["detail"]
        # the X-API-Key header is the same key
        headers = {"authorization": "", "x-api-key": TOKENS["reader"]}
        assert client.get("/tables", headers=headers).status_code == 200
    assert version(secured.table("kv")) == before


@pytest.mark.parametrize("who", ["writer", "admin", "envkey"])
def test_write_and_admin_keys_merge_and_ingest(secured: Serve, who: str) -> None:
    lo = {"writer": 100, "admin": 200, "envkey": 300}[who]
    rows = [{"id": i, "value": 7, "name": who} for i in range(lo, lo + 5)]
    with secured.client(TOKENS[who]) as client:
        merged = client.post(
            "/tables/kv/merge", content=ndjson(rows), headers={"content-type": NDJSON}
        )
        assert merged.status_code == 200, merged.text
        assert merged.json()["num_inserted_rows"] == 5
        ingested = client.post(
            "/tables/events/ingest", content=ndjson(rows), headers={"content-type": NDJSON}
        )
        assert ingested.status_code == 200, ingested.text
        assert client.get(f"/tables/events/lookup/{lo}").json()["row"]["name"] == who
    assert contents(secured.table("kv"))[lo] == (7, who)


def test_metrics_and_docs_need_a_read_key(secured: Serve) -> None:
    with secured.client() as anonymous, secured.client(TOKENS["reader"]) as reader:
        for path in ("/metrics", "/docs", "/openapi.json", "/redoc"):
            assert anonymous.get(path).status_code in (401, 404), path
            assert anonymous.get(path).status_code != 200
        assert reader.get("/metrics").status_code == 200
        assert "lance_async" in reader.get("/metrics").text
        assert reader.get("/docs").status_code == 200
        spec = reader.get("/openapi.json").json()
        # the table routes document the bearer scheme
        assert "HTTPBearer" in json.dumps(spec["components"]["securitySchemes"])


def test_audit_lines_name_the_key_table_operation_rows_and_status(secured: Serve) -> None:
    rows = [{"id": i, "value": 3, "name": "audited"} for i in range(400, 404)]
    with secured.client(TOKENS["writer"]) as writer, secured.client(TOKENS["reader"]) as reader:
        assert (
            writer.post(
                "/tables/kv/merge", content=ndjson(rows), headers={"content-type": NDJSON}
            ).status_code
            == 200
        )
        assert reader.get("/tables/kv/rows", params={"limit": 7}).status_code == 200
        assert reader.post("/tables/kv/merge", content=b"").status_code == 403
    with httpx.Client(base_url=secured.url) as anonymous:
        assert anonymous.get("/tables/kv/rows").status_code == 401

    def audit_lines() -> list[str]:
        return [line for line in secured.log_text().splitlines() if " audit " in f" {line}"]

    wanted = [
        "audit key=writer table=kv op=merge rows=4 status=200",
        "audit key=reader table=kv op=rows rows=7 status=200",
        "audit key=reader table=kv op=merge rows=- status=403",
        "audit key=- table=kv op=rows rows=- status=401",
    ]
    # the server writes a request's audit line once its answer is sent: the
    # last one may reach the log after the client has its answer
    deadline = time.monotonic() + 30  # only tells a late line from a missing one
    while not all(any(t in line for line in audit_lines()) for t in wanted):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for text in wanted:
        assert any(text in line for line in audit_lines()), (text, audit_lines()[-10:])
    log = secured.log_text()
    for token in TOKENS.values():  # never a secret in the log
        assert token not in log
    assert not any("/health" in line for line in audit_lines())


# -- the keys themselves, without a server ------------------------------------------


def test_key_files_parse_and_name_their_bad_lines(tmp_path: Path) -> None:
    token = new_token()
    assert token.startswith("la_") and len(token) == 46
    key = ApiKey.from_token("ci", "write", token)
    assert key.sha256 == hash_token(token)
    assert repr(key) == "ApiKey(id='ci', scope='write')"  # never the digest
    assert parse_key_lines(f"# c\n\n{key.line()}  # trailing comment\n") == [key]
    path = tmp_path / "keys.txt"
    path.write_text(f"{key.line()}\nbroken line\n")
    with pytest.raises(ValueError, match="line 2: expected 'ID SCOPE sha256:HEX'"):
        read_key_file(path)
    for bad, message in [
        ("ci root sha256:" + "0" * 64, "unknown scope 'root'"),
        ("ci read sha256:" + "0" * 63, "64 hex digits"),
        ("c i read", "expected"),
        ("-x read sha256:" + "0" * 64, "invalid key id"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_key_lines(bad)
    with pytest.raises(ValueError, match="cannot read the key file"):
        read_key_file(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="too easy to guess"):
        ApiKey.from_token("ci", "read", "short")
    with pytest.raises(ValueError, match="printable ASCII"):
        ApiKey.from_token("ci", "read", "has a space in it, long enough")


def test_scopes_cover_the_ones_below() -> None:
    assert Scope.ADMIN.covers(Scope.WRITE) and Scope.WRITE.covers(Scope.READ)
    assert not Scope.READ.covers(Scope.WRITE) and not Scope.WRITE.covers(Scope.ADMIN)
    tokens = {s: new_token() for s in Scope}
    auth = ApiKeyAuth(ApiKey.from_token(s.value, s, t) for s, t in tokens.items())
    assert auth.authorize(tokens[Scope.ADMIN], ["read", "admin"]) == Principal("admin", Scope.ADMIN)
    with pytest.raises(PermissionDeniedError) as denied:
        auth.authorize(tokens[Scope.WRITE], ["read", "admin"])
    assert (denied.value.required, denied.value.key_id) == ("admin", "write")
    with pytest.raises(AuthenticationError) as missing:
        auth.authorize(None)
    assert missing.value.reason == "missing"
    with pytest.raises(AuthenticationError) as invalid:
        auth.authorize(tokens[Scope.READ] + "x")
    assert invalid.value.reason == "invalid"
    with pytest.raises(AuthenticationError):
        auth.authorize(tokens[Scope.READ] * 100)  # past MAX_TOKEN_CHARS: never a match
    with pytest.raises(ValueError, match="unique"):
        ApiKeyAuth([ApiKey.from_token("a", "read", new_token())] * 2)
    with pytest.raises(ValueError, match="at least one key"):
        ApiKeyAuth([])


def test_every_key_is_compared_whatever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    # constant time: the matching loop never stops at the first match
    import hmac

    calls = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr("lance_async.web.auth.hmac.compare_digest", counting)  # the hmac it calls
    tokens = [new_token() for _ in range(5)]
    auth = ApiKeyAuth(ApiKey.from_token(f"k{i}", "read", t) for i, t in enumerate(tokens))
    assert auth.authenticate(tokens[0]).key_id == "k0"
    assert len(calls) == 5
    calls.clear()
    with pytest.raises(AuthenticationError):
        auth.authenticate("la_" + "x" * 43)
    assert len(calls) == 5


def test_settings_take_keys_inline_from_a_file_and_refuse_bad_ones(tmp_path: Path) -> None:
    token = new_token()
    path = tmp_path / "keys.txt"
    path.write_text(ApiKey.from_token("filed", "admin", new_token()).line() + "\n")
    settings = ServeSettings.load(
        None,
        api_keys=[
            {"id": "inline", "scope": "write", "token": token},
            {"id": "hashed", "sha256": hash_token(new_token()).hex()},
        ],
        api_keys_file=str(path),
    )
    assert token not in repr(settings)  # the token is a SecretStr
    auth = settings.auth()
    assert auth is not None
    assert [(k.id, k.scope.value) for k in auth.keys] == [
        ("inline", "write"),
        ("hashed", "read"),
        ("filed", "admin"),
    ]
    assert auth.authenticate(token).key_id == "inline"
    assert ServeSettings().auth() is None
    with pytest.raises(ValueError, match="exactly one of sha256 or token"):
        ServeSettings.load(None, api_keys=[{"id": "x", "scope": "read"}])
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ValueError, match="holds no key"):
        ServeSettings.load(None, api_keys_file=str(empty)).auth()


# -- an app with its own authentication ---------------------------------------------


def test_an_embedding_app_brings_its_own_dependency(tmp_path: Path) -> None:
    # the router takes any FastAPI dependency in place of ApiKeyAuth: here a
    # header naming a team, with the scopes the route asks for
    from lance_async.web import TableRegistry, install_body_guard, lance_lifespan, table_router
    from lance_async.web.auth import PRINCIPAL_SCOPE_KEY

    seen: list[list[str]] = []

    async def team_auth(request: Request, security_scopes: SecurityScopes) -> str:
        team = request.headers.get("x-team")
        seen.append(list(security_scopes.scopes))
        if team is None:
            raise AuthenticationError("who are you?")
        request.scope[PRINCIPAL_SCOPE_KEY] = Principal(team, Scope.WRITE)  # for the audit log
        if team != "owners" and "write" in security_scopes.scopes:
            raise PermissionDeniedError("owners only", required="write")
        return team

    make_table(tmp_path / "kv.lance", kv_block(0, 5, 0))
    registry = TableRegistry({"kv": tmp_path / "kv.lance"})
    app = FastAPI(lifespan=lance_lifespan(registry))
    install_body_guard(app)
    install_error_handlers(app)
    install_audit_log(app)
    app.include_router(table_router(auth=team_auth), prefix="/lance")

    @app.get("/mine")
    async def mine(team: str = Security(team_auth, scopes=["read"])) -> dict[str, str]:
        return {"team": team}

    body = ndjson([{"id": 9, "value": 1, "name": "o"}])
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    audit_log = logging.getLogger("lance_async.web.audit")
    audit_log.addHandler(handler)
    audit_log.setLevel(logging.INFO)
    try:
        with threaded(app) as url, httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/lance/tables").status_code == 401
            assert client.get("/lance/tables", headers={"x-team": "guests"}).status_code == 200
            denied = client.post(
                "/lance/tables/kv/merge",
                content=body,
                headers={"x-team": "guests", "content-type": NDJSON},
            )
            assert denied.status_code == 403
            ok = client.post(
                "/lance/tables/kv/merge",
                content=body,
                headers={"x-team": "owners", "content-type": NDJSON},
            )
            assert ok.status_code == 200, ok.text
            assert client.get("/mine", headers={"x-team": "guests"}).json() == {"team": "guests"}
    finally:
        audit_log.removeHandler(handler)
    assert ["read"] in seen and ["write"] in seen
    fields = [r.audit for r in records if hasattr(r, "audit")]
    assert {"key": "owners", "table": "kv", "op": "merge", "rows": 1, "status": 200}.items() <= (
        next(f for f in fields if f["status"] == 200 and f["op"] == "merge").items()
    )
    assert re.search(
        r"audit key=guests table=kv op=merge rows=- status=403",
        "\n".join(r.getMessage() for r in records),
    )
