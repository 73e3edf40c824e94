"""``harness.sim.bytecodes``: the deterministic profile counts what a run executes per
sample, in the steady state (the long run minus the short one)."""

from __future__ import annotations

import sys

import pytest

from harness.sim.bytecodes import bytecode_profile


def _work(x: int) -> int:
    return x + 1


def _run(steps: int) -> None:
    total = 0
    for i in range(100):  # set-up that does not grow with the steps: cancels out
        total += i
    for _ in range(steps * 4):  # 4 samples per step, one call of _work each
        total = _work(total)


def test_the_profile_is_the_long_run_minus_the_short_one_per_sample():
    p = bytecode_profile(_run, 3, 8, samples_per_step=4)
    work = next(f for f in p["functions"] if f["function"].endswith(f":_work:{_work.__code__.co_firstlineno}"))
    assert work["calls_per_sample"] == 1.0
    assert work["bytecodes_per_sample"] > 0
    # the same run counted again gives the same figures: nothing in it depends on timing
    assert bytecode_profile(_run, 3, 8, samples_per_step=4) == p
    assert p["bytecodes_per_sample"] == pytest.approx(sum(f["bytecodes_per_sample"] for f in p["functions"]), abs=0.01)


def test_a_tracer_already_set_is_put_back():
    def outer(frame, event, arg):
        return None

    sys.settrace(outer)
    try:
        bytecode_profile(_run, 1, 2, samples_per_step=4)
        assert sys.gettrace() is outer
    finally:
        sys.settrace(None)


def test_short_must_be_below_long():
    with pytest.raises(ValueError, match="need 0 < short < long"):
        bytecode_profile(_run, 5, 5, samples_per_step=4)
