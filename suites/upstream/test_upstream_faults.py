"""The property suites' fault schedules on upstream Miles' own code (issue 11, part 4).

Each schedule is the core property suite's draw (``run_cases(faults=True)``) from an
integer seed, run on the upstream host with its faults injected; what upstream does wrong
(an invariant violation, an unexplained error, a hang, an orphaned task, a failed group
silently discarded) is a finding with that seed (``harness.upstream.faults``).

Findings are upstream's behaviour, not test failures: the sweep test records them,
checks that the harness' own machinery worked (every case ran, every fault kind was
drawn and visibly injected, each finding replays from its seed), and compares the kinds
with the committed ``results/upstream/fault_findings.json``: a kind not listed there fails
the test (replay its seed; if it is upstream's, regenerate the file with the command
below). Seeds: ``ci`` runs 0..199, ``nightly`` 0..9,999, ``dev`` 0..49;
``MILES_HARNESS_UPSTREAM_FAULT_RUNS=N`` overrides. The committed file comes from

    .venv/bin/python -m harness.upstream.faults sweep --runs 10000 --jobs 2 --write
"""

from __future__ import annotations

import os

import pytest

from miles_async_core import events as ev
from harness.sim.faults import FaultSchedule
from harness.upstream import faults as uf

RUNS = {"ci": 200, "nightly": 10_000}


def budget() -> int:
    if os.environ.get("MILES_HARNESS_UPSTREAM_FAULT_RUNS"):
        return int(os.environ["MILES_HARNESS_UPSTREAM_FAULT_RUNS"])
    return RUNS.get(os.environ.get("HYPOTHESIS_PROFILE", ""), 50)


@pytest.fixture(scope="module")
def sweep_rows(miles_src):
    return uf.sweep(range(budget()))


def _known_for_this_tree(miles_src) -> dict:
    known = uf.load_known()
    if not known:
        pytest.fail(f"{uf.FINDINGS_FILE} is missing: run `python -m harness.upstream.faults sweep --runs 10000 "
                    "--jobs 2 --write`")
    if known["tree_digest"] != uf.tree_digest(miles_src):
        pytest.skip(f"the findings file describes {known['upstream_tree']} (digest {known['tree_digest']}); the "
                    f"active tree {miles_src} differs: its findings are printed, not compared")
    return known


@pytest.mark.slow
def test_the_sweep_runs_every_fault_kind_on_upstream(sweep_rows):
    rows = sweep_rows
    broken = [r for r in rows if "harness_error" in r]
    assert not broken, f"the harness failed on {len(broken)} seeds (not an upstream finding): {broken[:3]}"
    assert len(rows) == budget()
    drawn = {r["fault"] for r in rows}
    if budget() >= 200:
        assert drawn == {"none", *uf.FAULT_KINDS_DRAWN}, drawn
        assert {r["mode"] for r in rows} == {"sync", "one_step", "fully_async"}
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
    print(f"\nupstream fault sweep: {len(rows)} schedules, {sum(1 for r in rows if r['complete'])} complete, "
          f"{sum(1 for r in rows if r['findings'])} with findings ({found} findings)")


@pytest.mark.slow
def test_every_finding_kind_is_a_listed_one(sweep_rows, miles_src):
    seen: dict[str, int] = {}
    for r in sweep_rows:
        for f in r.get("findings", []):
            seen.setdefault(f["kind"], r["seed"])
    known = _known_for_this_tree(miles_src)
    new = {k: s for k, s in seen.items() if k not in known["kinds"]}
    assert not new, ("finding kinds not in results/upstream/fault_findings.json (replay: python -m "
                     f"harness.upstream.faults replay SEED): {new}")


def test_listed_findings_replay_from_their_seeds(miles_src):
    """The first seed of every listed kind still draws the same case and shows that kind."""
    known = _known_for_this_tree(miles_src)
    assert known["runs"] >= 2000 and known["kinds"]
    for kind, k in known["kinds"].items():
        seed = k["seeds"][0]
        if uf.case_digest(seed) != k["case_digests"][0]:
            pytest.skip(f"seed {seed} draws a different case than when the file was written (the strategy or "
                        "the simulator changed): regenerate the file")
        out, found = uf.run_seed(seed)
        assert kind in {f.kind for f in found}, f"seed {seed} no longer shows {kind}: {[f.kind for f in found]}"


def test_a_seed_replays_the_same_case_and_outcome(miles_src):
    a, b = uf.case_from_seed(17), uf.case_from_seed(17)
    assert a == b and uf.case_from_seed(18) != a
    (o1, f1), (o2, f2) = uf.run_seed(17), uf.run_seed(17)
    assert [e.kind for e in o1.events] == [e.kind for e in o2.events] and f1 == f2


# --- the machinery can fail: each finding category is produced when the thing happens -------------

def _fa_case(**faults):
    from harness.checking.strategies import RunCase
    from harness.upstream.diff import case_named

    sc = case_named("fa-group-abort-storm-retry").scenario()
    return RunCase(sc, FaultSchedule(**faults))


def test_a_hang_is_reported_not_waited_for(miles_src):
    """A virtual-time limit below the run's length: the watchdog ends it as a hang."""
    out = uf.host_run_with_faults(_fa_case(), vtime_limit_s=3.0)
    assert out.hang and "virtual time limit" in out.hang
    assert [f.category for f in uf.findings(out)][0] == "hang"


def test_an_orphaned_task_after_a_failure_is_reported(miles_src):
    """A trainer failure in fully-async: upstream's worker (a Ray actor's task) keeps running."""
    out = uf.host_run_with_faults(_fa_case(trainer_fail_at_step=1))
    assert type(out.error).__name__ == "TrainerStepError"
    kinds = {f.kind for f in uf.findings(out)}
    assert "orphaned_task:fully_async_worker@fully_async" in kinds


def test_an_unexplained_error_is_a_finding(miles_src, monkeypatch):
    """An error no injected fault explains (here the trainer raises ``ValueError`` in a
    fault-free schedule) is a ``run_error`` finding."""
    from harness.sim.trainer import SimTrainer

    async def broken(self, rollout_id, groups):
        raise ValueError("not a fault")

    monkeypatch.setattr(SimTrainer, "train", broken)
    out = uf.host_run_with_faults(_fa_case())
    assert any(f.kind == "run_error:ValueError@fully_async" for f in uf.findings(out))


def test_a_fault_free_run_has_no_findings_and_injected_aborts_reach_the_buffer(miles_src):
    out = uf.host_run_with_faults(_fa_case())
    assert out.complete and uf.findings(out) == []
    out = uf.host_run_with_faults(_fa_case(injected_abort_rate=0.3, seed=1))
    assert any(e.kind == ev.PUT_REJECTED and e["reason"] == "aborted" for e in out.events)
    assert out.complete and uf.findings(out) == []
