"""The ``ray`` layout (``harness.backends.ray_engine``): N engine actors behind one
``RolloutEngine``, on the session's one local Ray cluster (``ray_cluster`` in the root
conftest), tiny model, few steps.

* the three modes run on two engines and every checker passes on their traces (the
  multi-engine ones included); every engine event names its engine, each engine loads
  every update, the router spreads the requests;
* the router's policy and the clock alignment, without Ray;
* a dead engine (``ray.kill`` mid-run): Miles' default fails the run at the next pause
  with a clear error, keeping every finished step; ``continue`` finishes on the live
  engine; either way the trace names the requests lost with the engine and where their
  groups went.

The seeded multi-engine bugs are in the mutant zoo (``fixtures/mutants/ray_engine.py``).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

from miles_async_core import events as ev
from miles_async_core.errors import EngineDeadError

try:
    from fixtures.mutants.ray_engine import RAY_BASE, RAY_RUNS, run_ray
except ModuleNotFoundError:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.mutants.ray_engine import RAY_BASE, RAY_RUNS, run_ray

from harness.backends.ray_engine import LeastOutstandingRouter, RayEngineGroup, align_clock, engine_pool
from harness.measure.engines import per_engine_rows
from harness.measure.overlap import intervals, total

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_router_picks_the_live_engine_with_fewest_outstanding_requests_ties_to_lowest() -> None:
    r = LeastOutstandingRouter(3)
    assert [r.pick([0, 1, 2]) for _ in range(4)] == [0, 1, 2, 0]
    r.done(1)
    r.done(1 - 1)
    assert r.outstanding == [1, 0, 1]
    assert r.pick([0, 1, 2]) == 1
    assert r.pick([0, 2]) == 0  # engine 1 dead: skipped, ties to the lowest index
    with pytest.raises(EngineDeadError):
        r.pick([])
    with pytest.raises(AssertionError):
        LeastOutstandingRouter(1).done(0)


def test_clock_alignment_is_exact_on_a_shared_clock_and_a_midpoint_otherwise() -> None:
    assert align_clock(10.0, 10.5, 11.0) == (0.0, True)
    offset, shared = align_clock(10.0, 3.0, 11.0)  # another node: its clock started elsewhere
    assert not shared and offset == pytest.approx(7.5)


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["sync", "one-step", "fully-async"])
def test_two_engines_run_every_mode_and_every_checker_passes(ray_cluster, mode: str) -> None:
    result, violations = run_ray(mode)
    assert result.error is None, result.error
    assert len(result.history) == 3
    assert not violations, "\n\n".join(v.format() for v in violations[:3])
    assert result.checks["passed"]
    for name in ("engine_versions_monotonic", "all_engines_updated_before_resume", "all_engines_paused_for_update"):
        assert name in result.checks["checkers"]
    engine_kinds = (
        ev.ADMITTED,
        ev.DECODE_STEP,
        ev.ENGINE_PAUSE,
        ev.ENGINE_RESUME,
        ev.ENGINE_LOADED,
        ev.SUBMITTED,
        ev.FINISHED,
    )
    assert all(e.get("engine") in (0, 1) for e in result.events if e.kind in engine_kinds)
    updates = [e["version"] for e in result.events if e.kind == ev.ENGINE_VERSION]
    for k in (0, 1):
        assert [e["version"] for e in result.events if e.kind == ev.ENGINE_LOADED and e["engine"] == k] == updates
        assert any(e.kind == ev.DECODE_STEP and e["engine"] == k for e in result.events)
    stats = result.engine_stats
    assert stats["num_engines"] == 2 and min(stats["routed"]) > 0 and stats["dead"] == {}
    assert len(stats["sync_s"]) == len(updates) and all(s["engines"] == 2 for s in stats["sync_s"])
    assert all(c["shared"] and c["offset_s"] == 0.0 for c in stats["clock"])  # one machine: one monotonic clock
    assert {"ray_init_s", "actors_start_s", "reset_s"} <= set(stats["startup"])
    times = [e.t for e in result.events]
    assert result.window[0] <= result.window[1] and min(times) >= 0 < max(times)
    # each engine's own generating time holds its decode steps, and the run's (the union over the
    # engines) is at least the longest engine's and at most their sum
    rows = per_engine_rows(result.events, result.window)
    assert [r["engine"] for r in rows] == [0, 1]
    for r in rows:
        assert r["generating_busy_s"] >= r["decode_busy_s"] - 1e-3, r
        assert r["step_ms_sd"] is not None and r["step_ms_sd"] >= 0
    union = total(intervals(result.events, "rollout", "generating", result.window[1]), result.window)
    assert max(r["generating_busy_s"] for r in rows) - 1e-9 <= union <= sum(r["generating_busy_s"] for r in rows) + 1e-9


class _KillsEngineOne(RayEngineGroup):
    """Kills engine 1's actor (``ray.kill``) right after routing it its ``KILL_AT``-th request,
    so that request and any other still on engine 1 are in flight when it dies."""

    KILL_AT = 6

    def generate(self, sample, sampling):
        fut = super().generate(sample, sampling)
        if self.router.routed[1] == self.KILL_AT and 1 not in self.dead and not getattr(self, "_killed", False):
            import ray

            self._killed = True
            ray.kill(self.actors[1], no_restart=True)
        return fut


def _dead_engine_run(monkeypatch: pytest.MonkeyPatch, on_engine_death: str, steps: int = 4):
    import harness.backends.ray_engine as ray_engine

    monkeypatch.setattr(
        ray_engine, "RayEngineGroup", functools.partial(_KillsEngineOne, on_engine_death=on_engine_death)
    )
    return run_ray("one-step", steps=steps, base=RAY_BASE)


def _lost_and_where_they_went(result) -> tuple[dict, set[int]]:
    faults = [e for e in result.events if e.kind == ev.FAULT and e["what"] == "engine_died"]
    assert len(faults) == 1 and faults[0]["engine"] == 1 and faults[0]["live_engines"] == [0]
    fault = faults[0]
    assert fault["lost"], "engine 1 had requests in flight when it died"
    after = result.events[fault.seq :]
    dropped = {e["group_index"] for e in after if e.kind == ev.DROPPED and e["reason"] == "generate_error"}
    pending = {g for e in after if e.kind == ev.RUN_END for g in e["pending_groups"]}
    for gi in fault["lost_groups"]:
        assert gi in dropped | pending, f"lost group {gi} is neither dropped nor pending at run end"
    assert not any(e.get("engine") == 1 for e in after[1:]), "nothing is recorded from engine 1 after it died"
    return fault, dropped


@pytest.mark.ray
def test_a_dead_engine_fails_the_run_at_the_next_pause_and_keeps_finished_steps(ray_cluster, monkeypatch) -> None:
    result, violations = _dead_engine_run(monkeypatch, "fail")
    assert result.error is not None and result.error.startswith("EngineDeadError")
    assert "rollout engine 1 of 2 died" in result.error and "update_weight_from_distributed/mixin.py" in result.error
    assert result.checks["complete"] is False and not violations, [v.format() for v in violations[:3]]
    fault, dropped = _lost_and_where_they_went(result)
    assert dropped, "the one-step rollout drops a group whose request was lost (upstream skips a failed group)"
    trained = [e["rollout_id"] for e in result.events if e.kind == ev.TRAINED]
    assert [h["rollout_id"] for h in result.history] == trained and trained  # every finished step is kept
    assert result.engine_stats["dead"].keys() == {1} and result.engine_stats["per_engine"][1]["lost"] == len(
        fault["lost"]
    )
    assert len(engine_pool().acquire(2)[0]) == 2  # the pool replaces the dead actor for later runs


@pytest.mark.ray
def test_a_dead_engine_with_continue_finishes_on_the_live_engine(ray_cluster, monkeypatch) -> None:
    result, violations = _dead_engine_run(monkeypatch, "continue")
    assert result.error is None, result.error
    assert len(result.history) == 4 and result.checks["complete"]
    assert not violations, "\n\n".join(v.format() for v in violations[:3])
    _lost_and_where_they_went(result)
    loads_after = [
        e
        for e in result.events
        if e.kind == ev.ENGINE_LOADED and e.seq > next(f.seq for f in result.events if f.kind == ev.FAULT)
    ]
    assert loads_after and {e["engine"] for e in loads_after} == {0}


def test_ray_runs_are_the_zoo_runs() -> None:
    assert RAY_RUNS and set(RAY_RUNS) <= {"sync", "one-step", "fully-async"}
