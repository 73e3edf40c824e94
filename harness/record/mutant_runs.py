"""The project's seeded upstream bugs (``fixtures/upstream_mutants.py``, and the
orchestration layer's, ``fixtures/upstream_orchestration_mutants.py``, in
``ORCHESTRATION_CASES``: the served run runs upstream's rollout manager, actor group and
train actor base, so a bug there runs) in real time:
each applied in memory (``harness.upstream.patching.applied``) to the served run with the
recorder (``harness.record.served_run``), and the merged trace checked. A bug is caught
when a checker it is expected to trip fails; ``REAL_TIME_CASES`` names, per bug, the run
that gives it room to show (a bug needs the state it breaks: a full buffer, stale
groups, a one-step generate to update inside), and ``NOT_IN_REAL_TIME`` the bugs these
runs cannot show, with why.

A bug whose effect depends on timing gets a forced window (``FORCED_WINDOW``): each
training step but the last also waits until the next drain has closed and the buffer holds
a group, so that at every weight update a group generated under the old weights is in
the buffer and the next drain consumes it one version stale. The first two drains
(before any update) consume only staleness 0, so from the third on a drain's staleness
differs from the run's so far, whatever the host's load: a window that never resets is
certain to report the wrong mean. A bug in the buffer's order needs a choice at a get: its
window waits for two groups in the buffer, so the drain after the step opens on two (the
one-group drains of a run where each group reaches the buffer alone give it none, and how
often groups arrive together depends on the host's load). The wait is bounded
(``WINDOW_TIMEOUT_S``); the report
says how many steps held the window and the share of the host the run had
(``harness.measure.host_load``), so a run that could not hold it says why.

``python -m harness.record.mutant_runs --out results/record/mutant_runs.json`` writes the
table (bug, run, checkers failed, caught) and the clean runs' verdicts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from harness.serve.upstream_e2e import STANDARD_RUNS, E2EConfig

if TYPE_CHECKING:
    from harness.upstream.patching import UpstreamMutant

ONE_STEP, FA_RETRACT, FA_IN_PLACE = STANDARD_RUNS
# without over-sampling each get_samples call takes B groups, so a scheduler that admits
# one group over the budget makes a second call at once (with 6 > B it never has room)
ONE_STEP_NO_OVERSAMPLING = E2EConfig(
    **{**asdict(ONE_STEP), "name": "one-step-retract-disk-no-oversampling", "over_sampling_batch_size": None}
)
# 4 groups in flight instead of 2: groups reach the buffer while a drain is away (training,
# updating), so it holds stale groups and fills to its capacity
FA_WIDE = E2EConfig(
    **{**asdict(FA_RETRACT), "name": "fully-async-retract-tensor-16-in-flight", "max_concurrent_samples": 16}
)
# and every request runs to max_new_tokens: groups submitted together finish in the same
# decode step, so the buffer holds several at a get (an order bug has a choice to get wrong)
FA_LOCKSTEP = E2EConfig(
    **{**asdict(FA_WIDE), "name": "fully-async-retract-tensor-16-in-flight-no-eos", "stop_at_eos": False}
)
# and each training step lasts 0.5 s more, longer than a group's generation: while the drain
# is away, every group in flight finishes and is put, so the buffer meets its capacity at
# each step, not only when two groups happen to finish in the same decode step
FA_SLOW_TRAINER = E2EConfig(
    **{
        **asdict(FA_LOCKSTEP),
        "name": "fully-async-retract-tensor-16-in-flight-no-eos-slow-trainer",
        "train_extra_s": 0.5,
    }
)
SMALL_BUFFER = {"async_data_buffer_capacity_factor": 0.25}  # C = 1 group: put waits at capacity
STRICT = {"max_weight_staleness": 0}  # every group that spans an update is stale: the handler runs

# bug -> (base run, extra Miles args fields)
REAL_TIME_CASES: dict[str, tuple[E2EConfig, Mapping[str, float]]] = {
    "buffer_capacity_off_by_one": (FA_SLOW_TRAINER, SMALL_BUFFER),
    "buffer_lifo": (FA_LOCKSTEP, {}),
    "staleness_bound_off_by_one": (FA_WIDE, {}),
    "consumed_staleness_not_reset": (FA_RETRACT, {}),
    "unused_handler_swapped": (FA_RETRACT, STRICT),
    "drain_one_group_too_many": (FA_RETRACT, {}),
    "sample_backfill_overcommit": (FA_RETRACT, {}),
    "group_budget_off_by_one": (ONE_STEP_NO_OVERSAMPLING, {}),
    "update_during_generate": (ONE_STEP, {}),
}
# bugs seeded in upstream's orchestration layer (fixtures/upstream_orchestration_mutants.py):
# the served run runs upstream's RolloutManager, actor group and train actor base, so a bug
# there runs; each named with the checkers a record shows it by (the record has no run_end,
# so a group trained twice shows as a batch of the wrong shape, not as conservation)
ORCHESTRATION_CASES: dict[str, tuple[E2EConfig, Mapping[str, float], frozenset[str]]] = {
    "rm_generate_trains_first_group_twice": (ONE_STEP, {}, frozenset({"trained_batch_shape"})),
    "actor_group_skips_later_weight_updates": (ONE_STEP, {}, frozenset({"batch_single_version"})),
    "train_actor_reports_twice_its_dp_size": (ONE_STEP, {}, frozenset({"run_error:AssertionError"})),
}
# bugs whose run holds the forced window (module docstring): the groups the buffer must hold
FORCED_WINDOW: dict[str, int] = {"consumed_staleness_not_reset": 1, "unused_handler_swapped": 1, "buffer_lifo": 2}
WINDOW_TIMEOUT_S = 120.0
NOT_IN_REAL_TIME: dict[str, str] = {
    "drain_drops_version": "the staleness filter is off, but in these runs no group gets older than the age bound "
    "(s + 1 = 2 versions) before it is trained, so nothing it should have stopped is trained "
    "(measured: 0 violations in the fully-async retract run with the bug)",
    "partly_aborted_group_stored": "fully async never aborts (upstream refuses --pause-generation-mode abort there)",
    "aborted_group_lost_in_worker": "fully async never aborts (upstream refuses --pause-generation-mode abort there)",
    "recycled_newest_first": "needs two groups recycled at once; these runs recycle at most one at a time",
    "update_interval_off_by_one": "a change of schedule only a side-by-side comparison shows (no checker)",
    "rm_ignores_weight_version": "the drain's staleness reference stays at version 1, but in these runs no group "
    "gets older than the age bound before it is trained (measured: 0 violations in one-step and fully-async "
    "retract runs with the bug)",
}


def _activate(mutant: UpstreamMutant, miles_src: str | None) -> None:
    """The upstream tree active and the modules the bug patches imported (``applied``
    patches live modules)."""
    import importlib

    from harness.upstream import source, vray

    path, how = source.find_miles_src(miles_src)
    if path is None:
        raise source.UpstreamUnavailable(how)
    source.activate(path)
    with vray.installed():  # as source.activate imports upstream: its `ray` is the in-process one
        for patch in mutant.patches:
            if "/" in patch.path:
                importlib.import_module(patch.path[:-3].replace("/", "."))


class CaseReport(TypedDict):
    """One seeded bug's recorded run."""

    bug: str
    run: str
    extra_flags: Mapping[str, float]
    error: str | None
    steps_trained: int
    checkers_failed: list[str]
    expected: list[str]
    caught: bool
    caught_as_expected: bool
    lacking: dict[str, list[str]]
    window: dict[str, int] | None  # FORCED_WINDOW runs: steps that held it, steps that timed out waiting
    host: dict[str, object]  # harness.measure.host_load.figures over the run


class CleanReport(TypedDict):
    """One standard run's recording without a bug."""

    run: str
    error: str | None
    steps_trained: int
    checkers: dict[str, int]  # checker -> violations
    lacking: dict[str, list[str]]
    not_for_config: list[str]
    join: dict[str, int]
    events: int
    processes: list[str]
    record_bytes: int
    samples_trained: int


def _mutant(name: str) -> tuple[UpstreamMutant, E2EConfig, Mapping[str, float], frozenset[str]]:
    """The seeded bug, its run, its extra flags and the checkers it is expected to trip."""
    from fixtures.upstream_mutants import UPSTREAM_MUTANTS
    from fixtures.upstream_orchestration_mutants import ORCHESTRATION_MUTANTS

    if name in ORCHESTRATION_CASES:
        base, extra, expected = ORCHESTRATION_CASES[name]
        return next(m.mutant for m in ORCHESTRATION_MUTANTS if m.mutant.name == name), base, extra, expected
    mutant = next(m for m in UPSTREAM_MUTANTS if m.name == name)
    base, extra = REAL_TIME_CASES[name]
    return mutant, base, extra, frozenset(mutant.expected - {"differential"})


def run_case(name: str, *, steps: int = 3, miles_src: str | None = None, work: Path | None = None) -> CaseReport:
    """One seeded bug's recorded run. A run that ends with an error where the clean run
    trains every step is the finding ``run_error:TYPE``."""
    from harness.upstream.patching import applied

    from .served_run import run_recorded

    mutant, base, extra, expected = _mutant(name)
    from harness.measure.host_load import Meter

    cfg = E2EConfig(**{**asdict(base), "steps": steps})
    _activate(mutant, miles_src)
    directory = Path(tempfile.mkdtemp(prefix=f"record-{name}-", dir=work))
    window = {"held": 0, "timed_out": 0} if name in FORCED_WINDOW else None
    run_class = _forced_window_run(window, FORCED_WINDOW[name]) if window is not None else None
    meter = Meter().start()
    with applied(mutant):
        res = run_recorded(cfg, directory, miles_src=miles_src, extra_flags=extra, run_class=run_class)
    host = meter.stop()
    failed = sorted(k for k, v in res.verdict["violations"].items() if v)
    error = res.e2e.error
    if error and not error.startswith("harness_error"):
        failed.append(f"run_error:{error.split(':', 1)[0]}")
    return {
        "bug": name,
        "run": base.name,
        "extra_flags": extra,
        "error": error,
        "steps_trained": res.e2e.steps_trained,
        "checkers_failed": failed,
        "expected": sorted(expected),
        "caught": bool(failed),
        "caught_as_expected": bool(set(failed) & expected),
        "lacking": res.verdict["lacking"],
        "window": window,
        "host": host,
    }


def _forced_window_run(counts: dict[str, int], groups: int = 1) -> type:
    """The recorded run whose training steps hold the forced window (module docstring: the
    next drain closed and ``groups`` groups in the buffer), counting in ``counts`` the steps
    that held it and those that gave up waiting."""
    import asyncio
    import time

    from . import wrappers
    from .served_run import _RecordedRun

    class ForcedWindowRun(_RecordedRun):
        async def train_shard(self, rollout_id: int, data: dict[str, Any]) -> None:
            await super().train_shard(rollout_id, data)
            if rollout_id + 1 >= self.cfg.steps:
                return  # no next drain: the run ends after this step

            def held() -> bool:
                state = wrappers.STATE  # read each time: reset_state replaces it
                queued = state.buffer.queued() if state.buffer is not None else None
                return state.drains_closed >= rollout_id + 2 and (queued or 0) >= groups

            deadline = time.monotonic() + WINDOW_TIMEOUT_S
            while not held() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # the rollout worker runs on its own thread meanwhile
            counts["held" if held() else "timed_out"] += 1

    return ForcedWindowRun


def run_clean(base: E2EConfig, *, steps: int, miles_src: str | None = None) -> CleanReport:
    from .served_run import run_recorded

    directory = Path(tempfile.mkdtemp(prefix=f"record-{base.name}-"))
    res = run_recorded(E2EConfig(**{**asdict(base), "steps": steps}), directory, miles_src=miles_src)
    v = res.verdict
    trained = sum(e.fields.get("samples", 0) for e in res.merged.events if e.kind == "trained")
    return {
        "run": base.name,
        "error": res.e2e.error,
        "steps_trained": res.e2e.steps_trained,
        "checkers": {k: len(x) for k, x in v["violations"].items()},
        "lacking": v["lacking"],
        "not_for_config": v["not_for_config"],
        "join": res.merged.join,
        "events": len(res.merged.events),
        "processes": [p["role"] for p in res.merged.processes],
        "record_bytes": res.merged.bytes_total,
        "samples_trained": trained,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.record.mutant_runs", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write the JSON report here (e.g. results/record/mutant_runs.json)")
    p.add_argument("--miles-src", default=None)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--only", nargs="*", default=None, help="bug names (default: every real-time case)")
    ns = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    clean = [] if ns.only else [run_clean(b, steps=ns.steps, miles_src=ns.miles_src) for b in STANDARD_RUNS]
    for c in clean:
        print(
            f"clean {c['run']}: failed={[k for k, n in c['checkers'].items() if n]} lacking={c['lacking']}", flush=True
        )
    bugs = []
    for name in ns.only or [*REAL_TIME_CASES, *ORCHESTRATION_CASES]:
        row = run_case(name, steps=ns.steps, miles_src=ns.miles_src)
        bugs.append(row)
        print(f"{name}: caught={row['caught']} failed={row['checkers_failed']} expected={row['expected']}", flush=True)
    if ns.out:
        from harness.results.schema import git_info, machine_info

        given = argv if argv is not None else sys.argv[1:]
        doc = {
            "command": "python -m harness.record.mutant_runs " + " ".join(given),
            "git": git_info(),
            "machine": machine_info(),
            "clean_runs": clean,
            "bugs": bugs,
            "not_in_real_time": NOT_IN_REAL_TIME,
        }
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    # a clean run that stopped early has run too little to count as clean
    ran = all(c["error"] is None and c["steps_trained"] == ns.steps for c in clean)
    return 0 if all(r["caught"] for r in bugs) and ran and all(not any(c["checkers"].values()) for c in clean) else 1


if __name__ == "__main__":
    sys.exit(main())
