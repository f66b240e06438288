"""The docs site stays whole: every page in the nav, the API reference covering
the public API, the package map naming every module, the tour running as
written, and no issue numbers or commit hashes on a page a user reads.

``mkdocs build --strict`` itself runs in ``.ci/run`` (it needs the ``docs``
extra); these checks need nothing but the files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lance_async
import lance_async.errors

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = Path(lance_async.__file__).parent


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.parts)


def test_every_page_is_in_the_nav() -> None:
    nav = set(re.findall(r"([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    listed = {p.relative_to(DOCS).as_posix() for p in pages()}
    assert listed - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - listed == set(), "nav entries without a page"


def test_the_api_reference_covers_the_public_api() -> None:
    documented = {
        name
        for page in (DOCS / "api").glob("*.md")
        for name in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)
    }
    errors = set(lance_async.errors.__all__) if "lance_async.errors" in documented else set()
    missing = {
        name
        for name in lance_async.__all__
        if f"lance_async.{name}" not in documented and name not in errors
    }
    assert not missing, sorted(missing)
    assert "lance_async.fastapi" in documented
    stale = {
        d
        for d in documented
        if d.count(".") == 1 and d.split(".")[1] not in {*lance_async.__all__, "errors", "fastapi"}
    }
    assert not stale, sorted(stale)  # a name the package no longer exports


def test_the_package_map_names_every_module() -> None:
    text = (DOCS / "architecture.md").read_text()
    named = set(re.findall(r"([\w/]+\.py)", text))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and path.parent != PACKAGE:
            continue  # a package's own __init__ (its package is in the map)
        short = rel.split("/")[-1]
        if rel not in named and not any(n.endswith("/" + short) or n == short for n in named):
            missing.append(rel)
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    text = (DOCS / "tour.md").read_text()
    blocks = re.findall(r"^```python\n(# tour\.py\n.*?)^```", text, re.S | re.M)
    assert len(blocks) == 1
    (tmp_path / "tour.py").write_text(blocks[0])
    env = {k: v for k, v in os.environ.items() if k != "LANCE_LOG"}  # a new user's shell
    done = subprocess.run(
        [sys.executable, "tour.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr, done.stderr  # the engine's MemWAL index line is filtered
    lines = done.stdout.splitlines()
    assert lines[0] == "1 1 1"  # updated, inserted, attempts
    assert "[{'id': 150, 'value': 225.0}]" in lines
    assert lines[-2:] == ["SourceMode.STREAMING", "106"]


def test_user_pages_hold_no_issue_numbers_or_commit_hashes() -> None:
    for page in pages():
        text = page.read_text()
        assert not re.search(r"\bissues? #?\d+", text, re.I), page
        assert not re.search(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text), page
