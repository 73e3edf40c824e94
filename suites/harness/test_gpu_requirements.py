"""``MILES_HARNESS_REQUIRE_GPU``: on a machine that must run the GPU tests, a missing GPU,
NVML, sglang or test model fails the run (naming what is missing) instead of skipping.

Runs pytest in subprocesses on this machine: on a tiny generated test file that uses
``require_or_skip`` (always), and on ``suites/gpu`` itself (wherever its requirements
are missing, i.e. everywhere but a working GPU runner)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.checking.requirements import REQUIRE_GPU_ENV, gpu_required, require_or_skip

ROOT = Path(__file__).resolve().parents[2]
WIDGET = "needs a flux capacitor (none is plugged in)"


def _pytest(args: list[str], *, require: bool, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (REQUIRE_GPU_ENV, "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if require:
        env[REQUIRE_GPU_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("value", "required"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("false", False),
        ("off", False),
        ("1", True),
        ("true", True),
        ("yes", True),
    ],
)
def test_the_variable_is_read_as_a_switch(value, required):
    env = {} if value is None else {REQUIRE_GPU_ENV: value}
    assert gpu_required(env) is required


def test_require_or_skip_skips_or_fails_by_the_variable(monkeypatch):
    monkeypatch.delenv(REQUIRE_GPU_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="flux capacitor"):
        require_or_skip(WIDGET)
    monkeypatch.setenv(REQUIRE_GPU_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_GPU_ENV} is set.*flux capacitor"):
        require_or_skip(WIDGET)


@pytest.mark.process
def test_a_generated_test_using_the_helper_skips_or_fails_the_run(tmp_path):
    (tmp_path / "test_widget.py").write_text(
        "from harness.checking.requirements import require_or_skip\n\n"
        "def test_needs_hardware():\n"
        f"    require_or_skip({WIDGET!r})\n"
    )
    plain = _pytest(["test_widget.py"], require=False, cwd=tmp_path)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "1 skipped" in plain.stdout and WIDGET in plain.stdout
    strict = _pytest(["test_widget.py"], require=True, cwd=tmp_path)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "1 failed" in strict.stdout and WIDGET in strict.stdout and REQUIRE_GPU_ENV in strict.stdout


def _gpu_suite_missing() -> str:
    from harness.checking.requirements import cuda_missing_reason, module_installed

    if not module_installed("sglang"):
        return "sglang is not installed"
    missing = cuda_missing_reason()
    if missing is None:
        pytest.skip("sglang and a CUDA GPU are present here: suites/gpu runs for real, nothing is missing")
    return missing


@pytest.mark.process
@pytest.mark.timeout(600)
def test_the_gpu_suite_fails_on_a_runner_that_requires_it_and_skips_elsewhere():
    missing = _gpu_suite_missing()
    plain = _pytest(["suites/gpu", "-q"], require=False, cwd=ROOT)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "skipped" in plain.stdout and "failed" not in plain.stdout and "error" not in plain.stdout
    assert "needs sglang and a CUDA GPU" in plain.stdout and missing in plain.stdout
    strict = _pytest(["suites/gpu", "-q"], require=True, cwd=ROOT)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "skipped" not in strict.stdout
    assert f"{REQUIRE_GPU_ENV} is set" in strict.stdout and missing in strict.stdout


def test_a_registered_import_stand_in_is_not_taken_for_the_installed_package(monkeypatch):
    """The upstream tier registers stand-ins for packages that are not installed; such a
    module has no spec, where ``importlib.util.find_spec`` raises instead of answering."""
    import importlib.util
    import types

    from harness.checking.requirements import module_installed

    name = "miles_harness_not_installed_pkg"
    stand_in = types.ModuleType(name)
    stand_in.__miles_harness_fake__ = True
    monkeypatch.setitem(sys.modules, name, stand_in)
    with pytest.raises(ValueError):
        importlib.util.find_spec(name)
    assert module_installed(name) is False
    assert module_installed("json") is True
