"""One definition of busy/idle: `simulate`'s summary and the main job's row (`run`) both
measure a trace with ``harness.measure.overlap``, so one trace gives one set of numbers,
and the run's timeline is the same pairing of phase events."""

from __future__ import annotations

import dataclasses

import pytest

from harness.main_job.outputs import phases as _phases
from harness.main_job.report import format_table
from harness.main_job.result import ModeResult
from harness.main_job.rows import summarize_mode
from harness.sim.scenario import DEFAULT_SCENARIO
from harness.sim.run_scenario import OVERLAP_RATIOS, SimResult, format_summary, simulate, summarize
from harness.trace import Event
from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig


def _trace() -> list[Event]:
    """Setup wait before the first generate (t=1); one-step overlap; the last training
    step ends at t=11; a final weight sync after it (outside the measured window)."""
    rows = [
        (0.0, ev.PHASE_START, {"side": "train", "phase": "waiting"}),
        (1.0, ev.GENERATE_START, {"rollout_id": 0, "version": 0}),
        (1.0, ev.PHASE_START, {"side": "rollout", "phase": "generating"}),
        (5.0, ev.PHASE_END, {"side": "rollout", "phase": "generating"}),
        (5.0, ev.PHASE_END, {"side": "train", "phase": "waiting"}),
        (5.0, ev.PHASE_START, {"side": "train", "phase": "training"}),
        (5.0, ev.PHASE_START, {"side": "rollout", "phase": "generating"}),
        (8.0, ev.PHASE_END, {"side": "train", "phase": "training"}),
        (8.0, ev.PHASE_START, {"side": "train", "phase": "weight_sync"}),
        (9.0, ev.PHASE_END, {"side": "train", "phase": "weight_sync"}),
        (9.0, ev.PHASE_START, {"side": "train", "phase": "waiting"}),
        (10.0, ev.PHASE_END, {"side": "rollout", "phase": "generating"}),
        (10.0, ev.PHASE_END, {"side": "train", "phase": "waiting"}),
        (10.0, ev.PHASE_START, {"side": "train", "phase": "training"}),
        (11.0, ev.PHASE_END, {"side": "train", "phase": "training"}),
        (11.0, ev.PHASE_START, {"side": "train", "phase": "weight_sync"}),
        (12.0, ev.PHASE_END, {"side": "train", "phase": "weight_sync"}),
    ]
    return [Event(i, t, kind, fields) for i, (t, kind, fields) in enumerate(rows)]


def _both_reports(events: list[Event], config: AsyncConfig, history: list[dict], wall_s: float) -> tuple[dict, dict]:
    sim = summarize(
        SimResult(
            scenario=dataclasses.replace(DEFAULT_SCENARIO, config=config),
            history=history,
            wall_s=wall_s,
            events=events,
            engine_stats={},
        )
    )
    run = summarize_mode(ModeResult.from_trace("one-step", config, history, events, 0.0, wall_s), None)
    return sim, run


def test_one_hand_built_trace_gives_the_same_ratios_in_simulate_and_run():
    sim, run = _both_reports(_trace(), AsyncConfig(), [], 12.0)
    # window [1, 11]: generating [1, 10]; training [5, 8] + [10, 11]; sync [8, 9]; waiting [1, 5] + [9, 10]
    expected = {"rollout_idle_ratio": 0.1, "train_idle_ratio": 0.5, "both_busy_fraction": 0.3, "wait_time_ratio": 0.5}
    for key, value in expected.items():
        assert sim[key] == pytest.approx(value), key
        assert getattr(run, key) == sim[key], key
    assert sim["window_s"] == run.wall_s == pytest.approx(10.0)
    assert sim["rollout_idle_s"] == pytest.approx(1.0) and sim["train_training_s"] == pytest.approx(4.0)


def test_one_simulated_trace_gives_the_same_ratios_and_printed_figures_in_simulate_and_run():
    scenario = dataclasses.replace(DEFAULT_SCENARIO, config=dataclasses.replace(DEFAULT_SCENARIO.config, num_rollout=4))
    result = simulate(scenario)
    assert result.error is None
    sim, run = _both_reports(result.events, scenario.config, result.history, result.wall_s)
    for key in OVERLAP_RATIOS:
        assert getattr(run, key) == sim[key], key
        assert 0.0 <= sim[key] <= 1.0, key
    assert sim["both_busy_fraction"] > 0.0  # fully-async: rollout and training overlap
    printed_sim, printed_run = format_summary(sim), format_table([run])
    for key in OVERLAP_RATIOS:
        assert f"{sim[key]:.1%}" in printed_sim and f"{getattr(run, key):.1%}" in printed_run, key


def test_the_run_timeline_is_the_overlap_pairing_clipped_to_the_window():
    r = ModeResult.from_trace("one-step", AsyncConfig(), [], _trace(), 0.0, 12.0)
    assert r.window == (1.0, 11.0)
    assert _phases(r) == [  # by start, then end
        ("train", "waiting", 0.0, 4.0),
        ("rollout", "generating", 0.0, 9.0),
        ("train", "training", 4.0, 7.0),
        ("train", "weight_sync", 7.0, 8.0),
        ("train", "waiting", 8.0, 9.0),
        ("train", "training", 9.0, 10.0),
    ]
