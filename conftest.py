"""Root conftest: keeps the repository importable (``suites/`` has no ``__init__.py`` and
runs with ``--import-mode=importlib``) and loads the harness pytest plugin from the
tree when the package's ``pytest11`` entry point is not installed (a fresh checkout)."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

if not any(ep.value == "harness.pytest_plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["harness.pytest_plugin"]


@pytest.fixture
def one_torch_thread():
    """Tiny matmuls: intra-op threads only add spin-wait contention on a shared 2-core box.
    Modules that run the tiny torch model use it with ``pytestmark``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
