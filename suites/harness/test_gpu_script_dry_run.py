"""The GPU script's CPU dry run (``DEVICE=cpu bash suites/gpu/run_gpu_checks.sh OUT``):
every stage runs, the recorder stage included (upstream Miles on the CPU servers,
``python -m harness.record.served_run``), the summary reads every results file through
the schema, and the script exits 0. On the day a GPU is lent the same script runs there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results.run_extras import RunExtras
from harness.results.schema import load_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.process  # the script starts the CLI, the main job's engine process and upstream Miles
@pytest.mark.timeout(900)
def test_the_gpu_scripts_cpu_dry_run_runs_every_stage_and_exits_0(tmp_path, miles_src):
    out = tmp_path / "gpu-checks"
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "PY": sys.executable,
        "MILES_SRC": str(miles_src),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("MILES_CMD", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "suites/gpu/run_gpu_checks.sh"), str(out)],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=850,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "all checks passed" in log and "Traceback" not in log
    assert "(a) miles-harness run: ok" in log and "(b) miles-harness gap: ok" in log
    assert "recorder: exit 0" in log and "(e) recorder on a Miles run: ok" in log
    extras = RunExtras.from_doc(load_results(out / "run.json").doc, "run.json")
    assert set(extras.table) == {"sync", "one-step"}
    assert all(f"      {mode:<12} steps   2" in log for mode in extras.table)
    assert (out / "record" / "merged.jsonl").stat().st_size > 0
    # stage (f): upstream on the CPU servers killed after a checkpoint, resumed, the lives checked
    assert "kill and resume: exit 0" in log and "lives: 2 joined" in log
