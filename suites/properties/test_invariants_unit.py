"""Each trace invariant checker passes on real simulated traces and fails on a targeted
edit of one (trace surgery), reporting the invariant by name with a readable timeline.

Also regression tests for two bugs the property suites found in ``harness/sim/engine.py``:
an abort must not credit tokens to waiting requests, and a cancellation of the last
running request must still admit the waiting queue.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.sim.faults import FaultSchedule, run_with_faults
from harness.checking.invariants import ALL_CHECKS, Violation, check_all
from harness.sim.scenario import Scenario
from harness.sim.engine import LengthDist, SimEngine, SimEngineConfig
from harness.sim.trainer import SimTrainerConfig
from harness.lives import Stop, StopPoint, run_lives
from harness.lives.core import CoreHost
from harness.sim.run_scenario import simulate
from harness.trace import Event, read_jsonl

ENGINE = SimEngineConfig(response_length=LengthDist(kind="uniform", low=1, high=40))

FULLY_ASYNC = Scenario(
    config=AsyncConfig(
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        fully_async=True,
        num_rollout=5,
        max_weight_staleness=0,
        async_unused_samples_handler="retry",
        async_data_buffer_capacity_factor=1.0,
    ),
    engine=ENGINE,
    trainer=SimTrainerConfig(step_base_s=2.0),
    max_new_tokens=32,
)
ONE_STEP_ABORT = Scenario(
    config=AsyncConfig(
        rollout_batch_size=3,
        n_samples_per_prompt=2,
        num_rollout=4,
        pause_generation_mode="abort",
        over_sampling_batch_size=5,
    ),
    engine=dataclasses.replace(ENGINE, max_running=4),
    trainer=SimTrainerConfig(step_base_s=0.5),
    max_new_tokens=32,
)
IN_PLACE = Scenario(
    config=AsyncConfig(
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        fully_async=True,
        num_rollout=5,
        pause_generation_mode="in_place",
        async_max_concurrent_samples=4,
    ),
    engine=ENGINE,
    trainer=SimTrainerConfig(step_base_s=0.3),
    max_new_tokens=32,
)
GROUP_FULLY_ASYNC = Scenario(
    config=dataclasses.replace(FULLY_ASYNC.config, rollout_submission_granularity="group"),
    engine=ENGINE,
    trainer=SimTrainerConfig(step_base_s=2.0),
    max_new_tokens=32,
)
COLOCATED = Scenario(
    config=AsyncConfig(
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        fully_async=True,
        num_rollout=4,
        colocate=True,
        allow_async_colocate=True,
    ),
    engine=ENGINE,
    trainer=SimTrainerConfig(step_base_s=0.3),
    max_new_tokens=32,
)

# A recorded two-engine trace of the ray layout (fully-async, B=4, n=2, 3 steps, retract):
# every engine event carries ``engine``; each engine records ``engine_loaded``.
RAY_TWO_ENGINES = Scenario(
    name="ray_two_engines_fully_async",
    config=AsyncConfig(rollout_batch_size=4, n_samples_per_prompt=2, fully_async=True, num_rollout=3),
    max_new_tokens=2,
)
RECORDED = {
    RAY_TWO_ENGINES.name: Path(__file__).resolve().parents[2]
    / "fixtures"
    / "golden"
    / "ray_two_engines_fully_async.jsonl"
}

_traces: dict[str, list[Event]] = {}


# a run that crashes right after its checkpoint of rollout 3 and resumes, exactly once
LIVES = Scenario(
    name="lives: one-step, exactly-once resume after a crash at a save",
    config=AsyncConfig(
        rollout_batch_size=4, n_samples_per_prompt=2, num_rollout=8, save_interval=2, exactly_once_resume=True
    ),
    trainer=SimTrainerConfig(step_base_s=3.0),
    max_new_tokens=64,
)


def trace(scenario: Scenario) -> list[Event]:
    """A fresh deep copy of the scenario's (cached) trace, safe to edit (a recorded one is read)."""
    if scenario.name in RECORDED:
        return read_jsonl(RECORDED[scenario.name])
    if scenario.name + repr(scenario.config) not in _traces:
        result = (
            run_lives(scenario, [StopPoint(Stop.AFTER_SAVE, 3)], CoreHost())
            if scenario is LIVES
            else simulate(scenario)
        )
        assert result.error is None, result.error
        _traces[scenario.name + repr(scenario.config)] = result.events
    return copy.deepcopy(_traces[scenario.name + repr(scenario.config)])


def first(events: list[Event], kind: str, pred=lambda e: True, start: int = 0) -> int:
    return next(i for i, e in enumerate(events) if i >= start and e.kind == kind and pred(e))


def names(violations: list[Violation]) -> set[str]:
    return {v.invariant for v in violations}


@pytest.mark.parametrize(
    "scenario",
    [FULLY_ASYNC, GROUP_FULLY_ASYNC, ONE_STEP_ABORT, IN_PLACE, COLOCATED, RAY_TWO_ENGINES],
    ids=["fully_async", "group_fully_async", "one_step_abort", "in_place", "colocated", "ray_two_engines"],
)
def test_real_traces_satisfy_every_applicable_invariant(scenario: Scenario) -> None:
    violations = check_all(trace(scenario), scenario.config)
    assert not violations, "\n\n".join(v.format() for v in violations)


# --- trace surgery: one edit per invariant --------------------------------------------------------


def drop_trained_group(events: list[Event]) -> None:
    i = first(events, ev.TRAINED)
    events[i].fields["group_indices"] = events[i]["group_indices"][1:]


def duplicate_trained_group(events: list[Event]) -> None:
    i = first(events, ev.TRAINED)
    events[i].fields["group_indices"] = events[i]["group_indices"][:1] * 2 + events[i]["group_indices"][2:]


def reverse_trained_batch(events: list[Event]) -> None:
    i = first(events, ev.TRAINED)
    events[i].fields["group_indices"] = events[i]["group_indices"][::-1]


def overfill_queue(events: list[Event]) -> None:
    i = first(events, ev.PUT_ACCEPTED)
    events.insert(i, Event(-1, events[i].t, ev.PUT_ACCEPTED, {"group_index": 999, "queue_size": 1}))


def swap_two_gets(events: list[Event]) -> None:
    i = first(events, ev.GOT)
    j = first(events, ev.GOT, start=i + 1)
    a, b = events[i].fields, events[j].fields
    a["group_index"], b["group_index"] = b["group_index"], a["group_index"]


def store_aborted_sample(events: list[Event]) -> None:
    i = first(events, ev.PUT_ACCEPTED)
    gi = events[i]["group_index"]
    j = first(events, ev.FINISHED, lambda e: e["group_index"] == gi)
    events[j].fields["status"] = "aborted"


def hand_filter_reject_to_handler(events: list[Event]) -> None:
    i = first(events, ev.PUT_ACCEPTED)
    gi = events[i]["group_index"]
    events[i] = Event(-1, events[i].t, ev.PUT_REJECTED, {"group_index": gi, "reason": "dynamic_filter:fault"})
    events.insert(i + 1, Event(-1, events[i].t, ev.HANDLER, {"group_index": gi, "handler": "retry", "cause": "x"}))


def skip_stale_handler(events: list[Event]) -> None:
    i = first(events, ev.STALE_REJECTED)
    j = first(events, ev.HANDLER, lambda e: e["group_index"] == events[i]["group_index"], start=i)
    del events[j]


def newer_version_mid_drain(events: list[Event]) -> None:
    i = first(events, ev.GOT)
    events[i].fields["current_version"] += 1


def misreport_staleness(events: list[Event]) -> None:
    i = first(events, ev.GOT)
    events[i].fields["staleness"] = -1


def train_with_newer_trainer(events: list[Event]) -> None:
    i = first(events, ev.TRAINED)
    events[i].fields["trainer_version"] += 5


def mix_versions_in_batch(events: list[Event]) -> None:
    i = first(events, ev.FINISHED, lambda e: e["status"] != "aborted" and e["response_length"] > 1)
    runs = events[i]["token_versions"]
    v, kv, count = runs[0]
    events[i].fields["token_versions"] = [[v, kv, 1], [v + 1, v + 1, count - 1]]


def skip_a_version(events: list[Event]) -> None:
    i = first(events, ev.ENGINE_VERSION, start=first(events, ev.ENGINE_VERSION) + 1)
    events[i].fields["version"] += 1


def stamp_wrong_weight_version(events: list[Event]) -> None:
    i = first(events, ev.FINISHED)
    events[i].fields["weight_versions"] = [str(int(events[i]["weight_versions"][0]) + 1)]


def update_during_generate(events: list[Event]) -> None:
    i = first(events, ev.ENGINE_VERSION, start=first(events, ev.GENERATE_START))
    j = first(events, ev.GENERATE_START, start=first(events, ev.GENERATE_START) + 1)
    events.insert(j + 1, events.pop(i))


def admit_while_paused(events: list[Event]) -> None:
    i = first(events, ev.ENGINE_PAUSE, start=first(events, ev.ADMITTED))
    j = first(events, ev.ADMITTED)
    events.insert(i + 1, copy.deepcopy(events[j]))


def complete_at_abort(events: list[Event]) -> None:
    i = first(events, ev.FINISHED, lambda e: e["status"] == "aborted")
    events[i].fields["status"] = "completed"


def keep_old_kv(events: list[Event]) -> None:
    i = first(events, ev.FINISHED, lambda e: e["token_versions"] and e["token_versions"][-1][0] > 1)
    v, _, count = events[i]["token_versions"][-1]
    events[i].fields["token_versions"] = events[i]["token_versions"][:-1] + [[v, v - 1, count]]


def submit_out_of_group(events: list[Event]) -> None:
    i = first(events, ev.SUBMITTED, lambda e: True)
    j = first(events, ev.SUBMITTED, lambda e: e["group_index"] != events[i]["group_index"])
    events[i + 1], events[j] = events[j], events[i + 1]


def overlap_colocated(events: list[Event]) -> None:
    i = first(events, ev.PHASE_START, lambda e: e["side"] == "train" and e["phase"] == "training")
    events.insert(i + 1, Event(-1, events[i].t, ev.PHASE_START, {"side": "rollout", "phase": "generating"}))


def decode_during_training(events: list[Event]) -> None:
    """A real engine's decode step (the simulated one records none) inside a training interval."""
    i = first(events, ev.PHASE_START, lambda e: e["side"] == "train" and e["phase"] == "training")
    j = first(events, ev.PHASE_END, lambda e: e["side"] == "train" and e["phase"] == "training", start=i)
    t0, t1 = events[i].t, events[j].t
    events.insert(j, Event(-1, (t0 + t1) / 2, ev.DECODE_STEP, {"indices": [0], "version": 1, "dur_s": (t1 - t0) / 4}))


def misreport_metric(events: list[Event]) -> None:
    i = first(events, ev.METRICS, start=first(events, ev.STALE_REJECTED))
    events[i].fields["metrics"] = {**events[i]["metrics"], "rollout/fully_async/stale_groups_filtered": 0.0}


def two_groups_from_one_pull(events: list[Event]) -> None:
    i = first(events, ev.TAKEN)
    j = first(events, ev.TAKEN, start=i + 1)
    events[j].fields["call"] = events[i]["call"]


def swap_two_recycled_takes(events: list[Event]) -> None:
    """Two recycled groups handed out in the other order."""
    i = first(events, ev.TAKEN, lambda e: e["recycled"])
    j = first(events, ev.TAKEN, lambda e: e["recycled"] and e["group_index"] != events[i]["group_index"], start=i + 1)
    a, b = events[i].fields, events[j].fields
    for key in ("group_index", "indices"):
        a[key], b[key] = b[key], a[key]


def pull_past_the_budget(events: list[Event]) -> None:
    """A second get_samples call right after the first pull, with B groups already pending."""
    call = events[first(events, ev.TAKEN)]["call"]
    i = max(j for j, e in enumerate(events) if e.kind == ev.TAKEN and e["call"] == call)
    extra = {"group_index": 999, "indices": [9990, 9991], "recycled": False, "call": 999}
    events.insert(i + 1, Event(-1, events[i].t, ev.TAKEN, extra))


def _engine_event(events: list[Event], kind: str, engine: int, nth: int = 1) -> int:
    """Position of the ``nth`` ``kind`` event of ``engine`` (1-based)."""
    return [i for i, e in enumerate(events) if e.kind == kind and e.get("engine") == engine][nth - 1]


def decode_with_an_older_version(events: list[Event]) -> None:
    """Engine 1's last decode step used the version before the one it loaded last."""
    i = [i for i, e in enumerate(events) if e.kind == ev.DECODE_STEP and e.get("engine") == 1][-1]
    events[i].fields["version"] -= 1


def engine_skips_an_update(events: list[Event]) -> None:
    """Engine 1 never loads the second update (version 2)."""
    del events[_engine_event(events, ev.ENGINE_LOADED, 1, nth=2)]


def engine_not_paused_for_an_update(events: list[Event]) -> None:
    """Engine 1 is not paused for the second update (its pause and resume are gone)."""
    del events[_engine_event(events, ev.ENGINE_RESUME, 1, nth=2)]
    del events[_engine_event(events, ev.ENGINE_PAUSE, 1, nth=2)]


def launch_next_after_training(events: list[Event]) -> None:
    """The generate of rollout 1 starts only after rollout 0 trained (no one-step overlap)."""
    launch = events.pop(first(events, ev.GENERATE_START, lambda e: e["rollout_id"] == 1))
    i = first(events, ev.TRAINED, lambda e: e["rollout_id"] == 0)
    events.insert(i + 1, Event(-1, events[i].t, ev.GENERATE_START, dict(launch.fields)))


def leave_a_slot_idle(events: list[Event]) -> None:
    """The worker skips one refill: the pull after a put that ended a scheduling step
    (the next put is of a group that finished after it) is dropped."""
    puts = [i for i, e in enumerate(events) if e.kind in (ev.PUT_ACCEPTED, ev.PUT_REJECTED)]
    for p1, p2 in zip(puts, puts[1:]):
        gi = events[p2]["group_index"]
        if first(events, ev.GROUP_DONE, lambda e, gi=gi: e["group_index"] == gi) > p1 and any(
            e.kind == ev.TAKEN for e in events[p1:p2]
        ):
            del events[first(events, ev.TAKEN, start=p1)]
            return
    raise AssertionError("no scheduling step ends in this trace")


def worker_dies_unnoticed(events: list[Event]) -> None:
    """The worker dies (a failed group) while the second drain runs, and the drain goes on
    getting groups at later instants."""
    d = first(events, ev.DRAIN_START, lambda e: e["rollout_id"] == 1)
    events.insert(d + 1, Event(-1, events[d].t, ev.GROUP_DONE, {"group_index": 999, "ok": False}))
    events[:] = [e for i, e in enumerate(events) if i <= d + 1 or e.kind not in (ev.PUT_ACCEPTED, ev.PUT_REJECTED)]


def retake_a_trained_source(events: list[Event]) -> None:
    """Life 1 hands out a source group life 0 trained (kept in the checkpoint) instead of its own."""
    trained0 = next(e for e in events if e.kind == ev.TAKEN and e["life"] == 0)
    retake = next(e for e in events if e.kind == ev.TAKEN and e["life"] == 1)
    retake.fields["source_index"] = trained0["source_index"]


def start_at_the_saved_rollout(events: list[Event]) -> None:
    start = next(e for e in events if e.kind == ev.LIFE_START and e["life"] == 1)
    start.fields["start_rollout_id"] -= 1


def serve_version_one_after_resume(events: list[Event]) -> None:
    first = next(e for e in events if e.kind == ev.ENGINE_VERSION and e["life"] == 1)
    first.fields["version"] = 1


SURGERY = [
    ("resume_exactly_once", LIVES, retake_a_trained_source),
    ("resume_rollout_once", LIVES, start_at_the_saved_rollout),
    ("resume_versions", LIVES, serve_version_one_after_resume),
    ("conservation", FULLY_ASYNC, drop_trained_group),
    ("conservation_prefix", FULLY_ASYNC, duplicate_trained_group),
    ("trained_batch_shape", FULLY_ASYNC, reverse_trained_batch),
    ("buffer_capacity", FULLY_ASYNC, overfill_queue),
    ("buffer_fifo", FULLY_ASYNC, swap_two_gets),
    ("aborted_never_stored", FULLY_ASYNC, store_aborted_sample),
    ("filter_rejects_not_handled", FULLY_ASYNC, hand_filter_reject_to_handler),
    ("stale_rejects_handled", FULLY_ASYNC, skip_stale_handler),
    ("drain_shape", FULLY_ASYNC, newer_version_mid_drain),
    ("got_staleness", FULLY_ASYNC, misreport_staleness),
    ("trained_age_bound", FULLY_ASYNC, train_with_newer_trainer),
    ("batch_single_version", ONE_STEP_ABORT, mix_versions_in_batch),
    ("version_steps", FULLY_ASYNC, skip_a_version),
    ("token_versions", FULLY_ASYNC, stamp_wrong_weight_version),
    ("update_outside_generate", ONE_STEP_ABORT, update_during_generate),
    ("no_generation_while_paused", FULLY_ASYNC, admit_while_paused),
    ("abort_semantics", ONE_STEP_ABORT, complete_at_abort),
    ("kv_versions", FULLY_ASYNC, keep_old_kv),
    ("in_flight_cap", IN_PLACE, None),  # a tighter G below
    ("whole_group_submission", FULLY_ASYNC, submit_out_of_group),
    ("one_group_per_pull", FULLY_ASYNC, two_groups_from_one_pull),
    ("recycled_first_in_first_out", FULLY_ASYNC, swap_two_recycled_takes),
    ("one_step_submission_budget", ONE_STEP_ABORT, pull_past_the_budget),
    ("colocate_exclusive", COLOCATED, overlap_colocated),
    ("one_step_overlap", ONE_STEP_ABORT, launch_next_after_training),
    ("no_idle_slot", GROUP_FULLY_ASYNC, leave_a_slot_idle),
    ("dead_worker_surfaces", FULLY_ASYNC, worker_dies_unnoticed),
    ("colocate_no_decode_while_training", COLOCATED, decode_during_training),
    ("drain_metrics", FULLY_ASYNC, misreport_metric),
    ("engine_versions_monotonic", RAY_TWO_ENGINES, decode_with_an_older_version),
    ("all_engines_updated_before_resume", RAY_TWO_ENGINES, engine_skips_an_update),
    ("all_engines_paused_for_update", RAY_TWO_ENGINES, engine_not_paused_for_an_update),
]


@pytest.mark.parametrize("name,scenario,edit", SURGERY, ids=[s[0] for s in SURGERY])
def test_each_checker_reports_its_invariant_on_an_edited_trace(name, scenario, edit) -> None:
    events = trace(scenario)
    config = scenario.config
    assert not ALL_CHECKS[name].fn(events, config), "the unedited trace must pass"
    if edit is None:  # in_flight_cap: the same trace judged against half the budget
        config = dataclasses.replace(config, async_max_concurrent_samples=2)
    else:
        edit(events)
    found = ALL_CHECKS[name].fn(events, config)
    assert found and names(found) == {name}, [v.format() for v in found]
    assert name in names(check_all(events, config))


def test_every_registered_invariant_has_a_surgery_test() -> None:
    assert {s[0] for s in SURGERY} == set(ALL_CHECKS)


def test_violation_format_renders_a_readable_timeline() -> None:
    e = Event(7, 12.34, ev.PUT_REJECTED, {"group_index": 7, "reason": "aborted"})
    text = Violation(invariant="aborted_never_stored", message="group 7 stored", events=[e]).format()
    assert text.splitlines()[0] == "[aborted_never_stored] group 7 stored"
    assert "t=   12.340s" in text and "put_rejected" in text and "group_index=7 reason=aborted" in text


def test_violations_carry_the_slice_of_trace_around_the_failure() -> None:
    events = trace(FULLY_ASYNC)
    swap_two_gets(events)
    v = ALL_CHECKS["buffer_fifo"].fn(events, FULLY_ASYNC.config)[0]
    assert v.events[-1].kind == ev.GOT and 2 <= len(v.events) <= 11


def test_prefix_mode_drops_only_the_checkers_that_need_a_complete_run() -> None:
    events = trace(FULLY_ASYNC)
    drop_trained_group(events)
    assert "conservation" in names(check_all(events, FULLY_ASYNC.config))
    assert "conservation" not in names(check_all(events, FULLY_ASYNC.config, complete=False))
    duplicate_trained_group(events)
    assert "conservation_prefix" in names(check_all(events, FULLY_ASYNC.config, complete=False))


def test_a_trace_without_run_end_cannot_close_conservation() -> None:
    events = [e for e in trace(FULLY_ASYNC) if e.kind != ev.RUN_END]
    assert names(ALL_CHECKS["conservation"].fn(events, FULLY_ASYNC.config)) == {"conservation"}


# --- bugs of the simulated engine found by these suites ----------------------------------------------


def test_sim_engine_abort_gives_waiting_requests_no_tokens() -> None:
    sc = dataclasses.replace(ONE_STEP_ABORT, engine=dataclasses.replace(ONE_STEP_ABORT.engine, max_running=1))
    result = simulate(sc)
    bad = [e for e in result.events if e.kind == ev.FINISHED and e["response_length"] > sc.max_new_tokens]
    violations = check_all(result.events, sc.config)
    assert not bad and not violations, "\n".join(v.format() for v in violations[:2])


def test_sim_engine_admits_waiting_requests_after_a_cancellation() -> None:
    sc = Scenario(
        config=AsyncConfig(
            rollout_batch_size=2,
            n_samples_per_prompt=3,
            num_rollout=3,
            pause_generation_mode="abort",
            over_sampling_batch_size=10,
        ),
        engine=SimEngineConfig(
            max_running=2,
            decode_base_s=0.005,
            prompt_tokens=5,
            response_length=LengthDist(kind="uniform", low=3, high=5),
        ),
        trainer=SimTrainerConfig(step_base_s=0.3),
        max_new_tokens=32,
    )
    outcome = run_with_faults(sc, FaultSchedule(request_failure_rate=0.2, seed=491), engine_cls=SimEngine)
    assert outcome.error is None, repr(outcome.error)
