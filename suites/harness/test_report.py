"""`miles-harness report`: every plot is drawn from a results document that carries all
the documented ``extra`` keys, and a plot whose data are absent or malformed is skipped
with a message instead of crashing the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.cli import main as cli
from harness.results.schema import Results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "results"


def _phases(gen_s: float, train_s: float, *, sync: bool, steps: int = 4) -> list[list]:
    out, t = [], 0.0
    for _ in range(steps):
        if sync:
            out += [["rollout", "generating", t, t + gen_s], ["train", "waiting", t, t + gen_s]]
            t += gen_s
            out += [["rollout", "waiting", t, t + train_s], ["train", "training", t, t + train_s]]
            t += train_s
        else:
            out += [["rollout", "generating", t, t + gen_s], ["train", "training", t + 0.2, t + 0.2 + train_s]]
            t += max(gen_s, train_s + 0.2)
        out += [["rollout", "weight_sync", t, t + 0.3], ["train", "weight_sync", t, t + 0.3]]
        t += 0.3
    return out


def _full(seed: int = 0) -> Results:
    rng = np.random.default_rng(seed)
    res = Results.new("run", {"rollout_batch_size": 8})
    res.add_benchmark("tokens_per_s", rng.normal(1000.0, 20.0, 8), "tokens/s", True)
    res.add_benchmark("wall_s", rng.normal(30.0, 1.0, 8), "s", False)
    res.extra["modes"] = {
        "sync": {
            "phases": _phases(2.0, 1.5, sync=True),
            "sample_ages": [0] * 64,
            "speedup": 1.0,
            "overlap_efficiency": 0.0,
            "wall_s": 15.2,
        },
        "one_step": {
            "phases": _phases(2.0, 1.5, sync=False),
            "sample_ages": [1] * 60 + [0] * 4,
            "speedup": 1.61,
            "overlap_efficiency": 0.82,
            "wall_s": 9.4,
        },
        "fully_async": {
            "phases": _phases(1.8, 1.5, sync=False),
            "sample_ages": [int(a) for a in rng.integers(0, 4, 64)],
            "speedup": 1.74,
            "overlap_efficiency": 0.91,
            "wall_s": 8.7,
        },
    }
    res.extra["gap_steps"] = [
        {"step": s, "kernel": k, "staleness": 0.002 * s, "total": k + 0.002 * s}
        for s, k in enumerate(0.01 + 0.001 * rng.random(10))
    ]
    return res


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5 * 1024, (path, len(data))


@pytest.mark.slow
def test_report_draws_every_plot_from_a_document_with_all_extras(tmp_path, capsys):
    full = _full().write(tmp_path / "full.json")
    later = _full(1)
    later.doc["created_utc"] = "2099-01-01T00:00:00.000000Z"
    later_path = later.write(tmp_path / "later.json")
    out = tmp_path / "png"
    assert cli(["report", str(full), str(later_path), "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    expected = [
        f"{stem}_{kind}.png"
        for stem in ("full", "later")
        for kind in ("phase_timeline", "sample_ages", "mode_summary", "gap_steps")
    ]
    expected.append("metric_history.png")
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    for name in expected:
        _assert_png(out / name)
    assert "skipped" not in stdout and "report: 9 plot(s)" in stdout


def test_absent_data_skip_each_plot_with_a_message_and_exit_0(tmp_path, capsys):
    bare = Results.new("run", {})
    bare.add_benchmark("wall_s", [1.0, 2.0], "s", False)
    path = bare.write(tmp_path / "bare.json")
    assert cli(["report", str(path), "--out", str(tmp_path / "png")]) == 0
    stdout = capsys.readouterr().out
    assert f"report: no extra.modes.*.phases in {path}, skipped phase timeline" in stdout
    assert f"report: no extra.gap_steps in {path}, skipped gap decomposition" in stdout
    assert "skipped metric history" in stdout
    assert list((tmp_path / "png").iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"modes": {"sync": {"phases": [["gpu", "generating", 0, 1]]}}}, "side 'gpu'"),
        ({"modes": {"sync": {"phases": [["train", "training", 2, 1]]}}}, "ends before it starts"),
        ({"modes": {"sync": {"sample_ages": [0, -1]}}}, "non-negative integers"),
        ({"modes": {"sync": {"speedup": "fast"}}}, "extra.modes.sync.speedup is 'fast'"),
        ({"gap_steps": [{"step": 0, "kernel": 0.1}]}, "extra.gap_steps[0].staleness is None"),
    ],
)
def test_malformed_extras_skip_the_plot_and_say_why(tmp_path, capsys, extra, needle):
    res = Results.new("run", {})
    res.extra.update(extra)
    path = res.write(tmp_path / "bad.json")
    assert cli(["report", str(path), "--out", str(tmp_path / "png")]) == 0
    assert needle in capsys.readouterr().out


def test_pytest_benchmark_files_give_a_metric_history_in_seconds(tmp_path, capsys):
    files = [str(FIXTURES / n) for n in ("pytest_benchmark_5.3.1_nodata.json", "pytest_benchmark_5.3.1_data.json")]
    assert cli(["report", *files, "--out", str(tmp_path)]) == 0
    _assert_png(tmp_path / "metric_history.png")
    assert "report: 1 plot(s)" in capsys.readouterr().out


def test_sub_second_times_are_labelled_in_a_readable_unit():
    from harness.results.plots import _time_scale

    assert _time_scale("s", [5.3e-7, 1.7e-7]) == ("ns", 1e9)
    assert _time_scale("s", [0.02]) == ("ms", 1e3)
    assert _time_scale("s", [12.0]) == ("s", 1.0)
    assert _time_scale("tokens/s", [0.5]) == ("tokens/s", 1.0)
