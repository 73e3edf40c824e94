"""Bugs that only cost time, judged on upstream's own runs by the checkers alone
(``harness/checking/invariants/throughput.py``): each seeded bug is caught by its
checker, by name, in every mode the checker applies to, and the same case passes it
unmutated. The whole matrix passing every checker unmutated is
``test_upstream_diff.py::test_invariants_hold_on_upstream_runs``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from harness.checking.strategies import RunCase
from harness.sim.engine import SimEngineConfig
from harness.sim.faults import FaultSchedule
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainerConfig
from harness.sim.watchdog import WatchdogLimits
from harness.upstream import patching, source
from harness.upstream.diff import case_named
from miles_async_core.config import AsyncConfig

try:
    from fixtures.upstream_hang_mutants import HANG_MUTANTS
    from fixtures.upstream_mutants import FULLY_ASYNC_CHECKED_MUTANTS, UPSTREAM_MUTANTS
except ModuleNotFoundError:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.upstream_hang_mutants import HANG_MUTANTS
    from fixtures.upstream_mutants import FULLY_ASYNC_CHECKED_MUTANTS, UPSTREAM_MUTANTS

MUTANTS = {m.name: m for m in UPSTREAM_MUTANTS + FULLY_ASYNC_CHECKED_MUTANTS}

# (mutant, checker, matrix cases: one per mode the checker applies to)
CATCHES = [
    (
        "next_rollout_after_train",
        "one_step_overlap",
        ["one-step-k1", "one-step-k3", "fa-retract-group", "fa-in_place-sample"],
    ),
    (
        "worker_budget_one_group_short",
        "no_idle_slot",
        ["fa-retract-group", "fa-retract-sample", "fa-in_place-group", "fa-in_place-sample"],
    ),
    ("sample_backfill_undercommit", "no_idle_slot", ["fa-sample-cap-concurrency"]),
]


@pytest.fixture
def quiet():
    loggers = [logging.getLogger(n) for n in ("miles", "asyncio")]
    levels = [q.level for q in loggers]
    for q in loggers:
        q.setLevel(logging.CRITICAL)
    yield
    for q, lv in zip(loggers, levels):
        q.setLevel(lv)


def _runnable_config(config) -> None:
    reason = source.refused_reason(config)
    if reason:
        pytest.skip(reason)


def _runnable(case_name: str) -> None:
    _runnable_config(case_named(case_name).scenario().config)


# the first case of each in the fast tier, the other modes in the slow one
PARAMS = [
    pytest.param(m, c, case, id=f"{m}-{case}", marks=() if i == 0 else pytest.mark.slow)
    for m, c, cases in CATCHES
    for i, case in enumerate(cases)
]


@pytest.mark.parametrize("mutant,checker,case_name", PARAMS)
def test_each_throughput_bug_is_caught_by_its_checker_in_every_mode(miles_src, quiet, mutant, checker, case_name):
    _runnable(case_name)
    case, cache = case_named(case_name), {}
    caught, detail = patching._check(case, cache, MUTANTS[mutant])
    assert checker in caught, f"{mutant} on {case_name}: caught by {caught} ({detail})"
    clean = patching.clean_catch(case, cache)
    assert clean == [], f"unmutated upstream on {case_name}: {clean}"


def test_a_drain_that_waits_on_a_dead_worker_is_caught_by_the_checker_not_only_the_watchdog(miles_src, quiet, caplog):
    """The seeded hang (``drain_waits_only_on_the_buffer``, run as
    ``test_upstream_hangs.py`` runs it): besides the watchdog's ``hang``,
    ``dead_worker_surfaces`` names it on the trace; the same case without the bug passes it.
    Both runs crash the worker, so both leave upstream's failed group tasks unretrieved
    (``harness.checking.unretrieved``): collected and asserted here."""
    from harness.checking import unretrieved
    from harness.upstream.fault_sweep import findings, runner_run_with_faults

    caplog.set_level(logging.ERROR, logger="asyncio")  # ``quiet`` silences the rest of asyncio's log

    hm = next(h for h in HANG_MUTANTS if h.mutant.name == "drain_waits_only_on_the_buffer")
    sc = Scenario(
        name=hm.mutant.name,
        config=AsyncConfig(
            rollout_batch_size=4,
            n_samples_per_prompt=2,
            num_rollout=5,
            seed=3,
            fully_async=True,
            max_weight_staleness=1,
            async_unused_samples_handler="retry",
        ),
        engine=SimEngineConfig(seed=3),
        trainer=SimTrainerConfig(step_base_s=2.0),
        max_new_tokens=96,
        watchdog=WatchdogLimits(hang_after_s=60.0, max_events=5_000),
    )
    case = RunCase(sc, FaultSchedule(**dict(hm.faults)))
    _runnable_config(sc.config)
    with patching.applied(hm.mutant):
        found = findings(runner_run_with_faults(case))
    assert "dead_worker_surfaces" in {f.detail for f in found if f.category == "invariant"}, found
    clean = findings(runner_run_with_faults(case))
    assert "dead_worker_surfaces" not in {f.detail for f in clean}, clean
    leaked = unretrieved.collect(caplog.records)
    assert leaked and all(unretrieved.from_worker_crash(r) for r in leaked), [r.getMessage() for r in leaked]
