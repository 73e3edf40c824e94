"""The core is decision logic only: importing it pulls in no engine, model, process,
thread-based backend, HTTP client or harness module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "miles_async_core"
FORBIDDEN = ("torch", "multiprocessing", "httpx", "requests", "aiohttp", "urllib3", "numpy", "harness")

PROBE = """
import json, pkgutil, importlib, sys
import miles_async_core
for m in pkgutil.walk_packages(miles_async_core.__path__, "miles_async_core."):
    importlib.import_module(m.name)
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after_importing_the_core() -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


# each test starts one interpreter (about a second): they stay in the fast tier, being the core's design rule
def test_importing_every_core_module_imports_no_backend_client_or_harness_module():
    loaded = _modules_after_importing_the_core()
    bad = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN)
    assert bad == [], f"the core imported {bad}"
    # the core itself does no threading: no core module imports it (the stdlib may)
    for path in CORE.rglob("*.py"):
        text = path.read_text()
        assert "import threading" not in text and "from threading" not in text, path


def test_the_probe_sees_a_forbidden_import_when_one_is_there(tmp_path):
    """The check above can fail: a module that imports multiprocessing shows up."""
    probe = PROBE.replace("import miles_async_core\n", "import miles_async_core\nimport multiprocessing\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "multiprocessing" in json.loads(out.stdout)
