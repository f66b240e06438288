"""``application/json`` bodies and ``GET /metrics`` on a real uvicorn, started
through the installed ``lance-async serve`` entry point."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import lance
import pytest

from .serving import Serve, serve
from .test_fastapi import contents, kv_block, make_table, version

pytest.importorskip("prometheus_client")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    base = tmp_path_factory.mktemp("json")
    root = base / "tables"
    root.mkdir()
    make_table(root / "kv.lance", kv_block(0, 10, 0))
    make_table(root / "events.lance", kv_block(0, 10, 0), mem_wal=True)
    with serve(root, base / "server.log", "--metrics") as server:
        yield server


def test_a_json_array_merges_as_httpx_sends_it(served: Serve) -> None:
    rows = [{"id": i, "value": 5, "name": f"j{i}"} for i in range(8, 13)]
    with served.client() as client:
        response = client.post("/tables/kv/merge", params={"on": "id"}, json=rows)
    assert response.status_code == 200, response.text
    assert response.json()["num_updated_rows"] == 2
    assert response.json()["num_inserted_rows"] == 3
    got = contents(served.table("kv"))
    assert all(got[i] == (5, f"j{i}") for i in range(8, 13))


def test_a_pretty_printed_json_array_ingests(served: Serve) -> None:
    rows = [{"id": i, "value": i, "name": "p"} for i in range(100, 150)]
    body = json.dumps(rows, indent=2).encode()
    with served.client() as client:
        response = client.post(
            "/tables/events/ingest", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 200, response.text
        assert response.json()["rows"] == 50
        assert response.json()["body"]["format"] == "json"
        looked = client.get("/tables/events/lookup/120")
    assert looked.status_code == 200 and looked.json()["row"]["value"] == 120


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ([{"id": 1, "value": 1, "name": 5}], "name", "a number is not a string"),
        ([{"id": 1, "value": True, "name": "t"}], "value", "not numbers"),
        ([{"id": 1, "value": 1.5, "name": "f"}], "value", "int64"),
        ([{"id": 1, "value": 1, "name": "a"}, 7], None, "object 2 of the array"),
    ],
)
def test_a_value_that_does_not_fit_is_a_422_naming_the_field(
    served: Serve, body: list[object], field: str | None, words: str
) -> None:
    before = version(served.table("kv"))
    with served.client() as client:
        response = client.post("/tables/kv/merge", params={"on": "id"}, json=body)
    assert response.status_code == 422, response.text
    assert words in response.json()["detail"]
    if field is not None:
        assert response.json()["field"] == field
    assert version(served.table("kv")) == before


def prometheus(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    found = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            found += float(match.group(2))
    return found


def test_metrics_count_a_known_workload(served: Serve) -> None:
    uri = str(served.table("events"))
    kv_rows = lance.dataset(str(served.table("kv"))).count_rows()  # other tests add rows too
    with served.client() as client:
        before = client.get("/metrics").text
        rows = [{"id": i, "value": 1, "name": "m"} for i in range(1_000, 1_040)]
        assert client.post("/tables/events/ingest", json=rows).status_code == 200
        merged = [{"id": i, "value": 2, "name": "m"} for i in range(500, 505)]
        assert client.post("/tables/kv/merge", params={"on": "id"}, json=merged).status_code == 200
        for key in (1_000, 1_001, 1_002):
            assert client.get(f"/tables/events/lookup/{key}").status_code == 200
        after = client.get("/metrics")
    assert after.status_code == 200
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text

    def delta(name: str, **labels: str) -> float:
        return prometheus(text, name, **labels) - prometheus(before, name, **labels)

    assert delta("lance_async_writer_rows_total", table=uri) == 40
    assert delta("lance_async_writer_puts_total", table=uri) >= 1
    assert delta("lance_async_writer_ack_latency_seconds_count", table=uri) >= 1
    kv = str(served.table("kv"))
    assert delta("lance_async_merges_total", table=kv) == 1
    assert delta("lance_async_merge_attempts_total", table=kv) == 1
    assert delta("lance_async_reads_lookups_total", table=uri) == 3
    assert "lance_async_writer_queue_rows{" in text
    assert lance.dataset(kv).count_rows() == kv_rows + 5  # five new keys merged
