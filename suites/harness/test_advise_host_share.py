"""The host's cores shared in proportion to demand (``harness.sim.contention.host_growth``,
``harness.advise.host_share``): the main process's demand in an overlapped mode makes
engines on one host share more than in sync; the figures come from the one-engine run's
cores per mode and the several-engine run's sync mode; without them nothing changes."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from harness.advise import host_share
from harness.advise.costs import CostModel, fit_engine_sharing, mode_rows
from harness.advise.predict import Layout, predict, simulate_layout
from harness.results.mode_rows import ModeRow
from harness.sim.contention import Contention, host_growth
from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError

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
ONE_STEP = dataclasses.replace(SYNC, driver="train_async")


def test_host_growth_is_the_extra_sharing_the_main_process_demand_brings():
    """Engines want 1 core each, the host gives them 1.5. Sync: 2 engines are slowed x4/3,
    one not at all. With the main process wanting 1 core: one engine x(2/1.5), two x(3/1.5),
    so the second engine costs x1.5 where in sync it cost x4/3: growth 1.125. With it
    wanting 0.5, one engine just fits (x1) and two are slowed x(2.5/1.5): growth 1.25."""
    assert host_growth(2, engine_cores=1.0, main_cores=1.0, host_cores=1.5) == pytest.approx(1.125)
    assert host_growth(2, engine_cores=1.0, main_cores=0.5, host_cores=1.5) == pytest.approx(1.25)
    assert host_growth(1, engine_cores=1.0, main_cores=1.0, host_cores=1.5) == 1.0
    for off in ({"engine_cores": 0.0}, {"main_cores": 0.0}, {"host_cores": 0.0}):
        assert host_growth(2, **{"engine_cores": 1.0, "main_cores": 1.0, "host_cores": 1.5, **off}) == 1.0


def test_the_engine_factor_is_the_sync_sharing_times_the_growth_times_the_training_slowdown():
    cores = {"engine_cores": 1.0, "main_cores": 1.0, "host_cores": 1.5}
    model = Contention(engine=0.5, trainer=0.0, engine_slots=1.5, **cores)
    plain = Contention(engine=0.5, trainer=0.0, engine_slots=1.5)
    for c in (model, plain):
        c.busy = 2
    assert plain.engine_factor() == 2 / 1.5  # without the cores: exactly the sync sharing, as before
    assert model.engine_factor() == pytest.approx(2 / 1.5 * 1.125)
    model.training = True
    assert model.engine_factor() == pytest.approx(2 / 1.5 * 1.125 * 1.5)
    model.busy = 1  # a lone engine: only its mode's own slow-down under training
    assert model.engine_factor() == pytest.approx(1.5)


def test_negative_cores_are_refused_with_the_field_named():
    with pytest.raises(ConfigError, match=r"main_cores = -1\.0: must be >= 0.*fix"):
        Contention(engine=0.0, trainer=0.0, engine_slots=1.0, main_cores=-1.0)


def test_the_main_process_demand_is_inferred_from_the_cores_the_lone_engine_kept():
    """Alone in sync the engine took 1.2 cores; two took 1.8. In fully-async it kept 0.9:
    shared in proportion to demand, 1.2 * 1.8 / (1.2 + main) = 0.9, so main = 1.2. In
    one-step it kept all it takes in sync: no sign of sharing, 0 (off)."""
    costs = dataclasses.replace(
        ALONE, engine_cores_by_mode={"sync": 1.2, "fully-async": 0.9, "one-step": 1.2}, host_engine_cores=1.8
    )
    assert host_share.main_cores(costs, "fully-async") == pytest.approx(1.2)
    assert host_share.main_cores(costs, "one-step") == 0.0
    assert host_share.figures(costs, "one-step") == {"engine_cores": 0.0, "main_cores": 0.0, "host_cores": 0.0}
    assert host_share.figures(costs, "fully-async") == {
        "engine_cores": 1.2,
        "main_cores": pytest.approx(1.2),
        "host_cores": 1.8,
    }
    assert host_share.main_cores(dataclasses.replace(costs, host_engine_cores=0.0), "fully-async") == 0.0
    assert host_growth(2, **host_share.figures(costs, "fully-async")) == pytest.approx((3.6 / 2.4) / (2.4 / 1.8))


def _rows(cores_per_engine, engines=1):
    return [
        ModeRow(
            mode="sync",
            steps=10,
            wall_s=5.0,
            rollout_busy_s=2.5,
            cpu_cores_engines=c * engines,
            cpu_cores_per_engine=[c] * engines,
        )
        for c in cores_per_engine
    ]


def test_engine_cores_are_per_engine_while_generating_over_one_engine_runs_only():
    """0.5 cores over the run while generating half of it: 1.0 while generating; median over
    the repeats; a mode run with two engines, or a repeat without the cores, is left out."""
    got = host_share.engine_cores_by_mode(
        {"sync": _rows([0.5, 0.6, 0.55]), "fully-async": _rows([0.45]), "one-step": _rows([0.5], engines=2)}
    )
    assert got == {"sync": pytest.approx(1.1), "fully-async": pytest.approx(0.9)}
    assert host_share.engine_cores_by_mode({"sync": _rows([0.5]) + [ModeRow(mode="sync", steps=10, wall_s=5.0)]}) == {}
    assert host_share.host_cores(_rows([0.45, 0.5], engines=2), 2) == pytest.approx(2 * 0.95)


def test_the_sharing_fit_reads_the_host_cores_off_the_several_engine_sync_mode(tmp_path):
    rows = []
    for seed in (3, 4):
        row = mode_rows(simulate_layout(ALONE, dataclasses.replace(SYNC, seed=seed), Layout(engines=2)))
        rows.append(dataclasses.replace(row, cpu_cores_engines=0.6, cpu_cores_per_engine=[0.3, 0.3]))
    doc = {
        "kind": "run",
        "config": {"spec": {"layout": "ray", "num_engines": 2, "max_running": 16}, "modes": {"sync": SYNC.to_dict()}},
        "extra": {"repeats": {"sync": [r.to_dict() for r in rows]}},
    }
    path = tmp_path / "two.json"
    _write_run(path, doc)
    expected = 2 * statistics.median(0.3 * r.wall_s / r.rollout_busy_s for r in rows)  # 2 engines
    with_cores = dataclasses.replace(ALONE, engine_cores_by_mode={"sync": 1.2})
    assert fit_engine_sharing(with_cores, path).host_engine_cores == pytest.approx(expected)
    assert fit_engine_sharing(ALONE, path).host_engine_cores == 0.0  # the calibration recorded no cores


def test_the_growth_slows_an_overlapped_two_engine_prediction_and_nothing_else():
    """The same costs with and without the host's cores: two engines in fully-async are
    slower with them; sync with two engines, and one engine in any mode, are the same run."""
    shared = dataclasses.replace(
        ALONE,
        engine_slots=1.5,
        contention_by_mode={
            "fully-async": {"engine": 0.5, "trainer": 0.1},
            "one-step": {"engine": 0.3, "trainer": 0.1},
        },
    )
    cores = dataclasses.replace(
        shared, engine_cores_by_mode={"sync": 1.2, "fully-async": 0.9, "one-step": 0.9}, host_engine_cores=1.8
    )
    two, one = Layout(engines=2), Layout()
    assert (
        predict(cores, FULLY_ASYNC, two)["busy_per_step_s"]["generating"]
        > predict(shared, FULLY_ASYNC, two)["busy_per_step_s"]["generating"]
    )
    assert predict(cores, SYNC, two)["step_s"] == predict(shared, SYNC, two)["step_s"]
    for cfg in (SYNC, ONE_STEP, FULLY_ASYNC):
        assert predict(cores, cfg, one)["step_s"] == predict(shared, cfg, one)["step_s"]


def test_mode_vs_sync_reads_the_models_growth_off_the_rows_factors():
    from harness.advise.validate import mode_vs_sync

    def row(engines, mode, step_ms, factor):
        return {
            "engines": engines,
            "mode": mode,
            "engine_steps": {"step_ms": step_ms, "model_factor_not_training": factor},
        }

    rows = [
        row(1, "sync", 10.0, 1.0),
        row(1, "fully-async", 15.0, 1.0),
        row(2, "sync", 14.0, 1.4),
        row(2, "fully-async", 28.0, 1.4 * 1.2),
    ]
    got = mode_vs_sync(rows)["fully-async"]
    assert got["growth"] == pytest.approx(4 / 3) and got["growth_model"] == pytest.approx(1.2)


def _write_run(path, doc):
    """``doc``'s config and extra in a results file the schema accepts (kind ``run``)."""
    from harness.results.schema import Results

    res = Results.new("run", doc.get("config", {}))
    res.extra.update(doc["extra"])
    return res.write(path)
