"""Root conftest: keeps the repository importable (``suites/`` has no ``__init__.py`` and
runs with ``--import-mode=importlib``), loads the harness pytest plugin from the tree when
the package's ``pytest11`` entry point is not installed (a fresh checkout), and opts this
project's own suites into what the plugin leaves off by default: the CPython 3.11 guard
(``harness.checking.py311_guard``) and a hypothesis profile of its own: the one
``$HYPOTHESIS_PROFILE`` names (``miles-harness-ci`` in ``make test`` and CI), else
``miles-harness-dev`` (``harness.checking.hypothesis_profiles``).

It also sorts the tests into two tiers. The fast tier (``make test``: ``-m "not slow and
not bench"``) is every test of the core, the simulator, the checkers and the upstream
differential on the simulated backends; the slow tier (``make test-slow``: ``-m "slow or
bench"``) is the rest. A test that starts something heavy carries a marker naming it
(``SLOW_BECAUSE``), and each of those implies ``slow``, so one expression selects the tier
and every test is in exactly one of the two."""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

if not any(ep.value == "harness.checking.pytest_plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["harness.checking.pytest_plugin"]


# markers that say why a test is slow; each implies ``slow`` (see pytest_collection_modifyitems)
SLOW_BECAUSE = ("model", "process", "ray", "http", "valgrind", "worktree", "gpu")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection and xdist's grouping read the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if item.get_closest_marker("slow") is None and any(item.get_closest_marker(m) for m in SLOW_BECAUSE):
            item.add_marker(pytest.mark.slow)
        if xdist and "miles_src" in getattr(item, "fixturenames", ()):
            # under ``-n N --dist loadgroup`` the tests on upstream Miles share one worker: importing
            # the tree takes seconds, and that worker's runs of it are shared across tests
            item.add_marker(pytest.mark.xdist_group("upstream"))


def pytest_configure(config: pytest.Config) -> None:
    from harness.checking import hypothesis_profiles, py311_guard

    py311_guard.install()  # this project's suites always run guarded (see the module's docstring)
    try:
        hypothesis_profiles.load_for_project()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture
def one_torch_thread():
    """Tiny matmuls: intra-op threads only add spin-wait contention on a shared 2-core box.
    Modules that run the tiny torch model use it with ``pytestmark``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster (num_cpus = the machine's cores) for the whole test session,
    stopped at its end; the ray layout's engine actors are pooled in it across tests
    (``harness.backends.ray_engine``). Yields ``ensure_ray()``'s start-up record."""
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.fail("the ray layout's tests need Ray: pip install -e '.[ray]' (make test installs it)")
    from harness.backends.ray_engine import ensure_ray, shutdown_ray

    info = ensure_ray(os.environ.get("MILES_HARNESS_RAY_ADDRESS") or None)
    yield info
    shutdown_ray()
