"""The ``--data-buffer`` entry point: the buffer suite run against a user's factory.

End to end, in a subprocess as a user would run it: a correct ``DefaultDataBuffer``
subclass passes; a buffer that serves newest first fails with a report naming the
``fifo`` invariant, the shrunk steps, the timeline and the reproduction blob; a bad
option value is a usage error. ``resolve_factory`` is also checked in process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.checking.pytest_plugin import resolve_factory

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "suites" / "properties" / "test_buffer_machine.py"

CORRECT = textwrap.dedent('''
    from miles_async_core.buffer import DefaultDataBuffer

    class TracedBuffer(DefaultDataBuffer):
        """A framework's own buffer: same policy, extra bookkeeping."""

        def __init__(self, constructor_input):
            super().__init__(constructor_input)
            self.puts = 0

        async def put(self, input):
            self.puts += 1
            await super().put(input)

    def make(constructor_input):
        with open("constructed.log", "a") as f:  # proves the suite used this factory
            f.write("x")
        return TracedBuffer(constructor_input)
''')

NEWEST_FIRST = textwrap.dedent("""
    from miles_async_core.buffer import DefaultDataBuffer

    class NewestFirst(DefaultDataBuffer):
        async def get(self, current_version=None, **context):
            self._buffer.reverse()
            try:
                return await super().get(current_version, **context)
            finally:
                self._buffer.reverse()

    def make(constructor_input):
        return NewestFirst(constructor_input)
""")


def run_suite(tmp_path: Path, module: str, source: str | None, spec: str) -> subprocess.CompletedProcess:
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "HYPOTHESIS_PROFILE": "miles-harness-ci",
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(SUITE),
            f"--data-buffer={spec}",
            "-p",
            "no:cacheprovider",
            "-q",
            # only the test that uses the factory; the rest of the file checks the machine itself
            "-k",
            "keeps_every_guarantee",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.process
def test_a_correct_buffer_subclass_passes_the_suite(tmp_path):
    out = run_suite(tmp_path, "good_buffer", CORRECT, "good_buffer:make")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
    assert len((tmp_path / "constructed.log").read_text()) >= 200  # one buffer per example, ci profile


@pytest.mark.process
def test_a_wrong_buffer_fails_with_a_report_naming_the_invariant(tmp_path):
    out = run_suite(tmp_path, "lifo_buffer", NEWEST_FIRST, "lifo_buffer:make")
    report = out.stdout + out.stderr
    assert out.returncode == 1, report
    assert "invariant 'fifo' violated" in report
    assert "state = BufferMachine()" in report and "state.init_buffer(" in report  # shrunk steps
    assert "buffer timeline of this example:" in report
    assert "!! fifo:" in report
    assert "@reproduce_failure(" in report  # print_blob under the ci profile


@pytest.mark.process
def test_a_bad_data_buffer_value_is_a_usage_error_naming_option_value_and_form(tmp_path):
    out = run_suite(tmp_path, "unused", None, "no_such_module_xyz:make")
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage-error exit code
    assert "--data-buffer='no_such_module_xyz:make'" in out.stderr
    assert "cannot be imported" in out.stderr
    assert "Expected --data-buffer=package.module:factory" in out.stderr


@pytest.mark.parametrize(
    "value, problem",
    [
        ("just_a_module", "not of the form package.module:factory"),
        (":make", "not of the form package.module:factory"),
        ("mod:", "not of the form package.module:factory"),
        ("json:no_such_factory", "json has no attribute 'no_such_factory'"),
        ("json:__doc__", "not callable"),
    ],
)
def test_resolve_factory_rejects_bad_values_with_the_expected_form(value, problem):
    with pytest.raises(pytest.UsageError) as err:
        resolve_factory(value)
    msg = str(err.value)
    assert msg.startswith(f"--data-buffer={value!r}: ")
    assert problem in msg
    assert "Expected --data-buffer=package.module:factory" in msg and "Fix: " in msg


def test_resolve_factory_imports_from_the_current_directory_and_follows_dotted_names(tmp_path, monkeypatch):
    (tmp_path / "cwd_buffer_mod.py").write_text(
        "class Holder:\n    @staticmethod\n    def make(ci):\n        return ci\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_buffer_mod", raising=False)
    factory = resolve_factory("cwd_buffer_mod:Holder.make")
    assert factory("x") == "x"


def test_default_fixture_is_the_default_buffer(data_buffer_factory, pytestconfig):
    from miles_async_core.buffer import DefaultDataBuffer

    if pytestconfig.getoption("--data-buffer"):
        pytest.skip("--data-buffer names another factory for this run")
    assert data_buffer_factory is DefaultDataBuffer


@pytest.mark.process
def test_the_plugin_registers_the_buffer_input_strategy_for_any_test(tmp_path):
    # A user's test module that never imports harness.checking.buffer_machine still gets the
    # registered strategy (one prompt group, one group_index), not hypothesis' guess
    # from the annotations (which draws empty and mixed groups).
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent("""
        from hypothesis import given, settings, strategies as st
        from miles_async_core.types import DataBufferInput

        @settings(max_examples=50, derandomize=True, database=None)
        @given(st.from_type(DataBufferInput))
        def test_groups_are_well_formed(entry):
            assert entry.prompt_group
            assert len({s.group_index for s in entry.prompt_group}) == 1
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(tmp_path / "test_user.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
