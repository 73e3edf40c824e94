"""The example workflow for Miles' repository (``docs/examples/miles-gate.yml``): it validates
against GitHub's workflow schema and passes zizmor's offline audit (slow tier: both start
a process), and it runs the gate against the pull request's merge base, posts the
summary, and fails the check on exit 1 (a new violation) only.

Linters missing from the environment skip their test with the reason and the package
that provides them (both belong in the ``test`` extra)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="needs PyYAML to read the workflow: pip install pyyaml")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "examples" / "miles-gate.yml"
ZIZMOR_CONFIG = (
    'rules:\n  unpinned-uses:\n    config:\n      policies:\n        "actions/*": ref-pin\n        "*": hash-pin\n'
)


def steps() -> dict[str, dict]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return {s.get("id", s["name"]): s for s in doc["jobs"]["gate"]["steps"]}


@pytest.mark.process
def test_the_example_validates_against_githubs_workflow_schema():
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema is not installed; add `check-jsonschema>=0.29` to the test extra")
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.process
def test_the_example_passes_zizmors_offline_audit(tmp_path):
    exe = shutil.which("zizmor", path=str(Path(sys.executable).parent)) or shutil.which("zizmor")
    if exe is None:
        pytest.skip("zizmor is not installed; add `zizmor>=1.0` to the test extra")
    config = tmp_path / "zizmor.yml"
    config.write_text(ZIZMOR_CONFIG)
    done = subprocess.run(
        [exe, "--offline", "--no-progress", "--config", str(config), str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_runs_on_pull_requests_with_a_read_only_default():
    doc = yaml.safe_load(WORKFLOW.read_text())
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert "pull_request" in on and "train_async.py" in on["pull_request"]["paths"]
    assert doc["permissions"] == {"contents": "read"}
    assert doc["jobs"]["gate"]["permissions"] == {"contents": "read", "pull-requests": "write"}


def test_the_gate_runs_against_the_merge_base_and_keeps_its_exit_code():
    run = steps()["gate"]["run"]
    assert 'git -C miles merge-base "$BASE_SHA" HEAD' in run
    assert 'miles-harness gate --miles-src miles --base "$base" --out gate-out' in run
    assert 'echo "exit=$code" >> "$GITHUB_OUTPUT"' in run
    assert steps()["gate"]["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"


def test_the_summary_is_posted_and_only_a_new_violation_or_unchecked_code_fails_the_check():
    s = steps()
    assert "gate-out/summary.md" in s["comment"]["with"]["script"]
    assert "pull_request.head.repo.full_name == github.repository" in s["comment"]["if"]
    verdict = s["Verdict"]["run"]
    assert '1) echo "::error::a new invariant violation' in verdict
    assert '4) echo "::error::changed async code never ran' in verdict and "gate-accept-unrun" in verdict
    assert '2) echo "::warning::' in verdict
    names = list(s)
    assert names.index("gate") < names.index("comment") < names.index("Verdict")


def test_the_example_names_no_path_of_this_machine():
    text = WORKFLOW.read_text()
    assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text
