"""Engines sharing one host (``Contention(engine_slots=...)``) and its fit
(``harness.advise.costs.fit_engine_sharing``): two engines that share one slot decode
together as fast as one, a lone engine is not slowed, the fit recovers known slots and
per-engine weight sync from a simulated two-engine run, 0 slots change nothing, and the
fit refuses a run without several engines with a clear error."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from harness.advise.costs import CostModel, fit_engine_sharing, mode_rows
from harness.advise.predict import Layout, RoutedEngines, predict, simulate_layout
from harness.sim.contention import Contention
from harness.sim.engine import LengthDist, SimEngineConfig
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
SYNC = AsyncConfig(rollout_batch_size=8, n_samples_per_prompt=4, driver="train", num_rollout=12, seed=3)
FULLY_ASYNC = dataclasses.replace(SYNC, driver="train_async", fully_async=True)


def _decode_times(slots: float, starts: list[float]) -> list[float]:
    """Each engine gets one request of 10 steps of 0.1 s at its start time (through the
    router: each earlier request is still outstanding, so request i goes to engine i);
    returns when each finishes."""
    cfg = SimEngineConfig(
        decode_base_s=0.1,
        decode_per_seq_s=0.0,
        prefill_per_token_s=0.0,
        response_length=LengthDist(kind="fixed", median=10),
    )

    async def main():
        group = RoutedEngines(cfg, len(starts), contention=Contention(engine=0.0, trainer=0.0, engine_slots=slots))
        loop = asyncio.get_running_loop()
        done: list[float] = [0.0] * len(starts)

        async def one(i: int, t0: float) -> None:
            await asyncio.sleep(t0)
            fut = group.generate(Sample(index=i, group_index=i, prompt_tokens=[0]), SamplingParams(max_new_tokens=100))
            await fut
            done[i] = loop.time()

        await asyncio.gather(*(one(i, t0) for i, t0 in enumerate(starts)))
        return done

    return run_virtual(main())


def test_two_engines_sharing_one_slot_decode_together_as_fast_as_one():
    """Alone an engine needs 1 s. Two at once on one slot: each runs at half speed, 2 s."""
    assert _decode_times(1.0, [0.0]) == pytest.approx([1.0])
    assert _decode_times(1.0, [0.0, 0.0]) == pytest.approx([2.0, 2.0])
    assert _decode_times(2.0, [0.0, 0.0]) == pytest.approx([1.0, 1.0])  # two slots: no sharing
    assert _decode_times(0.0, [0.0, 0.0]) == pytest.approx([1.0, 1.0])  # 0: off


def test_sharing_follows_the_count_of_busy_engines_step_by_step():
    """Engine 1 starts at 0.5 s: engine 0 ran 0.5 s alone (half its work), then both share
    one slot; engine 0's other half takes 1 s (ends 1.5 s), in which engine 1 did half of
    its work; alone again, engine 1 finishes its last 0.5 s of work at 2.0 s."""
    assert _decode_times(1.0, [0.0, 0.5]) == pytest.approx([1.5, 2.0])


def _two_engine_results(tmp_path, truth: CostModel) -> str:
    rows = []
    for seed in (3, 4, 5):
        res = simulate_layout(truth, dataclasses.replace(SYNC, seed=seed), Layout(engines=2))
        rows.append(mode_rows(res))
    doc = {
        "kind": "run",
        "config": {"spec": {"layout": "ray", "num_engines": 2, "max_running": 16}, "modes": {"sync": SYNC.to_dict()}},
        "extra": {"repeats": {"sync": [r.to_dict() for r in rows]}},
    }
    path = tmp_path / "two.json"
    _write_run(path, doc)
    return str(path)


@pytest.mark.parametrize("slots", [0.8, 1.0, 1.5])
def test_the_fit_recovers_known_slots_and_per_engine_weight_sync(tmp_path, slots):
    truth = dataclasses.replace(ALONE, engine_slots=slots, weight_sync_per_engine_s=0.015)
    fitted = fit_engine_sharing(ALONE, _two_engine_results(tmp_path, truth))
    assert fitted.engine_slots == pytest.approx(slots, rel=0.02)
    assert fitted.weight_sync_per_engine_s == pytest.approx(0.015, rel=1e-6)
    assert fitted.fit["engine_sharing"]["engines"] == 2
    # and the fitted model predicts the truth's fully-async run
    assert predict(fitted, FULLY_ASYNC, Layout(engines=2))["step_s"] == pytest.approx(
        predict(truth, FULLY_ASYNC, Layout(engines=2))["step_s"], rel=0.03
    )


def test_engines_that_do_not_slow_each_other_fit_as_no_sharing(tmp_path):
    fitted = fit_engine_sharing(ALONE, _two_engine_results(tmp_path, ALONE))
    assert fitted.engine_slots == 0.0 and fitted.weight_sync_per_engine_s == pytest.approx(0.0, abs=1e-12)


def test_sharing_slows_a_two_engine_prediction_and_leaves_one_engine_alone():
    shared = dataclasses.replace(ALONE, engine_slots=1.0, weight_sync_per_engine_s=0.01)
    assert predict(shared, FULLY_ASYNC, Layout())["step_s"] == predict(ALONE, FULLY_ASYNC, Layout())["step_s"]
    assert predict(shared, SYNC, Layout(engines=2))["step_s"] > predict(ALONE, SYNC, Layout(engines=2))["step_s"]


def test_the_fit_refuses_a_run_with_one_engine(tmp_path):
    path = tmp_path / "one.json"
    row = mode_rows(simulate_layout(ALONE, SYNC, Layout()))
    _write_run(
        path,
        {
            "kind": "run",
            "config": {"spec": {"layout": "split"}, "modes": {"sync": SYNC.to_dict()}},
            "extra": {"repeats": {"sync": [row.to_dict()]}},
        },
    )
    with pytest.raises(ConfigError, match="--num-engines >= 2"):
        fit_engine_sharing(ALONE, path)


def test_negative_slots_are_refused_with_the_field_named():
    with pytest.raises(ConfigError, match="engine_slots"):
        Contention(engine=0.0, trainer=0.0, engine_slots=-1.0)


def test_engine_step_factors_against_the_model():
    """The validation's steps table: the engines' own step times (mean over engines) beside
    the factor the simulator applies: sharing ``n / slots`` times ``1 + engine contention``
    of the mode under training; a file without step times gives no entry."""
    from harness.advise.validate import _engine_steps, _steps_table

    costs = dataclasses.replace(
        ALONE,
        engine_slots=1.25,
        contention_by_mode={
            "fully-async": {"engine": 0.5, "trainer": 0.1},
            "one-step": {"engine": 0.2, "trainer": 0.1},
        },
    )
    engines = [
        {"step_ms": 20.0, "step_ms_training": 30.0, "step_ms_not_training": 15.0},
        {"step_ms": 22.0, "step_ms_training": 34.0, "step_ms_not_training": None},
    ]
    s = _engine_steps(engines, costs, FULLY_ASYNC, 2)
    assert s["step_ms"] == pytest.approx(21.0) and s["step_ms_training"] == pytest.approx(32.0)
    assert s["step_ms_not_training"] == pytest.approx(15.0)
    assert s["model_factor_not_training"] == pytest.approx(2 / 1.25)
    assert s["model_factor_training"] == pytest.approx(2 / 1.25 * 1.5)
    assert _engine_steps(engines, costs, FULLY_ASYNC, 1)["model_factor_training"] == pytest.approx(1.5)
    assert _engine_steps([{"tokens": 3}], costs, FULLY_ASYNC, 2) is None
    ref = {
        "file": "a",
        "mode": "sync",
        "calibration": True,
        "engines": 1,
        "layout": "ray",
        "engine_steps": {
            "step_ms": 10.0,
            "step_ms_training": None,
            "step_ms_not_training": 10.0,
            "model_factor_training": 1.0,
            "model_factor_not_training": 1.0,
        },
    }
    held = {"file": "b", "mode": "fully-async", "calibration": False, "engines": 2, "layout": "ray", "engine_steps": s}
    table = "\n".join(_steps_table([ref, held]))
    assert "32.00 (x3.20) | x2.40 | 15.00 (x1.50) | x1.60" in table
    assert _steps_table([held]) == []  # no one-engine sync reference: no table


def test_the_reading_uses_the_calibration_runs_step_times_where_recorded():
    from harness.advise.validate import _why_fully_async

    def row(mode, train, other):
        return {
            "file": "cal",
            "mode": mode,
            "calibration": mode == "sync",
            "engines": 1,
            "layout": "ray",
            "engine_steps": {"step_ms": 10.0, "step_ms_training": train, "step_ms_not_training": other},
        }

    report = {
        "calibration": "cal",
        "rows": [row("sync", None, 10.0), row("one-step", 12.0, 11.0), row("fully-async", 16.0, 12.0)],
    }
    text = _why_fully_async(report)
    assert "x1.20 of its sync step under training and x1.10 otherwise in one-step, x1.60 and x1.20" in text
    for r in report["rows"]:
        r.pop("engine_steps")
    assert "not settled" in _why_fully_async(report)


def test_measured_host_cores_are_the_median_over_repeats_and_unknown_if_one_lacks_them():
    from harness.advise.validate import measured

    def doc(cores):
        reps = [{"mode": "sync", "steps": 10, "wall_s": 5.0, "cpu_cores_total": c, "host_cpu_count": 2} for c in cores]
        return {"kind": "run", "extra": {"repeats": {"sync": reps}, "per_step": {}}}

    assert measured(doc([1.2, 1.8, 1.5]), "sync")["cpu_cores_total"] == pytest.approx(1.5)
    assert measured(doc([1.2, 1.8, 1.5]), "sync")["host_cpu_count"] == 2
    assert measured(doc([1.2, None]), "sync")["cpu_cores_total"] is None


def _write_run(path, doc):
    """``doc``'s config and extra in a results file the schema accepts (kind ``run``)."""
    from harness.results.schema import Results

    res = Results.new("run", doc.get("config", {}))
    res.extra.update(doc["extra"])
    return res.write(path)
