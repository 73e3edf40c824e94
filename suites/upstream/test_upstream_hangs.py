"""Seeded bugs that never end an upstream run (``fixtures/upstream_hang_mutants.py``): the
runner's progress watchdog stops each with its kind (``hang`` / ``runaway``) and the
pending tasks' stacks, in seconds; the fault sweep counts each as an upstream finding with
its seed, never as a harness error. Unmutated, the same cases end normally.

Under a worker crash upstream's fully-async worker leaves failed group tasks unretrieved
(``harness.checking.unretrieved``); the test that runs that case collects them inside the
test and asserts they are exactly the injected crash in upstream's ``_generate_group``, so
they are expected, not stray tracebacks after a green session."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from miles_async_core.config import AsyncConfig
from harness.checking.strategies import RunCase
from harness.sim.engine import SimEngineConfig
from harness.sim.faults import FaultSchedule
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainerConfig
from harness.sim.watchdog import WatchdogLimits
from harness.upstream import patching

try:
    from fixtures.upstream_hang_mutants import HANG_MUTANTS
except ModuleNotFoundError:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.upstream_hang_mutants import HANG_MUTANTS


@pytest.fixture(autouse=True)
def _fully_async_runs_here(miles_src):
    """Every mutant here is in upstream's fully-async code: on a tree whose fully-async
    driver the harness cannot run faithfully (``miles-harness doctor``), skip, naming the seams."""
    from harness.upstream import source

    reason = source.refused_reason(AsyncConfig(rollout_batch_size=4, n_samples_per_prompt=2, fully_async=True))
    if reason:
        pytest.skip(reason)


DEFAULT_LIMITS = WatchdogLimits()


def _case(hm, watchdog: WatchdogLimits = DEFAULT_LIMITS) -> RunCase:
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
        watchdog=watchdog,
    )
    return RunCase(sc, FaultSchedule(**dict(hm.faults)))


def _run(case: RunCase, mutant=None):
    from harness.upstream.fault_sweep import _quiet_upstream_logs, findings, runner_run_with_faults

    with patching.applied(mutant) if mutant is not None else _nothing(), _quiet_upstream_logs():
        out = runner_run_with_faults(case)
    return out, findings(out)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("hm", HANG_MUTANTS, ids=lambda h: h.mutant.name)
def test_every_patch_applies_to_the_tree(miles_src, hm):
    for p in hm.mutant.patches:
        assert patching.patched_text(hm.mutant, p, miles_src) != (miles_src / p.path).read_text()


@pytest.mark.parametrize("hm", HANG_MUTANTS, ids=lambda h: h.mutant.name)
def test_the_watchdog_stops_it_with_its_kind_and_the_stacks_under_the_scenarios_bounds(miles_src, hm, caplog):
    """The scenario states tight bounds (a quiet minute, 5,000 events): a second or two each."""
    from harness.checking import unretrieved

    case = _case(hm, WatchdogLimits(hang_after_s=60.0, max_events=5_000))
    out, found = _run(case, hm.mutant)
    assert out.hang is not None and out.hang.startswith(f"watchdog {hm.expected}"), out.hang
    assert hm.expected in {f.category for f in found}
    assert "pending tasks:" in out.hang and "in _next_group" in out.hang  # where the drain waits
    clean, clean_found = _run(case)
    assert clean.hang is None and not [f for f in clean_found if f.category in ("hang", "runaway")]
    del out, clean  # the outcomes keep the failed tasks reachable; dropped, the collector finds them now
    leaked = unretrieved.collect(caplog.records)
    # only a run with a worker crash leaves failed group tasks behind (module docstring)
    assert bool(leaked) == bool(hm.faults), [r.getMessage() for r in leaked]
    assert all(unretrieved.from_worker_crash(r) for r in leaked), [r.getMessage() for r in leaked]


@pytest.mark.slow
@pytest.mark.parametrize("hm", HANG_MUTANTS, ids=lambda h: h.mutant.name)
def test_under_the_derived_bounds_it_ends_in_under_30_seconds(miles_src, hm, capsys):
    start = time.perf_counter()
    out, found = _run(_case(hm), hm.mutant)
    wall = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n{hm.mutant.name}: {hm.expected} after {wall:.1f} s wall\n{out.hang[:1500]}")
    assert out.hang is not None and out.hang.startswith(f"watchdog {hm.expected}")
    assert wall < 30.0


def _candidate_seeds(hm, count: int = 8) -> list[int]:
    """Sweep seeds whose drawn case can show the bug: fully-async with the retry handler and
    a staleness bound, under the mutant's fault kind (a worker crash, or none)."""
    from harness.upstream.fault_sweep import case_from_seed, fault_kind

    want = "worker_crash" if hm.faults else "none"
    seeds = []
    for seed in range(2_000):
        c = case_from_seed(seed)
        cfg = c.scenario.config
        if (
            cfg.fully_async
            and fault_kind(c.faults) == want
            and cfg.async_unused_samples_handler == "retry"
            and cfg.max_weight_staleness is not None
        ):
            seeds.append(seed)
            if len(seeds) == count:
                break
    return seeds


@pytest.mark.slow
@pytest.mark.parametrize("hm", HANG_MUTANTS, ids=lambda h: h.mutant.name)
def test_the_fault_sweep_counts_it_as_a_finding_with_its_seed(miles_src, hm):
    """Seeds are swept (as ``sweep`` does) until one shows the bug; every row is an upstream
    outcome, none a harness error, and the findings file lists the seed under its kind."""
    from harness.upstream.fault_sweep import summarize, sweep

    rows: list[dict] = []
    with patching.applied(hm.mutant):
        for seed in _candidate_seeds(hm):
            rows += sweep([seed])
            if any(f["category"] == hm.expected for f in rows[-1].get("findings", [])):
                break
    assert not [r for r in rows if "harness_error" in r]
    found = [r["seed"] for r in rows if any(f["category"] == hm.expected for f in r["findings"])]
    assert found, f"no {hm.expected} in seeds {[r['seed'] for r in rows]}"
    doc = summarize(rows, tree=miles_src, seeds=",".join(str(r["seed"]) for r in rows))
    assert not doc["harness_errors"]
    assert any(found[0] in k["seeds"] for k in doc["kinds"].values() if k["category"] == hm.expected)
    print(
        f"{hm.mutant.name}: {hm.expected} finding on sweep seed {found[0]} (seeds tried: {[r['seed'] for r in rows]})"
    )
