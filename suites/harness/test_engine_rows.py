"""Per-engine rows (``harness.measure.engines``): each engine's decode steps split by
whether the trainer trained meanwhile, on a hand-built trace whose answer is known."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_async_core import events as ev
from harness.measure.engines import format_engine_rows, per_engine_rows
from harness.trace import TraceRecorder


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _trace() -> list:
    clock = _Clock()
    rec = TraceRecorder(clock, strict=True)

    def at(t: float, kind: str, **fields) -> None:
        clock.t = t
        rec.emit(kind, **fields)

    # training from 1.0 to 2.0; engine 0 steps 10 ms alone and 30 ms under training,
    # engine 1 steps only under training (20 ms); one step of engine 0 straddles the start
    # with 4 of its 10 ms inside training (not "under training": less than half)
    at(0.10, ev.DECODE_STEP, indices=[1, 2], version=0, dur_s=0.010, engine=0)
    at(0.50, ev.DECODE_STEP, indices=[1, 2], version=0, dur_s=0.010, engine=0)
    at(0.495, ev.ADMITTED, index=1, version=0, prefix_tokens=3, engine=0)  # inside engine 0's step at 0.50
    at(1.00, ev.PHASE_START, side="train", phase="training")
    at(1.004, ev.DECODE_STEP, indices=[1], version=0, dur_s=0.010, engine=0)
    at(1.50, ev.DECODE_STEP, indices=[1], version=0, dur_s=0.030, engine=0)
    at(1.60, ev.DECODE_STEP, indices=[3], version=0, dur_s=0.020, engine=1)
    at(1.70, ev.DECODE_STEP, indices=[3], version=0, dur_s=0.020, engine=1)
    at(2.00, ev.PHASE_END, side="train", phase="training")
    at(3.00, ev.DECODE_STEP, indices=[1], version=0, dur_s=0.010, engine=0)  # after the window
    # each engine's own generating phases (engine 0's second one runs past the window's end)
    for t, kind, engine in (
        (0.05, ev.PHASE_START, 0),
        (0.60, ev.PHASE_END, 0),
        (1.55, ev.PHASE_START, 1),
        (1.75, ev.PHASE_END, 1),
        (1.00, ev.PHASE_START, 0),
        (3.10, ev.PHASE_END, 0),
    ):
        at(t, kind, side="rollout", phase="generating", engine=engine)
    return rec.events


def test_steps_are_split_by_training_overlap():
    rows = {r["engine"]: r for r in per_engine_rows(_trace(), (0.0, 2.0))}
    e0, e1 = rows[0], rows[1]
    assert e0["decode_steps"] == 4 and e0["steps_training"] == 1
    assert e0["step_ms_training"] == pytest.approx(30.0)
    assert e0["step_ms_not_training"] == pytest.approx(10.0)
    assert e0["step_ms"] == pytest.approx(15.0)
    assert e0["tokens"] == 6
    assert e1["decode_steps"] == 2 and e1["steps_training"] == 2
    assert e1["step_ms_training"] == pytest.approx(20.0)
    assert e1["step_ms_not_training"] is None
    assert e0["step_ms_sd"] == pytest.approx(10.0)  # 10, 10, 10, 30 ms
    assert e1["step_ms_sd"] == pytest.approx(0.0)
    assert e0["steps_admitting"] == 1 and e0["step_ms_admitting"] == pytest.approx(10.0)
    assert e0["step_ms_decode_only"] == pytest.approx(50.0 / 3)
    assert e1["steps_admitting"] == 0 and e1["step_ms_admitting"] is None  # engine 0's admission is not its


def test_each_engines_generating_time_is_its_own_phases_inside_the_window():
    rows = {r["engine"]: r for r in per_engine_rows(_trace(), (0.0, 2.0))}
    assert rows[0]["generating_busy_s"] == pytest.approx(0.55 + 1.0)  # 0.05-0.60, and 1.00 to the window's end
    assert rows[1]["generating_busy_s"] == pytest.approx(0.20)


def test_table_shows_the_split_and_dashes_for_none():
    text = format_engine_rows({"fully-async": per_engine_rows(_trace(), (0.0, 2.0))})
    assert "15.0 / 30.0 / 10.0" in text
    assert "20.0 / 20.0 / -" in text


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.floats(0, 50, allow_nan=False), st.floats(0, 5, allow_nan=False)), max_size=30),
    st.floats(-1, 60, allow_nan=False),
    st.floats(0, 10, allow_nan=False),
)
def test_training_overlap_by_bisection_is_the_full_sum(raw, t0, width):
    """A decode step's time under training, found from the intervals that reach into the
    step alone, is the sum over every interval (``overlap.total``), to the bit."""
    from harness.measure.overlap import merge, total, total_sorted

    iv = merge([(a, a + w) for a, w in raw])
    assert total_sorted(iv, [b for _, b in iv], (t0, t0 + width)) == total(iv, (t0, t0 + width))
