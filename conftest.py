"""Root conftest: keeps the repository importable (``suites/`` has no ``__init__.py`` and
runs with ``--import-mode=importlib``) and loads the harness pytest plugin from the
tree when the package's ``pytest11`` entry point is not installed (a fresh checkout)."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

if not any(ep.value == "harness.pytest_plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["harness.pytest_plugin"]
