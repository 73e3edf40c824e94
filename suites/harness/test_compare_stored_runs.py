"""`miles-harness compare` on the two stored CPU runs of the main job (results/cpu)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
RUN_A = ROOT / "results/cpu/run-a/results.json"
RUN_B = ROOT / "results/cpu/run-b/results.json"
THRESHOLDS = ["--threshold", "one-step/tokens_per_s:-10%", "--threshold", "one-step/overlap_efficiency:-5%"]


def test_two_stored_runs_compare_with_a_table_and_no_regression(capsys):
    assert cli(["compare", str(RUN_A), str(RUN_B), *THRESHOLDS]) == 0
    out = capsys.readouterr().out
    assert "one-step/tokens_per_s" in out and "thresholds: 0 of 2 failed" in out
    # 30 steps per run: step 0 dropped, the other 29 in 5 contiguous blocks per run
    assert "compared on each side: 5 block means of 15-16 steps each, first 1 step dropped as warm-up" in out


def test_a_20_percent_throughput_regression_injected_into_a_copy_fails_with_exit_1(tmp_path, capsys):
    doc = json.loads(RUN_B.read_text())
    bench = doc["benchmarks"]["one-step/tokens_per_s"]
    bench["samples"] = [x * 0.8 for x in bench["samples"]]
    bench["stats"] = {k: (v * 0.8 if k not in ("n",) else v) for k, v in bench["stats"].items()}
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(doc))
    assert cli(["compare", str(RUN_A), str(slow), *THRESHOLDS]) == 1
    out = capsys.readouterr().out
    assert "worse" in out and "one-step/tokens_per_s:-10%" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("one-step/tokens_per_s "))
    assert row[-1] == "worse" and float(row[6]) < 0.05  # 5 vs 5 block means, all lower


def test_a_noise_level_change_does_not_fail(tmp_path):
    doc = json.loads(RUN_B.read_text())
    bench = doc["benchmarks"]["one-step/tokens_per_s"]
    # shuffle the order and nudge each sample by under 2%: the distribution is unchanged
    bench["samples"] = [x * (1.0 + (0.015 if i % 2 else -0.015)) for i, x in enumerate(reversed(bench["samples"]))]
    noisy = tmp_path / "noisy.json"
    noisy.write_text(json.dumps(doc))
    assert cli(["compare", str(RUN_A), str(noisy), *THRESHOLDS]) == 0


def test_markdown_output_for_a_pull_request_comment(capsys):
    assert cli(["compare", str(RUN_A), str(RUN_B), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.count("|") > 20 and "---" in out
    assert "- compared on each side: 5 block means of 15-16 steps each, first 1 step dropped as warm-up" in out
    assert "on block means (5 contiguous blocks per run)" in out.splitlines()[-1]
