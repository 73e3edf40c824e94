"""``harness.advise.validate_runs``: the range of the Ray validation's held-out errors over
several runs (the runs themselves take minutes each and are made by ``make results``)."""

from __future__ import annotations

import pytest

from harness.advise.validate_runs import ranges


def _run(os_step, os_speed, fa_step, fa_speed):
    rows = [
        {"mode": "one-step", "step_error": os_step, "speedup_error": os_speed},
        {"mode": "fully-async", "step_error": fa_step, "speedup_error": fa_speed},
    ]
    within = all(abs(x) <= 0.10 for x in (os_step, os_speed, fa_step, fa_speed))
    return {"rows": rows, "summary": {"within_target": within}}


def test_ranges_span_every_run_and_count_the_runs_within_target():
    r = ranges([_run(-0.05, 0.01, -0.139, 0.231), _run(-0.091, 0.011, 0.002, -0.023)])
    assert r["fully-async/step_error"] == {
        "min": pytest.approx(-0.139),
        "max": pytest.approx(0.002),
        "mean": pytest.approx(-0.0685),
        "sd": pytest.approx(0.0997021),
        "n": 2,
    }
    assert r["fully-async/speedup_error"]["max"] == pytest.approx(0.231)
    assert r["one-step/step_error"]["min"] == pytest.approx(-0.091)
    assert r["runs_within_10pct"] == 1 and r["runs"] == 2


def test_a_held_out_row_says_how_far_its_own_repeats_spread_and_if_the_prediction_is_inside():
    from harness.advise.validate_runs import _noise

    row = {"measured_step_s_range": [0.427, 0.527], "measured_step_s": 0.485, "predicted_step_s": 0.409}
    assert _noise(row) == {
        "measured_step_s_range": [0.427, 0.527],
        "repeat_spread": pytest.approx(0.2061856),
        "predicted_within_repeats": False,
    }
    assert _noise({**row, "predicted_step_s": 0.45})["predicted_within_repeats"] is True
    runs = [
        {
            "rows": [
                {"mode": "fully-async", "step_error": -0.157, **_noise(row)},
                {"mode": "one-step", "step_error": 0.01, **_noise({**row, "predicted_step_s": 0.5})},
            ],
            "summary": {"within_target": False},
        }
    ]
    r = ranges(runs)
    assert r["fully-async/predicted_within_repeats"] == {"rows": 0, "of": 1}
    assert r["one-step/predicted_within_repeats"] == {"rows": 1, "of": 1}
    assert r["fully-async/repeat_spread"]["max"] == pytest.approx(0.2061856)


def _row(engines, mode, step_ms, cores=None):
    return {"engines": engines, "mode": mode, "engine_steps": {"step_ms": step_ms}, "engine_cores_generating": cores}


def test_mode_vs_sync_growth_is_1_where_a_mode_slows_as_much_with_2_engines_as_with_1():
    """A mode's engine step over the sync step of the same run: on these rows the same with 1
    and with 2 engines for one-step (x1.5 both: growth 1), not for fully-async (x1.5, then
    x2.0: growth 4/3)."""
    from harness.advise.validate_runs import mode_vs_sync

    rows = [
        _row(1, "sync", 10.0),
        _row(1, "one-step", 15.0),
        _row(1, "fully-async", 15.0, cores=0.9),
        _row(2, "sync", 14.0),
        _row(2, "one-step", 21.0),
        _row(2, "fully-async", 28.0, cores=0.5),
    ]
    got = mode_vs_sync(rows)
    assert got["one-step"]["growth"] == pytest.approx(1.0)
    assert got["fully-async"]["step_vs_sync_1_engine"] == pytest.approx(1.5)
    assert got["fully-async"]["step_vs_sync_2_engines"] == pytest.approx(2.0)
    assert got["fully-async"]["growth"] == pytest.approx(4 / 3)
    assert got["fully-async"]["engine_cores_generating_2_engines"] == 0.5
    # a mode without the engines' own steps on one side is left out, not guessed
    rows[4] = {**rows[4], "engine_steps": None}
    assert set(mode_vs_sync(rows)) == {"fully-async"}
    r = ranges([{**_run(0, 0, 0, 0), "mode_vs_sync": got}, {**_run(0, 0, 0, 0), "mode_vs_sync": {}}])
    assert r["fully-async/engine_step_vs_sync_growth"] == {
        "min": pytest.approx(4 / 3),
        "max": pytest.approx(4 / 3),
        "mean": pytest.approx(4 / 3),
        "sd": None,
        "n": 1,
    }


def test_rescore_without_kept_pairs_names_the_flag_and_the_fix(tmp_path):
    from harness.advise.validate_runs import main

    (tmp_path / "run0").mkdir()
    (tmp_path / "run0" / "ray-1.json.gz").write_bytes(b"")  # ray-2 missing: not a pair
    with pytest.raises(SystemExit, match=r"--rescore .*no kept pairs.*fix: make them with --keep DIR"):
        main(["--rescore", str(tmp_path), "--out", str(tmp_path / "out.json")])


def test_keep_and_rescore_together_are_refused(tmp_path):
    from harness.advise.validate_runs import main

    with pytest.raises(SystemExit, match="--keep and --rescore: give one"):
        main(["--keep", str(tmp_path / "a"), "--rescore", str(tmp_path / "b")])


def test_kept_pairs_come_in_number_order_and_need_both_files(tmp_path):
    from harness.advise.validate_runs import kept_pairs

    for name, files in (("run10", 2), ("run2", 2), ("run3", 1), ("runx", 2)):
        (tmp_path / name).mkdir()
        for n in range(1, files + 1):
            (tmp_path / name / f"ray-{n}.json.gz").write_bytes(b"")
    assert [d.name for d in kept_pairs(tmp_path)] == ["run2", "run10"]


@pytest.mark.slow
def test_the_committed_range_is_what_the_model_gives_on_its_kept_pairs(tmp_path):
    """The committed range file's first pair, validated again from its kept results files:
    the same held-out errors (a model change that moves them needs the file made again,
    ``validate_runs --rescore results/advise/ray_pairs``)."""
    import json
    import shutil
    from pathlib import Path

    from harness.advise.validate_runs import rescore

    root = Path(__file__).resolve().parents[2] / "results/advise"
    doc = json.loads((root / "validation_ray_runs.json").read_text())
    first = doc["runs"][0]
    shutil.copytree(root / "ray_pairs" / first["pair"], tmp_path / "kept" / first["pair"])
    [again] = rescore(tmp_path / "kept", tmp_path / "work")
    for mine, committed in zip(again["rows"], first["rows"], strict=True):
        assert mine["mode"] == committed["mode"]
        assert mine["step_error"] == pytest.approx(committed["step_error"], abs=1e-9)
        assert mine["speedup_error"] == pytest.approx(committed["speedup_error"], abs=1e-9)
    for mode, diag in again["mode_vs_sync"].items():  # read off the measurements alone: no model in it
        assert diag["growth"] == pytest.approx(first["mode_vs_sync"][mode]["growth"], abs=1e-12)


def test_runs_zero_needs_kept_pairs_to_report_on(tmp_path):
    from harness.advise.validate_runs import main

    with pytest.raises(SystemExit, match=r"--runs 0: must be >= 1 \(>= 0 with --keep"):
        main(["--runs", "0", "--out", str(tmp_path / "out.json")])
    with pytest.raises(SystemExit, match=r"--keep .* --runs 0: no kept pairs .* nothing to validate; fix"):
        main(["--keep", str(tmp_path / "empty"), "--runs", "0", "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()


def test_rescore_makes_no_runs(tmp_path):
    from harness.advise.validate_runs import main

    with pytest.raises(SystemExit, match=r"--rescore with --runs 3: --rescore makes no runs; fix"):
        main(["--rescore", str(tmp_path), "--runs", "3"])


def test_make_results_runs_the_optional_rescore_only_when_named():
    from harness.results.regenerate import select

    assert "advise_validation_ray_rescore" not in {s.name for s in select(None)}
    assert [s.name for s in select("advise_validation_ray_rescore")] == ["advise_validation_ray_rescore"]
