"""`miles-harness compare`: the U test against known values and brute force, block means
after warm-up (and why: autocorrelated per-step samples), thresholds with significance,
refusals (changed definition, damaged file, future schema, unknown metric, bad settings),
pytest-benchmark input, history mode (run means), and the two output formats."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main as cli
from harness.results.rank_test import block_means, mann_whitney_u
from harness.results.schema import Results

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "results"


def _run(seed: int, *, tokens_scale: float = 1.0, window: str = "steady", n: int = 12) -> Results:
    rng = np.random.default_rng(seed)
    res = Results.new("run", {"mode": "fully_async", "rollout_batch_size": 8}, definition_common={"model": "tiny"})
    res.add_benchmark("tokens_per_s", rng.normal(1000.0, 20.0, n) * tokens_scale, "tokens/s", True, {"window": window})
    res.add_benchmark("wall_s", rng.normal(30.0, 1.0, n), "s", False)
    return res


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    return {
        "base": str(_run(1).write(d / "base.json")),
        "noise": str(_run(2).write(d / "noise.json")),
        "slow": str(_run(3, tokens_scale=0.8).write(d / "slow.json")),
        "fast": str(_run(4, tokens_scale=1.2).write(d / "fast.json")),
        "redefined": str(_run(5, window="all").write(d / "redefined.json")),
    }


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _row(out: str, name: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.startswith(name + " "))


# --- the statistic ----------------------------------------------------------------------


def test_u_test_matches_the_published_scipy_example():
    # scipy.stats.mannwhitneyu docs: males vs females, U = 17, exact p = 0.1111,
    # asymptotic (continuity-corrected) p = 0.11134688653314041.
    males, females = [19, 22, 16, 29, 24], [20, 11, 17, 12]
    exact = mann_whitney_u(females, males)
    assert exact.method == "exact" and exact.p_value == pytest.approx(1 / 9)
    assert exact.prob_new_greater * 20 == pytest.approx(17)
    assert mann_whitney_u(females, males, method="normal").p_value == pytest.approx(0.11134688653314041, rel=1e-9)


def _brute_force_p(base, new) -> float:
    pooled = np.array(list(new) + list(base), dtype=float)
    ranks = np.array([np.mean(np.flatnonzero(np.sort(pooled) == v)) + 1 for v in pooled])
    k, centre = len(new), len(new) * (len(pooled) + 1) / 2
    obs = abs(ranks[:k].sum() - centre)
    splits = list(itertools.combinations(range(len(pooled)), k))
    return sum(abs(ranks[list(s)].sum() - centre) >= obs - 1e-9 for s in splits) / len(splits)


@pytest.mark.parametrize("seed", range(6))
def test_exact_p_value_equals_brute_force_enumeration_with_ties(seed):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 5, rng.integers(2, 7)).tolist()  # small integers: many ties
    new = rng.integers(1, 6, rng.integers(2, 7)).tolist()
    assert mann_whitney_u(base, new).p_value == pytest.approx(_brute_force_p(base, new), abs=1e-12)


def test_identical_samples_are_never_significant():
    assert mann_whitney_u([1.0] * 10, [1.0] * 10).p_value == 1.0
    assert mann_whitney_u([1.0] * 3, [1.0] * 3).p_value == 1.0


# --- what is compared: block means after warm-up ---------------------------------------


def test_block_means_drop_the_warm_up_and_average_contiguous_blocks():
    samples = [1000.0] + [float(i) for i in range(30)]  # step 0 is warm-up
    means, what = block_means(samples)
    assert means == [2.5, 8.5, 14.5, 20.5, 26.5]
    assert what == "5 block means of 6 steps each, first 1 step dropped as warm-up"
    means, what = block_means(samples[:30], warmup_steps=2, blocks=4)
    assert means == [np.mean(samples[2:9]), np.mean(samples[9:16]), np.mean(samples[16:23]), np.mean(samples[23:30])]
    assert what == "4 block means of 7 steps each, first 2 steps dropped as warm-up"
    assert block_means([5.0, 6.0, 7.0], warmup_steps=0) == (
        [5.0, 6.0, 7.0],
        "3 block means of 1 step, no warm-up step dropped",
    )
    # a single run-level value is not a per-step series: nothing to drop
    assert block_means([0.97]) == ([0.97], "1 block mean of 1 step, no warm-up step dropped")


def _series(values, tmp_path, name: str) -> str:
    res = Results.new("run", {})
    res.add_benchmark("tokens_per_s", list(values), "tokens/s", True)
    return str(res.write(tmp_path / f"{name}.json"))


def test_a_slowly_drifting_series_no_longer_gives_a_tiny_p_value(tmp_path, capsys):
    # Two runs that drift the same way (+2 tokens/s per step, e.g. caches warming up); the
    # second sits 20 higher. Step by step the 30 vs 30 samples look like strong evidence,
    # but consecutive steps are not independent replicates: blocks of 6 steps are.
    t = np.arange(31)
    base, new = 1000.0 + 2.0 * t, 1020.0 + 2.0 * t
    per_step = mann_whitney_u(list(base[1:]), list(new[1:]))
    assert per_step.p_value < 1e-3  # what comparing raw per-step samples claimed
    code, out, _ = _cli(
        capsys, _series(base, tmp_path, "base"), _series(new, tmp_path, "new"), "--threshold", "tokens_per_s:-10%"
    )
    row = _row(out, "tokens_per_s")
    assert code == 0 and row[-1] == "~" and float(row[6]) > 0.2
    assert "compared on each side: 5 block means of 6 steps each, first 1 step dropped as warm-up" in out


def _ar1(rng, n: int, phi: float) -> np.ndarray:
    noise = rng.normal(0.0, 10.0, n)
    x = np.empty(n)
    x[0] = noise[0] / np.sqrt(1 - phi**2)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + noise[i]
    return 1000.0 + x


def test_on_autocorrelated_runs_of_one_process_the_false_alarm_rate_is_near_alpha():
    # 300 pairs of runs of the same AR(1) process (lag-1 correlation 0.5), 31 steps each:
    # the per-step test rejects far more often than alpha; block means stay near 5%.
    rng = np.random.default_rng(7)
    per_step = blocks = 0
    for _ in range(300):
        a, b = _ar1(rng, 31, 0.5), _ar1(rng, 31, 0.5)
        per_step += mann_whitney_u(list(a[1:]), list(b[1:])).p_value < 0.05
        blocks += mann_whitney_u(block_means(a)[0], block_means(b)[0]).p_value < 0.05
    assert per_step / 300 > 0.15
    assert blocks / 300 < 0.09


def test_warm_up_steps_are_left_out_of_the_medians_and_the_test(tmp_path, capsys):
    steady = [1000.0 + (i * 7) % 11 for i in range(13)]
    cold_start = [200.0] + steady[1:]  # only step 0 differs: a slower warm-up
    code, out, _ = _cli(
        capsys, _series(steady, tmp_path, "a"), _series(cold_start, tmp_path, "b"), "--threshold", "tokens_per_s:-10%"
    )
    row = _row(out, "tokens_per_s")
    assert code == 0 and row[2] == row[3] and row[5] == "+0.0%" and row[6] == "1" and row[-1] == "~"
    code, out, _ = _cli(
        capsys,
        _series(steady, tmp_path, "a"),
        _series(cold_start, tmp_path, "b"),
        "--warmup-steps",
        "0",
        "--blocks",
        "4",
        "--markdown",
    )
    assert "compared on each side: 4 block means of 3-4 steps each, no warm-up step dropped" in out
    assert "4 contiguous blocks per run" in out.splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "needle"), [(["--warmup-steps", "-1"], "--warmup-steps -1"), (["--blocks", "1"], "--blocks 1")]
)
def test_bad_warm_up_or_block_settings_are_errors(files, capsys, argv, needle):
    code, _, err = _cli(capsys, files["base"], files["slow"], *argv)
    assert code == 2 and needle in err


# --- comparisons through the command line -----------------------------------------------


def test_a_20_percent_throughput_regression_fails_a_10_percent_threshold(files, capsys):
    code, out, _ = _cli(capsys, files["base"], files["slow"], "--threshold", "tokens_per_s:-10%")
    assert code == 1
    row = _row(out, "tokens_per_s")
    assert row[-1] == "worse" and float(row[5].rstrip("%")) == pytest.approx(-20, abs=3)
    assert "threshold tokens_per_s:-10%: FAILED" in out
    assert "thresholds: 1 of 1 failed (tokens_per_s:-10%)" in out


def test_noise_level_change_passes_the_threshold(files, capsys):
    code, out, _ = _cli(capsys, files["base"], files["noise"], "--threshold", "tokens_per_s:-10%")
    assert code == 0
    assert _row(out, "tokens_per_s")[-1] == "~"
    assert "threshold tokens_per_s:-10%: passed" in out


def test_improvement_is_marked_better_and_direction_follows_higher_is_better(files, capsys):
    code, out, _ = _cli(
        capsys, files["base"], files["fast"], "--threshold", "tokens_per_s:-10%", "--threshold", "wall_s:-10%"
    )
    assert code == 0 and _row(out, "tokens_per_s")[-1] == "better"
    # the same data read as a lower-is-better metric is a regression
    code, out, _ = _cli(capsys, files["fast"], files["base"], "--threshold", "tokens_per_s:-10%")
    assert code == 1 and _row(out, "tokens_per_s")[-1] == "worse"


def test_several_new_files_are_each_compared_and_any_failure_fails(files, capsys):
    code, out, _ = _cli(capsys, files["base"], files["noise"], files["slow"], "--threshold", "tokens_per_s:-10%")
    assert code == 1
    assert f"{files['base']} -> {files['noise']}" in out and f"{files['base']} -> {files['slow']}" in out


def test_changed_definition_is_refused_naming_benchmark_and_keys(files, capsys):
    code, out, err = _cli(capsys, files["base"], files["redefined"])
    assert code == 2 and out == ""
    assert "benchmark 'tokens_per_s' has a different definition" in err
    assert "definition.window: 'steady' vs 'all'" in err


def test_threshold_on_a_missing_metric_is_an_error(files, capsys):
    code, _, err = _cli(capsys, files["base"], files["slow"], "--threshold", "rollout/raw_reward:-5%")
    assert code == 2 and "'rollout/raw_reward' is missing from" in err and "tokens_per_s" in err


@pytest.mark.parametrize("text", ["tokens_per_s", "tokens_per_s:10%", "tokens_per_s:-x%", "tokens_per_s:-0%"])
def test_malformed_threshold_is_an_error(files, capsys, text):
    code, _, err = _cli(capsys, files["base"], files["slow"], "--threshold", text)
    assert code == 2 and f"--threshold {text!r}" in err


def test_damaged_file_names_the_file_and_position(files, capsys, tmp_path):
    bad = tmp_path / "damaged.json"
    bad.write_text(Path(files["base"]).read_text()[:-40])
    code, _, err = _cli(capsys, files["base"], str(bad))
    assert code == 2 and str(bad) in err and "not valid JSON" in err and re.search(r"line \d+ column \d+", err)


def test_future_schema_names_the_file_and_the_field(files, capsys, tmp_path):
    doc = json.loads(Path(files["base"]).read_text())
    doc["schema_version"] = 7
    fut = tmp_path / "future.json"
    fut.write_text(json.dumps(doc))
    code, _, err = _cli(capsys, str(fut), files["base"])
    assert code == 2 and str(fut) in err and "schema_version 7" in err and "upgrade miles-async-harness" in err


def test_too_few_samples_for_significance_fall_back_to_the_threshold_alone(tmp_path, capsys):
    base = _run(1, n=3).write(tmp_path / "b.json")
    slow = _run(3, n=3, tokens_scale=0.8).write(tmp_path / "s.json")
    code, out, _ = _cli(capsys, str(base), str(slow), "--threshold", "tokens_per_s:-10%")
    assert code == 1 and _row(out, "tokens_per_s")[-1] == "?"
    # 3 steps, the first dropped as warm-up: 2 block means of 1 step per side
    assert "2 vs 2 means cannot reach p < 0.05" in out and "threshold alone" in out


def test_a_large_but_not_significant_drop_passes_the_threshold(tmp_path, capsys):
    # medians 95 -> 77.5 (-18%), but the samples overlap: exact p = 0.486
    def one(samples):
        res = Results.new("run", {})
        res.add_benchmark("tokens_per_s", samples, "tokens/s", True)
        return str(res.write(tmp_path / f"{samples[0]}.json"))

    code, out, _ = _cli(
        capsys,
        one([100, 60, 140, 90]),
        one([85, 50, 130, 70]),
        "--threshold",
        "tokens_per_s:-10%",
        "--warmup-steps",
        "0",
    )
    assert code == 0
    row = _row(out, "tokens_per_s")
    assert row[5] == "-18.4%" and row[6] == "0.486" and row[7] == "~"
    assert "threshold tokens_per_s:-10%: not significant, passed" in out


# --- pytest-benchmark input -------------------------------------------------------------


def test_pytest_benchmark_files_compare_directly(capsys):
    f = str(FIXTURES / "pytest_benchmark_5.3.1_data.json")
    code, out, _ = _cli(capsys, f, f, "--threshold", "test_tiny.py::test_sum[10]:-10%")
    assert code == 0 and _row(out, "test_tiny.py::test_sum[10]")[-1] == "~"


def test_pytest_benchmark_without_raw_samples_uses_the_threshold_alone(capsys, tmp_path):
    raw = json.loads((FIXTURES / "pytest_benchmark_5.3.1_nodata.json").read_text())
    for b in raw["benchmarks"]:
        b["stats"]["median"] *= 1.5  # 50% slower, lower is better
    slower = tmp_path / "slower.json"
    slower.write_text(json.dumps(raw))
    base = str(FIXTURES / "pytest_benchmark_5.3.1_nodata.json")
    code, out, _ = _cli(capsys, base, str(slower), "--threshold", "test_tiny.py::test_sum[100]:-10%")
    assert code == 1
    assert _row(out, "test_tiny.py::test_sum[100]")[-1] == "?"
    assert "no raw samples (base 0, new 0): untested, threshold alone" in out


# --- history ----------------------------------------------------------------------------


def _history(tmp_path) -> Path:
    hist = tmp_path / "history"
    for day in range(1, 6):
        res = _run(10 + day)
        res.doc["created_utc"] = f"2025-01-0{day}T00:00:00.000000Z"
        res.write(hist / f"run{day}" / "results.json")
    other = _run(20, tokens_scale=0.5)  # another machine, newest: must be ignored
    other.doc["machine"]["cpu_model"] = "Some Other CPU"
    other.doc["created_utc"] = "2025-02-01T00:00:00.000000Z"
    other.write(hist / "other_machine.json")
    sim = Results.new("simulate", {})  # another kind: ignored
    sim.add_benchmark("tokens_per_s", [1.0, 2.0], "tokens/s", True, {"model": "tiny", "window": "steady"})
    sim.write(hist / "sim.json")
    (hist / "run1" / "trace.json").write_text(json.dumps([{"kind": "event"}]))  # not a results file
    return hist


def test_history_mode_compares_with_the_last_runs_of_the_same_machine_and_kind(tmp_path, capsys):
    hist = _history(tmp_path)
    new_ok = str(_run(30).write(tmp_path / "new_ok.json"))
    new_slow = str(_run(31, tokens_scale=0.8).write(tmp_path / "new_slow.json"))
    code, out, _ = _cli(capsys, new_ok, "--history", str(hist), "--last", "3", "--threshold", "tokens_per_s:-10%")
    assert code == 0, out
    assert "(means of last 3 of 5 runs)" in out
    assert (
        "compared base 3 run means, first 1 step of each run dropped as warm-up; "
        "new 5 block means of 2-3 steps each, first 1 step dropped as warm-up"
    ) in out
    assert 990 < float(_row(out, "tokens_per_s")[2]) < 1010  # the half-speed other machine is excluded
    code, out, _ = _cli(capsys, new_slow, "--history", str(hist), "--last", "3", "--threshold", "tokens_per_s:-10%")
    assert code == 1 and _row(out, "tokens_per_s")[-1] == "worse"


def test_history_without_matching_runs_is_a_cold_start_that_passes(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    new = str(_run(30).write(tmp_path / "new.json"))
    code, out, _ = _cli(capsys, new, "--history", str(tmp_path / "empty"), "--threshold", "tokens_per_s:-10%")
    assert code == 0 and "cold start" in out


def test_last_without_history_is_an_error(files, capsys):
    code, _, err = _cli(capsys, files["base"], files["slow"], "--last", "3")
    assert code == 2 and "--last 3 needs --history" in err


# --- output shapes ----------------------------------------------------------------------


def test_human_table_columns_are_aligned(files, capsys):
    _, out, _ = _cli(capsys, files["base"], files["slow"])
    lines = out.splitlines()
    sep = lines[2]
    spans = [m.span() for m in re.finditer(r"-+", sep)]
    assert len(spans) == 8
    for line in lines[1:5]:  # header, separator, two rows
        for i, (a, b) in enumerate(spans):
            cell = line[a:b]
            assert cell.strip(), (line, i)
            # left-aligned text columns start at the span, numbers end at it
            assert (cell[0] != " ") if i in (0, 1, 7) else (cell[-1] != " "), (line, i)


def test_markdown_output_is_a_gfm_table_with_a_summary(files, capsys):
    code, out, _ = _cli(capsys, files["base"], files["slow"], "--markdown", "--threshold", "tokens_per_s:-10%")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("### `") and "→" in lines[0]
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == "| benchmark | unit | base median | new median | ratio | change | p | mark |"
    assert re.fullmatch(r"\|(:?-+:?\|){8}", table[1])
    assert len(table) == 4 and all(line.count(" | ") == 7 for line in table[2:])
    assert "| `tokens_per_s` | tokens/s |" in table[2] or "| `tokens_per_s` | tokens/s |" in table[3]
    assert any("**worse**" in line for line in table)
    assert lines[-1].startswith("**Summary:** 1 worse") and "thresholds: 1 of 1 failed" in lines[-1]
