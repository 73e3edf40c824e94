"""The upstream runner's accounting of where upstream holds each taken group (conservation: every taken group is trained, dropped, rejected or recycled):
a group is held by its group task from the task's creation, and a group task the fully-async
worker forgets is a group lost.

The scenario is the fault sweep's seed 2668 without its fault (a worker crash that never
fires): the drain of rollout 4 returns after the worker created group 6's task
(``fully_async_rollout.py:L133``, ``_submit_one_group`` L112-L116) and before that task first
ran. The runner used to learn of a group task only at its first step, so it declared group 6
lost there and conservation reported it at the run's end, though it was in the buffer
(a false finding, seeds 2668 and 3647 of the sweep).
"""

from __future__ import annotations

import pytest

from miles_async_core import events as ev
from harness.checking.invariants import check_all
from harness.sim.scenario import scenario_from_dict
from harness.upstream import patching, source


@pytest.fixture(autouse=True)
def _fully_async_runs_here(miles_src):
    """Every case here is fully-async: skipped, naming the seams, on a tree that lacks them."""
    reason = source.refused_reason(scenario_from_dict(SEED_2668).config)
    if reason:
        pytest.skip(reason)


SEED_2668 = {
    "name": "fault-sweep-seed-2668",
    "config": {
        "rollout_batch_size": 1,
        "n_samples_per_prompt": 1,
        "update_weights_interval": 3,
        "max_weight_staleness": 1,
        "async_unused_samples_handler": "retry",
        "async_data_buffer_capacity_factor": 1.0,
        "fully_async": True,
        "driver": "train_async",
        "num_rollout": 6,
        "seed": 69,
    },
    "engine": {
        "max_running": 2,
        "decode_base_s": 0.05,
        "decode_per_seq_s": 0.0002,
        "prefill_per_token_s": 2e-05,
        "prompt_tokens": 62,
        "response_length": {"kind": "lognormal", "median": 12.0, "sigma": 0.2, "low": 6, "high": 28},
        "seed": 101,
    },
    "trainer": {"step_base_s": 1.0, "per_token_s": 0.0},
    "max_new_tokens": 89,
}

FORGETS_A_GROUP_TASK = patching.UpstreamMutant(
    "worker_forgets_a_group_task",
    "fully_async",
    "the worker creates its third group task and does not keep it: the group runs and is never put",
    (
        patching.Patch(
            "miles/rollout/fully_async_rollout.py",
            "                active.add(self._submit_one_group())\n",
            "                self._n_submitted = getattr(self, '_n_submitted', 0) + 1\n"
            "                task = self._submit_one_group()\n"
            "                if self._n_submitted != 3:\n"
            "                    active.add(task)\n",
        ),
    ),
    frozenset({"conservation"}),
)


def _run(miles_src):
    from harness.upstream.runner import run_upstream

    sc = scenario_from_dict(SEED_2668)
    res = run_upstream(sc)
    assert res.error is None, res.error
    return sc, res


def _seqs(events, kind: str) -> dict[int, int]:
    return {e["group_index"]: e.seq for e in events if e.kind == kind}


def test_a_group_task_created_just_before_a_drain_returns_holds_its_group(miles_src):
    sc, res = _run(miles_src)
    taken, submitted = _seqs(res.events, ev.TAKEN), _seqs(res.events, ev.SUBMITTED)
    drain_ends = [e.seq for e in res.events if e.kind == ev.DRAIN_END]
    # the window: group 6 taken (its task created) before a drain ends, first run after it
    assert any(taken[6] < d < submitted[6] for d in drain_ends), "the scenario no longer has the window"
    assert [v for v in check_all(res.events, sc.config, complete=True) if v.invariant == "conservation"] == []
    [run_end] = [e for e in res.events if e.kind == ev.RUN_END]
    assert 6 in run_end["pending_groups"]  # in the buffer at the end, not lost


def test_a_group_task_the_worker_forgets_is_reported_lost(miles_src):
    with patching.applied(FORGETS_A_GROUP_TASK):
        sc, res = _run(miles_src)
    forgotten = 2  # the third group submitted
    assert forgotten not in {gi for e in res.events if e.kind == ev.TRAINED for gi in e["group_indices"]}
    lost = [v for v in check_all(res.events, sc.config, complete=True) if v.invariant == "conservation"]
    assert lost and any(f"group {forgotten}:" in v.message for v in lost), lost
    [run_end] = [e for e in res.events if e.kind == ev.RUN_END]
    assert forgotten not in run_end["pending_groups"]


# --- the accounting checks itself: a group declared lost never comes back ------------------------


def _misses_the_buffer(monkeypatch):
    """Break the runner's accounting (in this test only): a group queued in upstream's buffer
    is not counted as held, so the accounting after a drain declares it lost."""
    from harness.upstream.runner import UpstreamRunner

    queued = UpstreamRunner._queued

    def blind(self):
        return queued(self) - {e.prompt_group[0].group_index for e in self.buffer._buffer}

    monkeypatch.setattr(UpstreamRunner, "_queued", blind)


def _fault_free_row(monkeypatch):
    """The fault sweep's row for SEED_2668's scenario with no fault, as ``sweep`` makes it."""
    from harness.checking.strategies import RunCase
    from harness.sim.faults import FaultSchedule
    from harness.upstream import fault_sweep as uf

    monkeypatch.setattr(uf, "case_from_seed", lambda seed: RunCase(scenario_from_dict(SEED_2668), FaultSchedule()))
    return uf._row(0)


def test_a_lost_group_seen_again_is_a_harness_error_not_an_upstream_finding(miles_src, monkeypatch):
    """A group the runner declared lost that a later drain gets from the buffer proves the
    runner's accounting wrong, not upstream: the run raises ``RunnerAccountingError`` naming
    the group, where it was declared lost and where it showed up, and the fault sweep
    records the seed as a ``harness_error`` with no upstream finding (before the
    self-check, this run reported a conservation loss of upstream's)."""
    from harness.upstream.runner import RunnerAccountingError

    _misses_the_buffer(monkeypatch)
    with pytest.raises(
        RunnerAccountingError,
        match=r"^harness_error: runner accounting: group \d+ declared lost "
        r"\(t=[\d.]+: held by nothing after a rollout\) and then at "
        r"t=[\d.]+: (got from the buffer|queued in the data source "
        r"or the buffer)",
    ) as info:
        _run(miles_src)
    assert info.value.result.error is None and info.value.result.history  # upstream's run itself went fine
    row = _fault_free_row(monkeypatch)
    assert "RunnerAccountingError('harness_error: runner accounting" in row["harness_error"]
    assert "findings" not in row


def test_a_group_upstream_really_loses_stays_an_upstream_finding(miles_src, monkeypatch):
    """The self-check does not fire on a real loss: the forgotten group task still runs
    after the runner declares its group lost, and nothing hands the group back."""
    with patching.applied(FORGETS_A_GROUP_TASK):
        row = _fault_free_row(monkeypatch)
    assert "harness_error" not in row
    assert "invariant:conservation@fully_async" in {f["kind"] for f in row["findings"]}
