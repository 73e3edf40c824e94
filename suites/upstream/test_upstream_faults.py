"""The property suites' fault schedules on upstream Miles' own code.

Each schedule is the core property suite's draw (``run_cases(faults=True)``) from an
integer seed, run on the upstream runner with its faults injected; what upstream does wrong
(an invariant violation, an unexplained error, a hang, an orphaned task, a failed group
silently discarded) is a finding with that seed (``harness.upstream.fault_sweep``).

Findings are upstream's behaviour, not test failures: the sweep test records them,
checks that the harness' own machinery worked (every case ran, every fault kind was
drawn and visibly injected, each finding replays from its seed), and compares the kinds
with the committed ``results/upstream/fault_findings.json``: a kind not listed there fails
the test (replay its seed; if it is upstream's, regenerate the file with the command
below). Seeds: ``ci`` runs 0..199, ``nightly`` 0..9,999, ``dev`` 0..49;
``MILES_HARNESS_UPSTREAM_FAULT_RUNS=N`` overrides. The committed file comes from

    .venv/bin/python -m harness.upstream.fault_sweep sweep --runs 10000 --jobs 2 --write
"""

from __future__ import annotations

import os

import pytest

from miles_async_core import events as ev
from harness.sim.faults import FaultSchedule
from harness.upstream import fault_sweep as uf
from harness.upstream import source

RUNS = {"miles-harness-ci": 200, "miles-harness-nightly": 10_000}


def budget() -> int:
    if os.environ.get("MILES_HARNESS_UPSTREAM_FAULT_RUNS"):
        return int(os.environ["MILES_HARNESS_UPSTREAM_FAULT_RUNS"])
    return RUNS.get(os.environ.get("HYPOTHESIS_PROFILE", ""), 50)


@pytest.fixture(scope="module")
def sweep_rows(miles_src):
    return uf.sweep(range(budget()))


def _accepted() -> dict:
    """The finding kinds the project has accepted for upstream (the committed file)."""
    known = uf.load_known()
    if not known:
        pytest.fail(
            f"{uf.FINDINGS_FILE} is missing: run `python -m harness.upstream.fault_sweep sweep --runs 10000 "
            "--jobs 2 --write`"
        )
    return known


def _known_for_this_tree(miles_src) -> dict:
    known = _accepted()
    if known["tree_digest"] != uf.tree_digest(miles_src):
        pytest.skip(
            f"the findings file describes {known['upstream_tree']} (digest {known['tree_digest']}); the "
            f"active tree {miles_src} differs, so its listed seeds are not this tree's to replay (its "
            "finding kinds are judged by test_every_finding_kind_is_a_listed_one)"
        )
    return known


@pytest.mark.slow
def test_the_sweep_runs_every_fault_kind_on_upstream(sweep_rows):
    broken = [r for r in sweep_rows if "harness_error" in r]
    assert not broken, f"the harness failed on {len(broken)} seeds (not an upstream finding): {broken[:3]}"
    assert len(sweep_rows) == budget()
    if budget() >= 200:
        assert {r["fault"] for r in sweep_rows} == {"none", *uf.FAULT_KINDS_DRAWN}
        assert {r["mode"] for r in sweep_rows} == {"sync", "one_step", "fully_async"}
    # a case whose driver this tree lacks a seam for is not run (never a finding): only
    # the modes the seam table refuses may be, and then all their cases are
    refused = [r for r in sweep_rows if "refused" in r]
    rows = [r for r in sweep_rows if "refused" not in r]
    assert not {r["mode"] for r in refused} & {r["mode"] for r in rows}
    drawn = {r["fault"] for r in rows}
    # each drawn fault kind visibly took effect in some run
    effect = {
        "request_failure": lambda r: r["error"] == "EngineRequestError" or r["silent_drops"],
        "trainer_failure": lambda r: r["error"] == "TrainerStepError",
        "cancel": lambda r: r["error"] == "CancelledError",
        "worker_crash": lambda r: r["fault_events"] > 0,
        "injected_abort": lambda r: r["fault_events"] > 0,
        "abort_storm": lambda r: r["fault_events"] > 0,
        "dynamic_filter": lambda r: r["filter_rejects"] > 0,
    }
    for kind in drawn - {"none"} if budget() >= 200 else ():  # a few runs may all end before their fault
        assert any(effect[kind](r) for r in rows if r["fault"] == kind), f"no run shows the {kind} fault injected"
    clean = [r for r in rows if r["fault"] == "none"]
    assert all(r["complete"] and r["error"] is None for r in clean), "a fault-free upstream run did not complete"
    found = sum(len(r["findings"]) for r in rows)
    print(
        f"\nupstream fault sweep: {len(rows)} schedules, {sum(1 for r in rows if r['complete'])} complete, "
        f"{sum(1 for r in rows if r['findings'])} with findings ({found} findings), {len(refused)} not run "
        f"(missing seams: {sorted({s for r in refused for s in r['refused']})})"
    )


@pytest.mark.slow
def test_every_finding_kind_is_a_listed_one(sweep_rows, miles_src):
    """Judged on any tree: a finding kind the project has not accepted for upstream (the
    kinds of the committed findings file) fails, with its seeds."""
    seen: dict[str, list[int]] = {}
    for r in sweep_rows:
        for f in r.get("findings", []):
            seen.setdefault(f["kind"], []).append(r["seed"])
    known = _accepted()
    new = {k: s[:5] for k, s in seen.items() if k not in known["kinds"]}
    assert not new, (
        f"finding kinds on {miles_src} not accepted in results/upstream/fault_findings.json (kind: "
        f"first seeds; replay: python -m harness.upstream.fault_sweep --miles-src {miles_src} replay "
        f"SEED): {new}"
    )


def test_listed_findings_replay_from_their_seeds(miles_src):
    """The first seed of every listed kind still draws the same case and shows that kind."""
    known = _known_for_this_tree(miles_src)
    assert known["runs"] >= 2000 and known["kinds"]
    for kind, k in known["kinds"].items():
        seed = k["seeds"][0]
        if uf.case_digest(seed) != k["case_digests"][0]:
            pytest.skip(
                f"seed {seed} draws a different case than when the file was written (the strategy or "
                "the simulator changed): regenerate the file"
            )
        out, found = uf.run_seed(seed)
        assert kind in {f.kind for f in found}, f"seed {seed} no longer shows {kind}: {[f.kind for f in found]}"


def _seed_that_runs_here(start: int) -> int:
    return next(
        s for s in range(start, start + 100) if source.refused_reason(uf.case_from_seed(s).scenario.config) is None
    )


def test_a_seed_replays_the_same_case_and_outcome(miles_src):
    a, b = uf.case_from_seed(17), uf.case_from_seed(17)
    assert a == b and uf.case_from_seed(18) != a
    seed = _seed_that_runs_here(17)
    (o1, f1), (o2, f2) = uf.run_seed(seed), uf.run_seed(seed)
    assert [e.kind for e in o1.events] == [e.kind for e in o2.events] and f1 == f2


# --- the machinery can fail: each finding category is produced when the thing happens -------------


def _fa_case(**faults):
    from harness.checking.strategies import RunCase
    from harness.upstream.diff import case_named

    sc = case_named("fa-group-abort-storm-retry").scenario()
    reason = source.refused_reason(sc.config)
    if reason:
        pytest.skip(reason)
    return RunCase(sc, FaultSchedule(**faults))


def test_a_hang_is_reported_not_waited_for(miles_src):
    """A virtual-time limit below the run's length: the watchdog ends it as a hang."""
    out = uf.runner_run_with_faults(_fa_case(), vtime_limit_s=3.0)
    assert out.hang and "virtual time limit" in out.hang
    assert [f.category for f in uf.findings(out)][0] == "hang"


def test_an_orphan_of_the_driver_is_reported_and_a_ray_actors_own_tasks_are_not(miles_src):
    """Upstream's orchestration: the fully-async rollout runs in the rollout manager's Ray
    actor, so after a trainer failure its worker still runs in that actor's process, which
    Ray ends with the job: listed apart (``actor_tasks``), no orphan of the driver. The
    generate the driver launched and left in flight is the driver's,
    and so is a task the driver's own process starts and leaves running (a seeded bug in
    ``train_async.py``), in the same run."""
    from harness.upstream import patching
    from harness.upstream.patching import Patch, UpstreamMutant

    case = _fa_case(trainer_fail_at_step=1)
    out = uf.runner_run_with_faults(case)
    assert type(out.error).__name__ == "TrainerStepError"
    orphans = {f.kind for f in uf.findings(out) if f.category == "orphaned_task"}
    assert orphans == {"orphaned_task:launched_generate@fully_async"}, orphans
    assert any(t.endswith("FullyAsyncRolloutFn._worker_loop") for t in out.actor_tasks), out.actor_tasks
    line = "    rollout_data_next_future = rollout_manager.generate.remote(args.start_rollout_id)\n"
    bug = UpstreamMutant(
        name="driver_leaves_a_task_running",
        area="driver",
        doc="the driver starts a task of its own that it never awaits or cancels",
        patches=(Patch("train_async.py", line, line + "    _left = asyncio.ensure_future(asyncio.sleep(1e9))\n"),),
        expected=frozenset({"orphaned_task"}),
    )
    with patching.applied(bug):
        out = uf.runner_run_with_faults(case)
    orphans = {f.kind for f in uf.findings(out) if f.category == "orphaned_task"}
    assert orphans == {"orphaned_task:launched_generate@fully_async", "orphaned_task:sleep@fully_async"}, orphans


def test_an_unexplained_error_is_a_finding(miles_src, monkeypatch):
    """An error no injected fault explains (here the trainer raises ``ValueError`` in a
    fault-free schedule) is a ``run_error`` finding."""
    from harness.sim.trainer import SimTrainer

    async def broken(self, rollout_id, groups):
        raise ValueError("not a fault")

    monkeypatch.setattr(SimTrainer, "train", broken)
    out = uf.runner_run_with_faults(_fa_case())
    assert any(f.kind == "run_error:ValueError@fully_async" for f in uf.findings(out))


def test_a_fault_free_run_has_no_findings_and_injected_aborts_reach_the_buffer(miles_src):
    out = uf.runner_run_with_faults(_fa_case())
    assert out.complete and uf.findings(out) == []
    out = uf.runner_run_with_faults(_fa_case(injected_abort_rate=0.3, seed=1))
    assert any(e.kind == ev.PUT_REJECTED and e["reason"] == "aborted" for e in out.events)
    assert out.complete and uf.findings(out) == []


def test_a_seam_failing_inside_upstream_is_a_harness_error_not_a_finding(miles_src, monkeypatch):
    """The lifecycle sink stops announcing samples: every /generate raises the runner's
    ``LeafCalled`` inside upstream's group tasks, which upstream logs (or fails on) as
    its own error. The seed's row is a harness error naming the seam, with no findings."""
    from harness.upstream import host

    monkeypatch.setattr(host.LifecycleSink, "gen_start", lambda self, sample: None)
    row = uf._row(_seed_that_runs_here(17))
    assert "harness_error" in row and "findings" not in row, row
    assert "RunnerSeamError" in row["harness_error"]
    assert "lifecycle_sink" in row["harness_error"] or "generate_and_rm" in row["harness_error"]


class NonRetryableError(Exception):
    """The refactor's trainer controller's error type, by name (miles/utils/exceptions)."""


def test_the_refactored_trainer_controllers_report_of_the_injected_failure_is_explained_and_only_that():
    """On the controller-executor shape the injected trainer failure surfaces as the trainer
    controller's own ``All cells failed in this training attempt``: explained when the trainer
    took exactly the steps before the failing one; the same error a step early, another
    message, or with no trainer failure drawn is a finding."""
    from harness.checking.strategies import RunCase
    from harness.upstream.diff import case_named

    sc = case_named("one-step-k1").scenario()

    def outcome(error: BaseException, *, fail_at: int | None, steps: int) -> uf.RunnerOutcome:
        case = RunCase(sc, FaultSchedule(trainer_fail_at_step=fail_at))
        return uf.RunnerOutcome(None, case, [], [{}] * steps, error, [])

    def run_errors(out: uf.RunnerOutcome) -> list[str]:
        return [f.kind for f in uf.findings(out) if f.category == "run_error"]

    all_failed = NonRetryableError("All cells failed in this training attempt")
    assert run_errors(outcome(all_failed, fail_at=2, steps=2)) == []
    assert run_errors(outcome(all_failed, fail_at=2, steps=1)) == ["run_error:NonRetryableError@one_step"]
    assert run_errors(outcome(NonRetryableError("weight update"), fail_at=2, steps=2)) == [
        "run_error:NonRetryableError@one_step"
    ]
    assert run_errors(outcome(all_failed, fail_at=None, steps=2)) == ["run_error:NonRetryableError@one_step"]


def test_a_worker_that_dies_in_the_last_drains_instant_leaves_nothing_waiting(miles_src):
    """Seed 5050: the worker crashes in the instant the last drain ends (its last put woke
    that drain's get), and the driver then trains the last rollout: no drain waits on the
    dead worker, so ``dead_worker_surfaces`` holds however long that training takes."""
    out, found = uf.run_seed(5050)
    assert any(e.kind == "drain_end" for e in out.events) and out.error is None
    assert [f.kind for f in found if f.category == "invariant"] == []
