"""`miles-harness advise`: the cost fit recovers known costs from simulated runs, the
multi-engine router behaves, recommendations respect their target, and impossible
layouts are refused with an error naming the flag, the value, what is allowed and the fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from harness.advise.costs import (
    CostModel,
    fit_costs,
    load_costs,
    observations_from_events,
    observations_from_results,
    replay_admissions,
    replay_steps,
)
from harness.advise.predict import Layout, check_layout, parse_target, predict, recommend, simulate_layout
from harness.cli import main as cli_main
from harness.measure.overlap import measurement_window, phase_spans
from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError

KNOWN = CostModel(
    decode_base_s=0.004,
    decode_per_seq_s=0.0003,
    prefill_per_token_s=0.0001,
    max_running=16,
    prompt_tokens=5,
    max_new_tokens=48,
    response_length={"kind": "lognormal", "median": 12.0, "sigma": 0.6},
    train_base_s=0.05,
    train_per_token_s=0.0004,
    weight_sync_s=0.03,
    pause_resume_s=0.05,
)
SYNC = AsyncConfig(rollout_batch_size=8, n_samples_per_prompt=4, driver="train", num_rollout=20, seed=3)
FULLY_ASYNC = dataclasses.replace(SYNC, driver="train_async", fully_async=True)


def _fit(costs: CostModel, *, with_fully_async: bool) -> CostModel:
    sync = simulate_layout(costs, SYNC, Layout(), detail=True)
    assert sync.error is None
    fa = simulate_layout(costs, FULLY_ASYNC, Layout(), detail=True) if with_fully_async else None
    obs = observations_from_events(
        sync.events,
        mode="sync",
        samples_per_step=32,
        max_running=costs.max_running,
        prompt_tokens=None,
        max_new_tokens=costs.max_new_tokens,
        fully_async_events=fa.events if fa else None,
    )
    return fit_costs(obs)


def test_fit_recovers_known_costs_from_a_simulated_run():
    fitted = _fit(KNOWN, with_fully_async=True)
    for name in (
        "decode_base_s",
        "decode_per_seq_s",
        "prefill_per_token_s",
        "train_base_s",
        "train_per_token_s",
        "weight_sync_s",
    ):
        assert getattr(fitted, name) == pytest.approx(getattr(KNOWN, name), rel=1e-6), name
    assert fitted.prompt_tokens == KNOWN.prompt_tokens
    assert fitted.fit["engine"]["dropped"] == [] and fitted.fit["trainer"]["dropped"] == []
    assert fitted.fit["engine"]["rms_rel_error"] < 1e-9
    # lengths: lognormal median and sigma from 640 draws
    assert fitted.response_length["kind"] == "lognormal"
    assert fitted.response_length["median"] == pytest.approx(12.0, rel=0.1)
    assert fitted.response_length["sigma"] == pytest.approx(0.6, rel=0.15)
    # pause/resume: estimated net of the step-boundary wait, so approximately
    assert fitted.pause_resume_s == pytest.approx(KNOWN.pause_resume_s, rel=0.2)


def test_fit_reports_what_a_uniform_run_cannot_identify():
    """Every request the same length and every step the same batch: per-step and
    per-sequence decode cost move together, so one is dropped and said so; the fitted
    model still predicts the run it came from."""
    uniform = dataclasses.replace(
        KNOWN, response_length={"kind": "fixed", "median": 6.0}, prefill_per_token_s=0.0, train_base_s=0.0
    )
    fitted = _fit(uniform, with_fully_async=False)
    assert "decode_per_seq_s" in fitted.fit["engine"]["dropped"]
    assert any("decode_per_seq_s" in n for n in fitted.fit["notes"])
    assert fitted.response_length == {"kind": "fixed", "median": 6.0}
    truth = predict(uniform, SYNC, Layout())["step_s"]
    assert predict(fitted, SYNC, Layout())["step_s"] == pytest.approx(truth, rel=1e-6)


def test_fit_from_a_results_file_matches_the_fit_from_its_trace(tmp_path):
    """The main job's results.json (phases + per-step tokens, no per-request lengths)."""
    costs = dataclasses.replace(
        KNOWN, response_length={"kind": "fixed", "median": 6.0}, max_new_tokens=6, pause_resume_s=0.0
    )
    res = simulate_layout(costs, SYNC, Layout(), detail=True)
    window = measurement_window(res.events, 0.0, res.wall_s)
    doc = {
        "config": {"spec": {"max_running": 16}, "modes": {"sync": SYNC.to_dict()}},
        "extra": {
            "modes": {"sync": {"phases": phase_spans(res.events, window)}},
            "per_step": {"sync": [{"tokens": h["tokens"] if "tokens" in h else 6 * 32} for h in res.history]},
        },
    }
    path = tmp_path / "results.json"
    _write_run(path, doc)
    fitted = fit_costs(observations_from_results(path))
    assert not fitted.fit["engine"]["dropped"] or fitted.fit["engine"]["rms_rel_error"] < 1e-6
    assert fitted.weight_sync_s == pytest.approx(costs.weight_sync_s, rel=1e-6)
    assert predict(fitted, SYNC, Layout())["step_s"] == pytest.approx(
        predict(costs, SYNC, Layout())["step_s"], rel=0.01
    )
    out = fitted.write(tmp_path / "costs.json")
    assert load_costs(out).to_json() == fitted.to_json()


def test_replay_steps_is_the_fifo_makespan():
    assert replay_steps([4] * 32, 16) == 8
    assert replay_steps([10, 1, 1, 1], 2) == 10
    assert replay_steps([3, 3, 3], 1) == 9


def test_more_engines_shorten_a_rollout_bound_step():
    slow = dataclasses.replace(KNOWN, train_base_s=0.0, train_per_token_s=0.00001, pause_resume_s=0.0)
    one = predict(slow, SYNC, Layout(engines=1))
    two = predict(slow, SYNC, Layout(engines=2))
    assert two["step_s"] < 0.75 * one["step_s"]
    assert one["speedup"] == 1.0 and two["age_true"]["max"] == 0
    fa = predict(slow, FULLY_ASYNC, Layout(engines=2))
    assert fa["speedup"] > 1.0 and fa["samples_trained"] == 20 * 32


def test_recommendation_meets_its_age_target():
    rec = recommend(KNOWN, FULLY_ASYNC, Layout(), "fastest with age <= 1", base_lr=1e-3, steps=8)
    best = rec["best"]
    assert best is not None and best["age_true_max"] <= 1
    assert all(best["step_s"] <= c["step_s"] + 1e-12 for c in rec["candidates"] if c["ok"])
    assert best["lr"] == pytest.approx(1e-3 / best["lr_factor"])


@pytest.mark.parametrize("target", ["quickest", "fastest with age < 2", "fastest with age <= -1"])
def test_bad_target_is_refused(target):
    with pytest.raises(ConfigError, match="--target"):
        parse_target(target)


@pytest.mark.parametrize(
    "layout, config, needles",
    [
        (Layout(engines=0), SYNC, ["--engines 0", ">= 1", "fix: --engines 1"]),
        (
            Layout(gpus_per_engine=3),
            SYNC,
            ["--gpus-per-engine 3", "1, 2, 4, 8", "multiple of 8", "fix: --gpus-per-engine 2"],
        ),
        (Layout(gpus_per_engine=12), SYNC, ["--gpus-per-engine 12", "fix: --gpus-per-engine 8"]),
        (Layout(trainer_gpus=3), SYNC, ["--trainer-gpus 3", "32 samples", "divisor of 32", "fix:"]),
        (
            Layout(engines=2, gpus_per_engine=4, trainer_gpus=4),
            dataclasses.replace(SYNC, colocate=True),
            ["--trainer-gpus 4 with --colocate", "fix: --trainer-gpus 8"],
        ),
        (Layout(), dataclasses.replace(FULLY_ASYNC, pause_generation_mode="abort"), ["abort"]),
    ],
)
def test_impossible_layouts_are_refused_with_the_flag_and_the_fix(layout, config, needles):
    with pytest.raises(ConfigError) as info:
        check_layout(layout, config)
    for needle in needles:
        assert needle in str(info.value)


def test_cli_refuses_an_impossible_layout_before_simulating(capsys):
    rc = cli_main(
        ["advise", "--costs", "/nonexistent/costs.json", "--gpus-per-engine", "3", "--", "--rollout-batch-size", "8"]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "--gpus-per-engine 3" in err and "fix:" in err


def test_cli_prints_a_prediction_and_a_recommendation(tmp_path, capsys):
    costs = KNOWN.write(tmp_path / "costs.json")
    rc = cli_main(
        [
            "advise",
            "--costs",
            str(costs),
            "--engines",
            "2",
            "--target",
            "fastest with age <= 1",
            "--plot",
            str(tmp_path / "engines.png"),
            "--",
            "--fully-async",
            "--rollout-batch-size",
            "8",
            "--n-samples-per-prompt",
            "4",
            "--num-rollout",
            "6",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for needle in (
        "predicted step time",
        "speedup over sync",
        "overlap efficiency",
        "age, Miles recorded",
        "age, true oldest token",
        "dropped / retried share",
        "buffer occupancy",
        "recommended:",
        "rule of thumb",
    ):
        assert needle in out
    assert (tmp_path / "engines.png").stat().st_size > 0


def test_lr_study_plan_and_metrics():
    from harness.advise.lr_study import metrics, plan

    runs = plan([0, 1, 2, 4], [1, 2, 4], [0, 1, 2], 1e-3)
    # per seed: 4 fully-async base + 3 rule (s > 0), 3 one-step base + 2 rule (k > 1)
    assert len(runs) == 3 * (4 + 3 + 3 + 2)
    rule = {(r["family"], r["value"]): r["lr"] for r in runs if r["arm"] == "rule"}
    assert rule[("fully-async", 4)] == pytest.approx(2e-4) and rule[("one-step", 2)] == pytest.approx(5e-4)
    hist = [
        {
            "train/reward_mean": 0.1 * i,
            "train/loss": 1.0 + 0.01 * (i % 3),
            "train/grad_norm": 1.0,
            "train/train_rollout_logprob_abs_diff": 0.5 * i,
        }
        for i in range(10)
    ]
    hist[6]["train/loss"] = 9.0  # one spike
    hist[7]["train/grad_norm"] = 50.0  # one outlier
    m = metrics(hist)
    assert m["loss_spikes"] == 1 and m["grad_norm_outliers"] == 1
    assert m["gap_slope"] == pytest.approx(0.5)
    assert m["final_reward"] == pytest.approx(0.7) and m["auc_reward"] == pytest.approx(0.45)


def test_closed_form_matches_the_simulator_when_nothing_varies():
    """Fixed lengths, trainer-bound: the closed-form one-step step time is the simulator's."""
    from harness.advise.validate import closed_form

    c = dataclasses.replace(
        KNOWN,
        response_length={"kind": "fixed", "median": 8.0},
        max_new_tokens=8,
        prefill_per_token_s=0.0,
        pause_resume_s=0.0,
    )
    one_step = dataclasses.replace(SYNC, driver="train_async")
    cf = closed_form(c, one_step)
    # the measurement window ends with the last training step: 19 of the 20 weight syncs fall in it
    w = c.weight_sync_s / SYNC.num_rollout
    assert predict(c, SYNC, Layout())["step_s"] == pytest.approx(cf["sync_step_s"] - w, rel=1e-6)
    assert predict(c, one_step, Layout(), sync_steps=20)["step_s"] == pytest.approx(cf["one_step_step_s"], rel=0.05)


def test_cli_prints_the_calibrations_held_out_accuracy_when_the_costs_carry_it(tmp_path, capsys):
    """``validate`` stores its held-out summary in the costs file; ``advise`` prints it with
    each prediction, flagging a calibration that missed 10%; costs without it print none."""
    args = ["--", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--num-rollout", "4"]
    plain = KNOWN.write(tmp_path / "plain.json")
    assert cli_main(["advise", "--costs", str(plain)] + args) == 0
    assert "held-out" not in capsys.readouterr().out
    validated = dataclasses.replace(
        KNOWN,
        fit={
            "validation": {
                "report": "v.md",
                "held_out": {
                    "split": {
                        "rows": 8,
                        "worst_step_error": -0.093,
                        "worst_step_row": "run-b8 one-step",
                        "worst_speedup_error": 0.091,
                        "worst_speedup_row": "run-b8 one-step",
                        "within_target": True,
                    },
                    "ray": {
                        "rows": 2,
                        "worst_step_error": -0.139,
                        "worst_step_row": "ray-2 fully-async",
                        "worst_speedup_error": 0.231,
                        "worst_speedup_row": "ray-2 fully-async",
                        "within_target": False,
                    },
                },
            }
        },
    )
    path = validated.write(tmp_path / "validated.json")
    assert cli_main(["advise", "--costs", str(path)] + args) == 0
    out = capsys.readouterr().out
    assert "split layout, 8 row(s): worst s/step error -9.3% (run-b8 one-step)" in out
    assert "all within 10%" in out
    assert "ray layout, 2 row(s): worst s/step error -13.9% (ray-2 fully-async), worst speedup error +23.1%" in out
    assert "NOT all within 10%: treat this kind of prediction as rough" in out


def test_validate_stores_its_held_out_summary_in_the_costs_file_it_writes(tmp_path):
    from harness.advise.validate import main as validate_main

    root = Path(__file__).resolve().parents[2]
    rc = validate_main(
        [
            "--calibrate",
            str(root / "results/cpu/run-a/results.json"),
            "--predict",
            str(root / "results/cpu/run-b/results.json"),
            "--out",
            str(tmp_path),
            "--name",
            "_t",
        ]
    )
    assert rc == 0
    v = load_costs(tmp_path / "cpu_costs_t.json").fit["validation"]
    assert v["report"].endswith("validation_t.md")
    held = v["held_out"]["split"]
    assert held["rows"] == 3 and set(held) >= {"worst_step_error", "worst_speedup_error", "within_target"}


WAVES = dataclasses.replace(
    KNOWN,
    decode_per_seq_s=0.0,
    prefill_per_token_s=0.0,
    prefill_base_s=0.006,
    response_length={"kind": "fixed", "median": 6.0},
    max_new_tokens=6,
)


def _waves_obs() -> Any:
    sync = simulate_layout(WAVES, SYNC, Layout(), detail=True)
    assert sync.error is None
    return observations_from_events(
        sync.events, mode="sync", samples_per_step=32, max_running=16, prompt_tokens=None, max_new_tokens=6
    )


def test_a_prefill_batch_costs_its_base_once_per_admitting_step():
    """32 requests of 6 tokens in 16 slots: 2 waves, each one admitting step, 12 decode
    steps in all; the sync step's generating time is 12 * decode_base + 2 * prefill_base."""
    obs = _waves_obs()
    assert replay_admissions([6] * 32, 16) == 2 and replay_steps([6] * 32, 16) == 12
    for s in obs.steps[1:]:
        assert s.generating_s == pytest.approx(12 * 0.004 + 2 * 0.006, rel=1e-9)


def test_fit_takes_the_prefill_base_from_the_engines_own_steps_and_leaves_decode_its_own_cost():
    """With equal lengths the phase times cannot split a wave's prefill from its decode
    steps (without the engine's step times it is folded into decode_base_s); the engine's
    admitting minus decode-only step time gives it, and decode_base_s comes out exact."""
    obs = _waves_obs()
    folded = fit_costs(obs)
    assert folded.prefill_base_s == 0.0 and "none" in folded.fit["prefill_base"]["source"]
    assert folded.decode_base_s == pytest.approx(0.004 + 2 * 0.006 / 12, rel=1e-6)
    obs.engine_steps = {"step_ms_admitting": 10.0, "step_ms_decode_only": 4.0, "steps_admitting": 38}
    fitted = fit_costs(obs)
    assert fitted.prefill_base_s == pytest.approx(0.006, rel=1e-9)
    assert fitted.decode_base_s == pytest.approx(0.004, rel=1e-6)
    assert fitted.fit["prefill_base"]["value_s"] == pytest.approx(0.006)
    assert predict(fitted, SYNC, Layout())["step_s"] == pytest.approx(
        predict(WAVES, SYNC, Layout())["step_s"], rel=1e-6
    )
    assert fitted.engine_config(gpus_per_engine=2).prefill_base_s == pytest.approx(0.003)


def _write_run(path, doc):
    """``doc``'s config and extra in a results file the schema accepts (kind ``run``)."""
    from harness.results.schema import Results

    res = Results.new("run", doc.get("config", {}))
    res.extra.update(doc["extra"])
    return res.write(path)
