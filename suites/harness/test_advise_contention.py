"""Contention between the engines and the trainer (``harness.sim.contention``) and its fit
(``harness.advise.costs.fit_contention``): each side's slow-down follows the other's
state exactly, the fit recovers known factors from simulated runs, factors of 0 change
nothing, and the costs file carries the factors."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from harness.advise.costs import (
    CostModel,
    fit_costs,
    load_costs,
    mode_rows,
    observations_from_events,
    observations_from_results,
)
from harness.advise.predict import Layout, RoutedEngines, calibrated_units, predict, simulate_layout
from harness.sim.contention import Contention
from harness.sim.engine import LengthDist, SimEngine, SimEngineConfig
from harness.sim.run_scenario import simulate
from harness.sim.trainer import SimTrainer
from harness.sim.vtime import run_virtual
from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, SamplingParams

ALONE = CostModel(
    decode_base_s=0.004,
    decode_per_seq_s=0.0,
    prefill_per_token_s=0.0,
    max_running=16,
    prompt_tokens=5,
    max_new_tokens=6,
    response_length={"kind": "fixed", "median": 6.0},
    train_base_s=0.0,
    train_per_token_s=0.0004,
    weight_sync_s=0.02,
)
CONTENDED = dataclasses.replace(ALONE, contention_engine=0.25, contention_trainer=0.12)
SYNC = AsyncConfig(rollout_batch_size=8, n_samples_per_prompt=4, driver="train", num_rollout=16, seed=3)
ONE_STEP = dataclasses.replace(SYNC, driver="train_async")
FULLY_ASYNC = dataclasses.replace(SYNC, driver="train_async", fully_async=True)
MODES = {"sync": SYNC, "one-step": ONE_STEP, "fully-async": FULLY_ASYNC}


def test_an_engine_step_in_progress_keeps_its_done_part_when_the_rate_changes():
    """Ten steps of 0.1 s; at 0.25 s the rate halves: 0.75 s of work left takes 1.5 s."""

    async def main():
        eng = SimEngine(
            SimEngineConfig(
                decode_base_s=0.1,
                decode_per_seq_s=0.0,
                prefill_per_token_s=0.0,
                response_length=LengthDist(kind="fixed", median=10),
            )
        )
        loop = asyncio.get_running_loop()
        fut = eng.generate(Sample(index=0, group_index=0, prompt_tokens=[0]), SamplingParams(max_new_tokens=100))
        await asyncio.sleep(0.25)
        eng.set_slowdown(2.0)
        await fut
        return loop.time(), fut.result().response_length

    t, n = run_virtual(main())
    assert t == pytest.approx(0.25 + 0.75 * 2.0) and n == 10


def test_a_training_step_runs_slower_only_while_an_engine_decodes():
    """Work 1 s, trainer factor 1 (half speed) while an engine is busy from 0.2 s to
    0.6 s: 0.4 s of overlap costs 0.2 s of extra time, so the step ends at 1.2 s."""

    async def main():
        c = Contention(engine=0.0, trainer=1.0)
        loop = asyncio.get_running_loop()
        loop.call_at(0.2, c.engine_busy, 1)
        loop.call_at(0.6, c.engine_busy, 0)
        await c.train(1.0)
        return loop.time()

    assert run_virtual(main()) == pytest.approx(1.2)


def test_negative_contention_is_refused_with_the_field_and_the_fix():
    with pytest.raises(ConfigError, match=r"contention_trainer = -0.1: must be >= 0.*fix"):
        Contention(engine=0.0, trainer=-0.1)


def _observations(costs: CostModel):
    """What a results file gives the fit, made from simulated runs of the three modes."""
    runs = {m: simulate_layout(costs, cfg, Layout(), detail=(m == "sync")) for m, cfg in MODES.items()}
    assert all(r.error is None for r in runs.values())
    obs = observations_from_events(
        runs["sync"].events,
        mode="sync",
        samples_per_step=32,
        max_running=costs.max_running,
        prompt_tokens=None,
        max_new_tokens=costs.max_new_tokens,
    )
    obs.repeats = {m: [mode_rows(r)] for m, r in runs.items()}
    obs.configs = {m: cfg.to_dict() for m, cfg in MODES.items()}
    return obs


def test_the_fit_recovers_a_known_contention_from_simulated_runs():
    fitted = fit_costs(_observations(CONTENDED))
    # the simulator is the model, so the recovery is exact up to rounding
    assert fitted.contention_engine == pytest.approx(CONTENDED.contention_engine, rel=1e-6)
    assert fitted.contention_trainer == pytest.approx(CONTENDED.contention_trainer, rel=1e-6)
    info = fitted.fit["contention"]
    assert info["trainer"]["n"] == 2 and info["trainer"]["rms_rel_error"] < 1e-9
    # fully-async decodes more per trained step (it fills the buffer ahead): the fit must count it
    assert info["engine_steps_ratio"]["one-step"] == 1.0 < info["engine_steps_ratio"]["fully-async"]
    # the fitted model predicts the contended runs it came from
    for cfg in (ONE_STEP, FULLY_ASYNC):
        truth = predict(CONTENDED, cfg, Layout())["step_s"]
        assert predict(fitted, cfg, Layout())["step_s"] == pytest.approx(truth, rel=1e-6)


def test_each_overlapped_mode_gets_its_own_factors_when_the_modes_contend_differently():
    """Truth: one-step contends lightly, fully-async heavily (as the CPU main job does).
    The joint fit lands between them; the per-mode fit recovers each, and predictions of a
    mode use its own."""
    truth = dataclasses.replace(
        ALONE,
        contention_by_mode={
            "one-step": {"engine": 0.05, "trainer": 0.03},
            "fully-async": {"engine": 0.40, "trainer": 0.20},
        },
    )
    assert truth.contention_for(ONE_STEP) == (0.05, 0.03) and truth.contention_for(FULLY_ASYNC) == (0.40, 0.20)
    assert truth.contention_for(SYNC) == (0.0, 0.0)  # no own factors: the joint ones
    fitted = fit_costs(_observations(truth))
    for mode, cfg in (("one-step", ONE_STEP), ("fully-async", FULLY_ASYNC)):
        want = truth.contention_by_mode[mode]
        assert fitted.contention_by_mode[mode]["engine"] == pytest.approx(want["engine"], rel=1e-6)
        assert fitted.contention_by_mode[mode]["trainer"] == pytest.approx(want["trainer"], rel=1e-6)
        assert predict(fitted, cfg, Layout())["step_s"] == pytest.approx(
            predict(truth, cfg, Layout())["step_s"], rel=1e-6
        )
    assert 0.05 < fitted.contention_engine < 0.40
    # the joint factors alone predict fully-async too fast: the per-mode ones are what fix it
    joint = dataclasses.replace(fitted, contention_by_mode={})
    assert predict(joint, FULLY_ASYNC, Layout())["step_s"] < predict(truth, FULLY_ASYNC, Layout())["step_s"]


def test_the_fit_finds_no_contention_in_independent_runs():
    fitted = fit_costs(_observations(ALONE))
    assert fitted.contention_engine == pytest.approx(0.0, abs=1e-9)
    assert fitted.contention_trainer == pytest.approx(0.0, abs=1e-9)


def test_contention_zero_leaves_the_simulation_unchanged_event_for_event():
    """A coupling with both factors 0, attached by hand, is the same run as none (so
    costs without contention predict what they predicted before it existed)."""
    zero = Contention(engine=0.0, trainer=0.0)

    def engines(cfg, sink):
        return RoutedEngines(cfg, 1, sink=sink, weight_sync_s=ALONE.weight_sync_s, detail=True, contention=zero)

    def trainer(cfg):
        t = SimTrainer(cfg)
        t.contention = zero
        return t

    from harness.advise.predict import scenario_for

    for cfg in MODES.values():
        plain = simulate_layout(ALONE, cfg, Layout(), detail=True)
        coupled = simulate(scenario_for(ALONE, cfg, Layout()), engine_factory=engines, trainer_factory=trainer)
        assert [(e.t, e.kind, e.fields) for e in coupled.events] == [(e.t, e.kind, e.fields) for e in plain.events]
    timing = ("cpu_s", "samples_per_cpu_s")  # the prediction's own CPU time
    same = lambda p: {k: v for k, v in p.items() if k not in timing}  # noqa: E731
    zeroed = dataclasses.replace(CONTENDED, contention_engine=0.0, contention_trainer=0.0)
    assert same(predict(zeroed, FULLY_ASYNC, Layout())) == same(predict(ALONE, FULLY_ASYNC, Layout()))
    assert predict(CONTENDED, FULLY_ASYNC, Layout())["step_s"] > predict(ALONE, FULLY_ASYNC, Layout())["step_s"]


def test_contention_applies_to_the_calibrated_engine_and_trainer_sizes_only():
    assert calibrated_units(CONTENDED, Layout(engines=4))
    assert not calibrated_units(CONTENDED, Layout(gpus_per_engine=8))
    assert not calibrated_units(CONTENDED, Layout(trainer_gpus=2))
    bigger = Layout(gpus_per_engine=2, trainer_gpus=2)
    assert predict(CONTENDED, FULLY_ASYNC, bigger)["step_s"] == predict(ALONE, FULLY_ASYNC, bigger)["step_s"]


def test_the_costs_file_round_trips_the_contention_and_old_files_load_without_it(tmp_path):
    fitted = fit_costs(_observations(CONTENDED))
    path = fitted.write(tmp_path / "costs.json")
    loaded = load_costs(path)
    assert loaded.to_json() == fitted.to_json()
    assert loaded.contention_engine == fitted.contention_engine > 0
    old = {k: v for k, v in fitted.to_json().items() if not k.startswith("contention_")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    legacy = load_costs(tmp_path / "old.json")
    assert legacy.contention_engine == 0.0 and legacy.contention_trainer == 0.0


def test_the_fit_scales_the_costs_to_the_median_repeat(tmp_path):
    """A results file keeps the first repeat's timeline; the costs follow the median
    over the repeats of each side's busy time per step."""
    res = simulate_layout(ALONE, SYNC, Layout(), detail=True)
    from harness.measure.overlap import measurement_window, phase_spans

    row = mode_rows(res)
    slower = dataclasses.replace(row, rollout_busy_s=row.rollout_busy_s * 1.2, train_busy_s=row.train_busy_s * 1.1)
    doc = {
        "kind": "run",
        "config": {"spec": {"max_running": 16}, "modes": {"sync": SYNC.to_dict()}},
        "extra": {
            "modes": {"sync": {"phases": phase_spans(res.events, measurement_window(res.events, 0.0, res.wall_s))}},
            "per_step": {"sync": [{"tokens": 6 * 32} for _ in res.history]},
            "repeats": {"sync": [r.to_dict() for r in (row, slower, slower)]},
        },
    }
    path = tmp_path / "results.json"
    _write_run(path, doc)
    fitted = fit_costs(observations_from_results(path))
    assert fitted.fit["repeat_scale"]["engine"] == pytest.approx(1.2)
    assert fitted.train_per_token_s == pytest.approx(ALONE.train_per_token_s * 1.1, rel=1e-6)
    assert fitted.fit["contention"]["source"].startswith("none")
    assert fitted.contention_engine == 0.0 == fitted.contention_trainer


def test_validation_predicts_a_ray_run_with_its_engine_count_and_flags_rows_beyond_the_target():
    from harness.advise.validate import layout_of, summary

    assert layout_of({"layout": "ray", "num_engines": 2}) == Layout(engines=2)
    assert layout_of({"layout": "split", "num_engines": 2}) == Layout(engines=1)
    row = {
        "file": "runs/x/results.json",
        "calibration": False,
        "mode": "one-step",
        "layout": "split",
        "step_error": 0.04,
        "speedup_error": -0.03,
    }
    report = {
        "calibration": "runs/a/results.json",
        "rows": [row, dict(row, layout="ray", engines=2, step_error=-0.3, speedup_error=0.12)],
    }
    s = summary(report)
    assert s["split"]["within_target"] and s["split"]["worst_step_error"] == 0.04
    assert not s["ray"]["within_target"] and s["ray"]["worst_speedup_error"] == 0.12


def _write_run(path, doc):
    """``doc``'s config and extra in a results file the schema accepts (kind ``run``)."""
    from harness.results.schema import Results

    res = Results.new("run", doc.get("config", {}))
    res.extra.update(doc["extra"])
    return res.write(path)
