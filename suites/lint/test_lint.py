"""``make lint`` as a test of the fast tier: ruff's lint rules, ruff's format check, and
mypy (``--strict`` on ``miles_async_core``, the configured default checks on ``harness``),
with the configuration in ``pyproject.toml``. ruff is a binary (a subprocess of a fraction
of a second); mypy runs in this process (``mypy.api``), with its incremental cache.
Both come with the ``lint`` extra (``pip install -e '.[lint]'``, which ``make`` installs).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = "fix: pip install -e '.[lint]' (make installs it)"


def _ruff() -> str:
    exe = Path(sys.executable).with_name("ruff")
    found = str(exe) if exe.exists() else shutil.which("ruff")
    if found is None:
        pytest.fail(f"ruff is not installed next to {sys.executable} nor on PATH; {FIX}")
    return found


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff(command):
    out = subprocess.run([_ruff(), *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"ruff {' '.join(command)}:\n{out.stdout[-6000:]}{out.stderr[-2000:]}"


# the strict run keeps its own cache: options differ, so one shared cache would be rebuilt each time
@pytest.mark.parametrize(
    "args",
    [["--strict", "--cache-dir", ".mypy_cache/core-strict", "miles_async_core"], ["harness"]],
    ids=["core-strict", "harness"],
)
def test_mypy(args, monkeypatch):
    try:
        from mypy import api
    except ImportError:
        pytest.fail(f"mypy is not installed; {FIX}")
    monkeypatch.chdir(ROOT)  # pyproject.toml's [tool.mypy], the cache in .mypy_cache
    stdout, stderr, status = api.run(args)
    assert status == 0, f"mypy {' '.join(args)}:\n{stdout[-6000:]}{stderr[-2000:]}"
