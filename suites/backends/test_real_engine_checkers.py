"""The invariant checkers on real-engine traces: small real runs of the main job (tiny
model, 4 steps) on the colocated layout (``TorchEngine`` on a thread) and the split
layout (``ProcessEngine``, the engine in a child process) pass every applicable checker,
with the engines' own events: SUBMITTED, ADMITTED, DECODE_STEP, pause and resume, each
stamped where it happened, in the loop's time base. A seeded real engine that keeps
decoding while paused fails them, and the colocated both-busy fraction, measured from
the engine's decode steps, shows it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.checking.invariants import ALL_CHECKS, applicable, format_violations
from harness.checking.invariants.base import Violation
from harness.checking.invariants.colocate import check_colocate_no_decode_while_training
from harness.checking.invariants.pause import check_no_generation_while_paused
from harness.trace import Event
from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig

try:
    from fixtures.mutants.real_engine import DecodesWhilePausedCore, patched, run_real
except ModuleNotFoundError:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.mutants.real_engine import DecodesWhilePausedCore, patched, run_real

RUNS = [("sync", "colocate"), ("fully-async", "colocate"), ("one-step", "split"), ("fully-async", "split")]


def _by_index(events: list[Event], kind: str) -> dict[int, list[Event]]:
    out: dict[int, list[Event]] = {}
    for e in events:
        if e.kind == kind:
            out.setdefault(e["index"], []).append(e)
    return out


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,layout", RUNS, ids=[f"{layout}-{mode}" for mode, layout in RUNS])
def test_a_real_run_passes_every_applicable_checker(mode: str, layout: str) -> None:
    result, violations = run_real(mode, layout)
    assert result.error is None and len(result.history) == 4
    assert violations == [], format_violations(violations)
    names = {c.name for c in applicable(result.config)}
    assert {"token_versions", "no_generation_while_paused", "conservation", "kv_versions"} <= names
    assert ("colocate_no_decode_while_training" in names) == (layout == "colocate")
    events = result.events
    kinds = {e.kind for e in events}
    assert {ev.SUBMITTED, ev.ADMITTED, ev.DECODE_STEP, ev.ENGINE_PAUSE, ev.ENGINE_RESUME, ev.RUN_END} <= kinds

    # Causality across threads and processes, on one clock: every sample is submitted
    # (caller) before it is admitted (engine), decoded after that, and finished (caller)
    # after its last decode step.
    submitted, admitted, finished = (_by_index(events, k) for k in (ev.SUBMITTED, ev.ADMITTED, ev.FINISHED))
    decoded: dict[int, list[float]] = {}
    for e in events:
        if e.kind == ev.DECODE_STEP:
            assert e["dur_s"] >= 0.0
            for i in e["indices"]:
                decoded.setdefault(i, []).append(e.t)
    assert finished and set(finished) <= set(submitted) and set(finished) <= set(admitted)
    if mode != "fully-async":  # fully-async ends with requests still in flight (run_end lists their groups)
        assert set(finished) == set(submitted)
    for i, fins in finished.items():
        assert submitted[i][0].t <= admitted[i][0].t <= min(decoded[i]), i
        assert max(decoded[i]) <= fins[-1].t, i
        assert len(decoded[i]) == fins[-1]["response_length"], i  # one decode step per token
    assert set(decoded) <= set(submitted)
    if mode != "fully-async":
        assert set(decoded) == set(finished)

    overlap = result.overlap
    assert overlap["decode_busy_s"] > 0.0
    if layout == "colocate":  # the engine's own decode steps never meet training
        assert overlap["both_busy_s"] == 0.0
    if mode == "one-step":  # split one-step: the engine decodes while the trainer trains
        assert overlap["both_busy_s"] > 0.0


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_split_runs_child_clock_is_checked_and_aligned() -> None:
    """The child's events carry child-side stamps: its first message proved the clock is
    the parent's, and its engine_pause / engine_resume lie inside the parent's calls."""
    import harness.backends.process_engine as process_engine

    engines = []
    real = process_engine.ProcessEngine

    def recording(*args, **kwargs):
        engines.append(real(*args, **kwargs))
        return engines[-1]

    process_engine.ProcessEngine = recording
    try:
        result, violations = run_real("one-step", "split")
    finally:
        process_engine.ProcessEngine = real
    assert violations == [] and engines
    assert engines[0].clock_shared is True and engines[0].child_offset_s == 0.0
    events = result.events
    syncs = [
        (e.t, events[i + 1 :])
        for i, e in enumerate(events)
        if e.kind == ev.PHASE_START and e["side"] == "train" and e["phase"] == "weight_sync"
    ]
    assert len(syncs) == 4 + 1  # the initial load and one per step
    for t0, rest in syncs:
        end = next(e for e in rest if e.kind == ev.PHASE_END and e["phase"] == "weight_sync")
        pause = next(e for e in rest if e.kind == ev.ENGINE_PAUSE)
        resume = next(e for e in rest if e.kind == ev.ENGINE_RESUME)
        version = next(e for e in rest if e.kind == ev.ENGINE_VERSION)
        assert t0 <= pause.t <= version.t <= resume.t <= end.t


@pytest.mark.model
@pytest.mark.timeout(120)
def test_an_engine_that_decodes_while_paused_fails_on_a_colocated_run_and_shows_in_both_busy() -> None:
    with patched(DecodesWhilePausedCore):
        result, violations = run_real("fully-async", "colocate")
    assert result.error is None
    fired = {v.invariant for v in violations}
    assert {"colocate_no_decode_while_training", "no_generation_while_paused"} <= fired
    assert result.overlap["both_busy_s"] > 0.0


# --- the decode-step checkers on hand-built traces -------------------------------------------

COLOCATED = AsyncConfig(rollout_batch_size=1, n_samples_per_prompt=1, fully_async=True, colocate=True)


def _trace(rows: list[tuple[float, str, dict]]) -> list[Event]:
    return [Event(i, t, kind, fields) for i, (t, kind, fields) in enumerate(rows)]


def _training(t0: float, t1: float) -> list[tuple[float, str, dict]]:
    return [
        (t0, ev.PHASE_START, {"side": "train", "phase": "training"}),
        (t1, ev.PHASE_END, {"side": "train", "phase": "training"}),
    ]


def _decode(t: float, dur: float) -> tuple[float, str, dict]:
    return (t, ev.DECODE_STEP, {"indices": [0], "version": 1, "dur_s": dur})


@pytest.mark.parametrize(
    "step,caught",
    [
        ((1.0, 0.5), False),  # ends before training starts at 2.0
        ((2.0, 1.0), False),  # ends exactly as training starts
        ((2.1, 0.2), True),  # ends inside training
        ((5.0, 4.0), True),  # spans the whole training interval
        ((4.5, 0.5), False),  # starts exactly as training ends at 4.0
    ],
)
def test_no_decode_while_training_compares_times_not_trace_order(step: tuple[float, float], caught: bool) -> None:
    # the decode step is recorded after training in trace order: only its times decide
    events = _trace(_training(2.0, 4.0) + [_decode(*step)])
    found = check_colocate_no_decode_while_training(events, COLOCATED)
    assert [v.invariant for v in found] == (["colocate_no_decode_while_training"] if caught else [])
    assert ALL_CHECKS["colocate_no_decode_while_training"].applies(COLOCATED)
    assert not ALL_CHECKS["colocate_no_decode_while_training"].applies(AsyncConfig())


def test_a_decode_step_between_pause_and_resume_is_generation_while_paused() -> None:
    rows = [
        (0.0, ev.ENGINE_PAUSE, {"mode": "retract", "in_flight": 1}),
        _decode(0.5, 0.1),
        (1.0, ev.ENGINE_RESUME, {}),
        _decode(1.5, 0.1),
    ]
    found: list[Violation] = check_no_generation_while_paused(_trace(rows), AsyncConfig())
    assert [(v.invariant, v.events[-1].t) for v in found] == [("no_generation_while_paused", 0.5)]
