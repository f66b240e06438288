"""README.md's examples run as written, and the README stays a product page.

Each Python block of the README starts with a ``# name.py`` line; the tests
write the blocks to a temporary directory under those names and run them
there: the FastAPI app in this process (its lifespan, then requests through
httpx's ASGI transport, concurrent ones included), the feed example as two
real processes (the ingest, then a lookup from another process), and the
command-line block line by line.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def fenced(language: str) -> list[str]:
    """The README's fenced blocks of one language, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


def python_blocks() -> dict[str, str]:
    """Each Python block by the file name on its first line (``# app.py ...``)."""
    blocks = {}
    for block in fenced("python"):
        match = re.match(r"# (\w+\.py)\b", block)
        assert match, f"a README Python block does not start with '# name.py': {block[:60]!r}"
        blocks[match.group(1)] = block
    return blocks


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    assert "ERROR" not in done.stderr, done.stderr  # the engine's log stays quiet
    return done


def test_the_readme_is_a_product_page() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 250
    first_python = next(i for i, line in enumerate(lines) if line.startswith("```python"))
    assert first_python < 80
    assert not re.search(r"\bissues? #?\d+|#\d+\b", text, re.I), "an issue number"
    assert not re.search(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text), "a hash"
    assert set(python_blocks()) == {"app.py", "ingest.py", "lookup.py"}


def test_the_quick_start_keeps_its_two_commands() -> None:
    lines = README.read_text().splitlines()
    # .ci/run takes the line ending in "# the tests" as the test command
    demo = "pip install -e '.[demo]' && lance-async demo        "
    assert demo + "# the main job: the demo on real data" in lines
    assert "pip install -e '.[test]' && python -m pytest        # the tests" in lines


@pytest.mark.asyncio
async def test_the_fastapi_example_upserts_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "app.py").write_text(python_blocks()["app.py"])
    monkeypatch.chdir(tmp_path)  # the app opens users.lance where it runs
    spec = importlib.util.spec_from_file_location("readme_app", tmp_path / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = module.app
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as client,
    ):
        curl = next(b for b in fenced("bash") if "curl" in b)
        body = shlex.split(curl.replace("\\\n", " "))[-1]
        json_type = {"content-type": "application/json"}
        first = await client.put("/users/1", content=body, headers=json_type)
        assert first.status_code == 200, first.text
        assert first.json()["user"] == {"id": 1, "name": "Ada", "email": "ada@example.com"}
        assert first.json()["inserted"] == 1
        again = await client.put("/users/1", json={"name": "Ada L.", "email": "ada@example.com"})
        assert again.json()["inserted"] == 0
        assert again.json()["user"]["name"] == "Ada L."

        answers: list[dict[str, Any]] = []

        async def upsert(i: int) -> None:
            answer = await client.put("/users/7", json={"name": f"n{i}", "email": "e"})
            assert answer.status_code == 200, answer.text
            answers.append(answer.json())

        async with anyio.create_task_group() as tg:  # the same new key, eight times at once
            for i in range(8):
                tg.start_soon(upsert, i)
        assert sum(a["inserted"] for a in answers) == 1  # one of them inserted it
        for a in answers:
            assert 0 <= a["commit"]["position"] < a["commit"]["upserts"]
        stored = await app.state.users.to_table(filter="id = 7")
        assert stored.num_rows == 1  # one row per key
        assert await app.state.users.count_rows() == 2


def test_the_feed_example_and_its_command_line(tmp_path: Path) -> None:
    blocks = python_blocks()
    for name in ("ingest.py", "lookup.py"):
        (tmp_path / name).write_text(blocks[name])
    ingested = run([sys.executable, "ingest.py"], tmp_path)
    assert ingested.stdout.strip() == "10000 rows ingested"
    looked_up = run([sys.executable, "lookup.py"], tmp_path)  # another process
    expected = re.search(r"print\(row.to_pylist\(\)\)  # (.*)", blocks["lookup.py"])
    assert expected is not None
    assert looked_up.stdout.strip() == expected.group(1)

    # the same with the command, on the feed ingest.py wrote
    block = next(b for b in fenced("bash") if "lance-async lookup" in b)
    command = Path(sys.executable).with_name("lance-async")
    out = ""
    for line in block.splitlines():
        args = shlex.split(line)
        assert args[0] == "lance-async"
        out = run([str(command), *args[1:]], tmp_path).stdout
    assert out.strip() == '{"sensor": 42, "celsius": 29.542}'
