"""The loss table (``harness.measure.overlap_loss``) and the main job's aggregation of
interleaved repeats (``harness.main_job.rows.aggregate_repeats``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.main_job.gap_replay import GapRecorder as _GapRecorder
from harness.main_job.rows import aggregate_repeats
from harness.results.mode_rows import ModeRow
from harness.measure.overlap import ideal_speedup
from harness.measure.overlap_loss import PARTS, format_loss_table, loss_table, step_parts
from harness.trace import Event
from miles_async_core import events as ev

times = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


def _parts(R, T, W, P, extra):
    return {"R": R, "T": T, "W": W, "P": P, "S": max(R, T) + W + P + extra, "O": 0.0}


@given(times, times, times, times, times, times, times, times, times, times, times)
def test_the_parts_sum_exactly_to_measured_minus_ideal_step_and_to_one_minus_efficiency(
    Rs, Ts, Ws, Ps, Os, Ra, Ta, Wa, Pa, extra, slack
):
    busy = Rs + Ts + Ws + Ps
    if busy < 1e-3:
        return
    sync = {"R": Rs, "T": Ts, "W": Ws, "P": Ps, "S": busy + Os, "O": Os}
    mode = _parts(Ra, Ta, Wa, Pa, extra + slack + 1e-3)
    table = loss_table(sync, mode)
    # the ideal is the one the main job's row uses: sync step / ideal_speedup(R, T + weight sync)
    ideal = ideal_speedup(Rs, Ts + Ws + Ps)
    assert table["ideal_step_s"] == pytest.approx(sync["S"] / ideal, rel=1e-9, abs=1e-12)
    assert sum(table["parts_s"].values()) == pytest.approx(mode["S"] - table["ideal_step_s"], abs=1e-9)
    assert sum(table["parts_points"].values()) == pytest.approx(1 - table["overlap_efficiency"], abs=1e-9)
    assert table["overlap_efficiency"] == pytest.approx((sync["S"] / mode["S"]) / ideal, rel=1e-9)


def test_each_part_names_its_cause():
    sync = {"R": 4.0, "T": 3.0, "W": 0.5, "P": 0.5, "S": 8.0, "O": 0.0}  # rollout-bound: ideal step 4
    # the overlapped mode: rollout 1 s slower, training as in sync, weight sync and pause as in sync, 0.5 s waiting
    mode = {"R": 5.0, "T": 3.0, "W": 0.5, "P": 0.5, "S": 6.5, "O": 0.0}
    t = loss_table(sync, mode)
    assert t["ideal_step_s"] == pytest.approx(4.0)
    assert t["parts_s"] == pytest.approx(
        {
            "rollout slower": 1.0,
            "train slower": 0.0,
            "weight sync": 0.5,
            "pause and resume": 0.5,
            "waiting and other": 0.5,
        }
    )
    # train-bound: the ideal already charges sync's weight sync and pause on the trainer side
    sync = {"R": 2.0, "T": 3.0, "W": 0.5, "P": 0.5, "S": 6.0, "O": 0.0}
    mode = {"R": 2.0, "T": 3.5, "W": 0.5, "P": 0.75, "S": 4.75, "O": 0.0}
    t = loss_table(sync, mode)
    assert t["ideal_step_s"] == pytest.approx(4.0)
    assert t["parts_s"] == pytest.approx(
        {
            "rollout slower": 0.0,
            "train slower": 0.5,
            "weight sync": 0.0,
            "pause and resume": 0.25,
            "waiting and other": 0.0,
        }
    )
    text = format_loss_table({"one-step": t})
    assert all(name in text for name in PARTS) and "= measured - ideal" in text


def _events(rows):
    return [Event(i, t, kind, fields) for i, (t, kind, fields) in enumerate(rows)]


def test_step_parts_split_each_weight_sync_at_the_engines_pause_and_version_events():
    tr = {"side": "train"}
    rows = [
        (0.0, ev.PHASE_START, {"side": "rollout", "phase": "generating"}),
        (4.0, ev.PHASE_END, {"side": "rollout", "phase": "generating"}),
        (4.0, ev.PHASE_START, {**tr, "phase": "training"}),
        (7.0, ev.PHASE_END, {**tr, "phase": "training"}),
        (7.0, ev.PHASE_START, {**tr, "phase": "weight_sync"}),
        (7.25, ev.ENGINE_PAUSE, {"mode": "retract", "in_flight": 0}),
        (7.75, ev.ENGINE_VERSION, {"version": 2, "trainer_steps": 1}),
        (8.0, ev.PHASE_END, {**tr, "phase": "weight_sync"}),
        (8.5, ev.PHASE_START, {**tr, "phase": "weight_sync"}),  # no pause event inside: all weight sync
        (9.0, ev.PHASE_END, {**tr, "phase": "weight_sync"}),
    ]
    parts = step_parts(_events(rows), (0.0, 10.0), 2)
    assert parts == pytest.approx({"R": 2.0, "T": 1.5, "W": 0.5, "P": 0.25, "S": 5.0, "O": 0.75})


def _row(eff, wall, ages, losses_tag=None, passed=True):
    return ModeRow(
        mode="one-step",
        steps=4,
        wall_s=wall,
        speedup=eff * 1.5,
        overlap_efficiency=eff,
        age_hist=ages,
        lag_hist={},
        checks={"passed": passed},
        losses={"tag": losses_tag},
    )


def test_repeats_aggregate_to_medians_with_their_spread_and_the_median_repeats_loss_table():
    rows = [_row(0.9, 10.0, {0: 2}, "a"), _row(0.6, 14.0, {1: 3}, "b"), _row(0.8, 11.0, {0: 1, 1: 1}, "c")]
    agg = aggregate_repeats(rows)
    assert (agg.overlap_efficiency, agg.overlap_efficiency_min, agg.overlap_efficiency_max) == (0.8, 0.6, 0.9)
    assert (agg.wall_s, agg.wall_s_min, agg.wall_s_max, agg.repeats) == (11.0, 10.0, 14.0, 3)
    assert agg.speedup == pytest.approx(1.2)
    assert agg.age_hist == {0: 3, 1: 4}
    assert agg.losses == {"tag": "c"} and agg.losses_repeat == 2  # one slow repeat does not pick the table
    assert agg.checks_passed is True
    assert aggregate_repeats(rows + [_row(0.7, 12.0, {}, "d", passed=False)]).checks_passed is False


class _Sample:
    def __init__(self, versions):
        self.token_versions = type("TV", (), {"versions": lambda _self: versions})()


def test_the_gap_recorder_holds_only_the_versions_a_later_step_still_needs():
    recorder = _GapRecorder.__new__(_GapRecorder)
    # one-step: versions loaded after every step; step i trains on samples of step i - 1's weights
    recorder.loaded = [(v + 1, v) for v in range(6)]
    assert recorder.capacity([{0}, {0}, {1}, {2}, {3}, {4}]) == 2
    recorder.loaded = [(v + 1, v) for v in range(6)]  # sync: each step's samples come from its own weights
    assert recorder.capacity([{0}, {1}, {2}, {3}]) == 1
    # fully-async with staleness 2: a step holds its oldest token's version up to itself
    assert recorder.capacity([{0}, {0, 1}, {0, 1, 2}, {1, 3}, {2, 4}]) == 3
