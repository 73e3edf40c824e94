"""The pytest plugin leaves a user's hypothesis profiles alone.

A scratch project (its own ``conftest.py`` registering and loading a profile ``mine``, one
hypothesis test) runs in a pytest subprocess with this package importable and its plugin
loaded (by the installed ``pytest11`` entry point, else ``-p harness.checking.pytest_plugin``),
selecting ``HYPOTHESIS_PROFILE=mine``: the test runs under the user's profile.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from harness.checking import hypothesis_profiles

REPO = Path(__file__).resolve().parents[2]

CONFTEST = textwrap.dedent("""
    import os
    from hypothesis import settings

    settings.register_profile("mine", max_examples=7, derandomize=True, database=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
""")

TEST = textwrap.dedent("""
    from hypothesis import given, settings, strategies as st

    SEEN = []

    @given(st.integers())
    def test_runs_under_the_users_profile(x):
        SEEN.append(x)

    def test_the_profile_was_the_users():
        assert settings.default.max_examples == 7, settings.default
        assert len(SEEN) == 7, SEEN

    def test_the_plugin_is_loaded(data_buffer_factory):  # a fixture of the plugin
        assert data_buffer_factory.__name__ == "DefaultDataBuffer"
""")


@pytest.mark.process
def test_a_users_own_profile_selected_by_the_variable_works_with_the_plugin(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_user.py").write_text(TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the scratch project is its own rootdir
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYPOTHESIS_PROFILE": "mine"}
    installed = any(ep.value == "harness.checking.pytest_plugin" for ep in entry_points(group="pytest11"))
    load = [] if installed else ["-p", "harness.checking.pytest_plugin"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *load, "-p", "no:cacheprovider", "-q", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    assert "3 passed" in report


def test_the_projects_profiles_have_names_of_their_own():
    assert all(name.startswith("miles-harness-") for name in hypothesis_profiles.NAMES)


def test_an_unknown_profile_for_the_projects_suites_names_the_variable_and_the_allowed_names(monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "no-such-profile")
    with pytest.raises(ValueError, match="HYPOTHESIS_PROFILE='no-such-profile'.*miles-harness-ci"):
        hypothesis_profiles.load_for_project()
