"""README and docs name only paths and modules that exist: a stale path fails CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = ("harness", "miles_async_core", "suites", "fixtures", "results", "docs")
PATH_RE = re.compile(r"(?<![\w./-])((?:{})/[\w./-]*)".format("|".join(TOP)))
MODULE_RE = re.compile(r"(?<![\w./-])((?:harness|miles_async_core)(?:\.\w+)+)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "fixtures").glob("*/README.md"))]


def stale_paths(text: str) -> list[str]:
    bad = []
    for raw in PATH_RE.findall(text):
        path = raw.rstrip(".,:;)")
        if "*" in path or "<" in path:
            continue
        where = ROOT / path
        # a command's output prefix (``--out results/x/findings`` writes findings.json, findings.md)
        if not where.exists() and not any(where.parent.glob(where.name + ".*")):
            bad.append(path)
    return bad


def stale_modules(text: str) -> list[str]:
    bad = []
    for name in MODULE_RE.findall(text):
        parts = name.rstrip(".").split(".")
        # the longest prefix that is a module or package; at most one attribute may follow it
        for cut in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:cut])
            module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
            if module.exists():
                rest = parts[cut:]
                if len(rest) > 1 or (rest and not re.search(rf"\b{re.escape(rest[0])}\b", module.read_text())):
                    bad.append(name)
                break
        else:
            bad.append(name)
    return bad


def claims(text: str) -> str:
    """The doc minus ```text blocks: those are pasted program output, quoted as printed."""
    return re.sub(r"```text\n.*?```", "", text, flags=re.S)


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_module_a_doc_names_exists(doc):
    text = claims(doc.read_text())
    assert stale_paths(text) == []
    assert stale_modules(text) == []


def test_the_scan_sees_a_stale_path_and_a_stale_module():
    text = "see `harness/realrun.py` and `harness.gap.decompose_gap`, `harness/sim/engine.py` is fine"
    assert stale_paths(text) == ["harness/realrun.py"]
    assert stale_modules(text) == ["harness.gap.decompose_gap"]
    assert stale_modules("harness.checking.buffer_machine.check_buffer") == []
    assert stale_modules("harness.checking.buffer_machine.no_such_name") == [
        "harness.checking.buffer_machine.no_such_name"
    ]
