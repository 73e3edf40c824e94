"""The property suites' fault schedules on upstream Miles' own code, and what upstream
does wrong under them, as findings with a replayable seed.

A schedule is what the core's property suite draws (``harness.checking.strategies.
run_cases(faults=True)``: a whole-run ``Scenario`` plus a ``FaultSchedule`` with request
failures, injected aborts, abort storms, a trainer failure, a worker crash, a
cancellation or dynamic-filter rejects). ``case_from_seed(seed)`` draws it from an
integer seed (hypothesis' own generator, seeded), so ``seed`` alone replays a finding:

    .venv/bin/python -m harness.upstream.fault_sweep replay 1234

Two changes make a drawn case one upstream runs (``for_upstream``): ``colocate`` is
cleared under ``train_async`` (upstream's ``train_async.py:L23`` refuses colocation, ``async-refusals``)
and ``async_max_retries`` (a core-only cap) is unset.

``runner_run_with_faults`` runs the case on ``harness.upstream.runner`` with the faults
injected as on the core (``harness.sim.faults``: the same engine subclass, engine and
trainer settings; the dynamic filter goes through ``--dynamic-sampling-filter-path``;
cancellation cancels the driver's task). A watchdog bounds each run: ``VTIME_LIMIT_S`` of
virtual time, ``REAL_TIME_LIMIT_S`` of real time.

``findings(outcome)`` is what upstream did wrong, each a ``Finding(category, detail,
mode, message)``:

* ``invariant``: a trace invariant checker (``check_all``, relaxed to the prefix
  checkers when the run ended early) failed;
* ``run_error``: the run raised what no injected fault explains;
* ``hang``: a virtual-time deadlock (``VirtualDeadlock``), the progress watchdog's
  ``hang`` (``harness.sim.watchdog``: virtual time went on with no trace event), or the run
  was still going at the virtual or real time limit;
* ``runaway``: the progress watchdog's ``runaway`` (an event, memory or task budget passed);
* ``orphaned_task``: the driver raised or was cancelled and tasks of the driver's own
  process (group tasks, the fully-async worker, a launched generate) are still running;
  after a normal end only the fully-async worker and its groups may be (upstream's design:
  the worker lives as long as the rollout manager). A call the driver made to a Ray actor
  and left in flight is the driver's (a launched generate); a task an actor started
  itself (the rollout manager's or executor's worker and group tasks, the worker manager's liveness scans, the inference and trainer controllers'
  tickers and watch loops) is that actor's process's, not the driver's: Ray ends a job's
  actors when its driver exits (no actor of Miles' is detached), and upstream stops them
  itself at a normal end (``dispose``, ``shutdown_worker_manager``). Such tasks are listed
  (``actor_tasks``), never an orphan of the driver;
* ``silent_drop``: a group whose generation failed was discarded with no retry and no
  metric (its prompt is gone from the run).

A run the harness itself got wrong is no finding: its row carries ``harness_error``
instead (``_row``), e.g. the runner's ``RunnerAccountingError`` (a group its accounting
declared lost came back, ``harness.upstream.runner``) or ``RunnerSeamError`` (a leaf fake or
seam of the harness raised inside upstream's code, which upstream may have logged as its
own task error), and ``sweep`` exits 2. A case whose driver the tree lacks a seam for
(``harness.upstream.seams``) is not run: its row carries ``refused`` with the seams.
The CLI exits 1 when a finding kind is not in the findings file.

``sweep(seeds)`` runs many and ``summarize`` folds them into the findings file
(``results/upstream/fault_findings.json`` + ``.md``): per kind (category, detail, mode)
the count, the fault kinds it came under and the first seeds. The CLI:

    .venv/bin/python -m harness.upstream.fault_sweep sweep --runs 10000 --jobs 2 --write
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import random
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from miles_async_core import events as ev
from harness.checking.invariants import check_all
from harness.checking.strategies import FAULT_KINDS, RunCase, run_cases
from harness.sim.draws import uniform
from harness.sim.engine import SimEngine
from harness.sim.faults import EXPECTED_ERRORS, FaultSchedule, fault_engine_class
from harness.sim.vtime import VirtualDeadlock
from harness.sim.watchdog import WatchdogTripped
from harness.trace import Event

VTIME_LIMIT_S = 50_000.0  # the longest drawn run takes a few thousand virtual seconds
REAL_TIME_LIMIT_S = 60.0
RESULTS = Path(__file__).resolve().parents[2] / "results" / "upstream"
FINDINGS_FILE = RESULTS / "fault_findings.json"
# the upstream files whose behaviour the findings describe; their hash pins the file
TREE_FILES = (
    "train.py",
    "train_async.py",
    "miles/rollout/fully_async_rollout.py",
    "miles/rollout/fully_async_data_buffer.py",
    "miles/rollout/submission_scheduler.py",
    "miles/rollout/data_source.py",
    "miles/rollout/inference_rollout/inference_rollout_train.py",
    "miles/rollout/inference_rollout/inference_rollout_common.py",
)
# what a task still running at the end is, by its coroutine: the fully-async worker, the
# sample-backfill scheduler's waiter, group tasks (a group and its sample tasks), a
# generate the driver launched (``generate.remote``), the drain's buffer get, an HTTP call
TASK_ROLES = {
    "FullyAsyncRolloutFn._worker_loop": "fully_async_worker",
    "Event.wait": "scheduler_waiter",
    "UpstreamRunner.http_post": "http_request",
    "FullyAsyncRolloutFn._generate_group": "group_tasks",
    "generate_and_rm_group": "group_tasks",
    "generate_and_rm": "group_tasks",
    "RolloutManager._generate": "launched_generate",
    # the driver's call of the rollout manager's actor, and on the
    # controller-executor shape the driver's own task around its calls (train_async.py:L63-L68, L72)
    "RolloutManager.generate": "launched_generate",
    "train.<locals>.prepare_and_generate": "launched_generate",
    "InferenceController.prepare_rollout": "launched_generate",
    "RolloutExecutor.get": "launched_generate",
    # the driver's train and weight-update calls of the train actor (train_async.py:L92, L50)
    "SimTrainActor.train": "train_call",
    "SimTrainActor.update_weights": "weight_update_call",
    "UpstreamRunner.observe_buffer.<locals>.observed_get": "buffer_get",
    "UpstreamRunner.observe_buffer.<locals>.observed_put": "buffer_put",
}
# after a normal end these may still run: upstream's worker lives as long as the rollout manager
AFTER_NORMAL_END = frozenset({"fully_async_worker", "scheduler_waiter", "group_tasks"})


# --------------------------------------------------------------------------- cases

FAULT_KINDS_DRAWN = FAULT_KINDS


def fault_kind(f: FaultSchedule) -> str:
    if f.request_failure_rate:
        return "request_failure"
    if f.injected_abort_rate:
        return "injected_abort"
    if f.abort_storm_times_s:
        return "abort_storm"
    if f.trainer_fail_at_step is not None:
        return "trainer_failure"
    if f.worker_crash_after_requests is not None:
        return "worker_crash"
    if f.cancel_at_s is not None:
        return "cancel"
    if f.dynamic_filter_reject_rate:
        return "dynamic_filter"
    return "none"


def mode(case: RunCase) -> str:
    c = case.scenario.config
    return "sync" if c.driver == "train" else ("fully_async" if c.fully_async else "one_step")


def for_upstream(case: RunCase) -> RunCase:
    """The drawn case as upstream runs it (see the module docstring)."""
    cfg = case.scenario.config
    changes: dict[str, Any] = {"async_max_retries": None}
    if cfg.driver == "train_async":
        changes["colocate"] = False
    return RunCase(dataclasses.replace(case.scenario, config=dataclasses.replace(cfg, **changes)), case.faults)


def _seeded_provider() -> type:
    """Hypothesis' provider without its constant pools: it mixes in constants collected
    from whatever modules are loaded (and caches the first pool it sees), so the same seed
    would draw a different case in a process that has imported more; without them a draw
    depends on the seed only."""
    from hypothesis.internal.conjecture.providers import HypothesisProvider

    class SeedOnlyProvider(HypothesisProvider):
        def _maybe_draw_constant(self, *args: Any, **kwargs: Any) -> None:
            return None

    return SeedOnlyProvider


def case_from_seed(seed: int) -> RunCase:
    """The property suite's fault-schedule strategy, drawn from ``seed`` (deterministic:
    hypothesis' generator on ``random.Random``); a draw that fails an ``assume`` is
    redrawn from a derived seed."""
    # hypothesis' engine internals (pinned with the venv): a ConjectureData on a seeded
    # Random, drawn inside a BuildContext so the strategy's ``assume`` works as in a test
    from hypothesis.control import BuildContext
    from hypothesis.errors import UnsatisfiedAssumption
    from hypothesis.internal.conjecture.data import ConjectureData, StopTest

    strategy = run_cases(faults=True)
    for attempt in range(1000):
        data = ConjectureData(random=random.Random(f"upstream-faults:{seed}:{attempt}"), provider=_seeded_provider())
        try:
            with BuildContext(data, is_final=True, wrapped_test=case_from_seed):
                return for_upstream(data.draw(strategy))
        except (UnsatisfiedAssumption, StopTest):
            continue
    raise RuntimeError(f"seed {seed}: no valid case in 1000 draws")


def case_digest(seed: int) -> str:
    """What ``seed`` draws, hashed: the findings file keeps it beside each example seed, so a
    replay can tell "the strategy now draws something else" from "upstream changed"."""
    return hashlib.sha256(case_from_seed(seed).describe().encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- running


@dataclass
class RunnerOutcome:
    seed: int | None
    case: RunCase
    events: list[Event]
    history: list[dict]
    error: BaseException | None
    live_tasks: list[str]  # the driver's own (harness.upstream.runner: actor_tasks are not in it)
    hang: str | None = None
    wall_s: float = 0.0
    mode: str | None = None  # the driver, where the gate (harness.upstream.gate_run) set it
    actor_tasks: list[str] = field(default_factory=list)  # "Actor: task" still running in a Ray actor

    @property
    def complete(self) -> bool:
        return self.error is None and self.hang is None


class RealTimeLimit(Exception):
    """The run used ``REAL_TIME_LIMIT_S`` of real time (a livelock at one virtual instant)."""


@contextmanager
def _real_time_guard(seconds: float) -> Iterator[None]:
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise RealTimeLimit(f"run still going after {seconds:g} s of real time")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def fault_filter(args: Any, group: Any) -> Any:
    """``--dynamic-sampling-filter-path`` target for ``dynamic_filter_reject_rate``: rejects
    with reason ``fault``, keyed like the core's (``harness.sim.faults``) by group index
    and retry count."""
    from miles.rollout.filter_hub.base_types import DynamicFilterOutput

    from harness.upstream.runner import _current

    run = _current()
    f: FaultSchedule = run.fault_schedule
    first = group[0][0] if isinstance(group[0], list) else group[0]
    m = run.mirrors.get(first.index)
    reject = uniform(f.seed + 5, first.group_index, m.retry_count if m else 0) < f.dynamic_filter_reject_rate
    return DynamicFilterOutput(keep=not reject, reason="fault" if reject else None)


def runner_run_with_faults(
    case: RunCase,
    *,
    seed: int | None = None,
    vtime_limit_s: float = VTIME_LIMIT_S,
    real_time_limit_s: float = REAL_TIME_LIMIT_S,
    set_order: str = "index",
) -> RunnerOutcome:
    """``case`` on upstream's code with its faults injected (the tree must be activated)."""
    faults = case.faults
    faults.check_applies(case.scenario.config)
    sc = dataclasses.replace(
        case.scenario,
        engine=dataclasses.replace(case.scenario.engine, request_failure_rate=faults.request_failure_rate),
        trainer=dataclasses.replace(case.scenario.trainer, fail_at_step=faults.trainer_fail_at_step),
    )

    def hooks(run: Any) -> None:
        run.fault_schedule = faults
        task, loop = asyncio.current_task(), asyncio.get_running_loop()

        def cancel() -> None:
            run._emit(ev.FAULT, what="cancel")
            task.cancel()

        if faults.cancel_at_s is not None:
            loop.call_at(faults.cancel_at_s, cancel)

    t0 = time.perf_counter()
    res, hang = guarded_upstream_run(
        sc,
        vtime_limit_s=vtime_limit_s,
        real_time_limit_s=real_time_limit_s,
        hooks=hooks,
        engine_factory=fault_engine_class(SimEngine, faults),
        set_order=set_order,
        dynamic_filter_path="harness.upstream.fault_sweep.fault_filter" if faults.dynamic_filter_reject_rate else None,
    )
    return RunnerOutcome(
        seed=seed,
        case=case,
        events=res.events,
        history=res.history,
        error=res.error,
        live_tasks=list(res.extra.get("live_tasks", [])),
        actor_tasks=list(res.extra.get("actor_tasks", [])),
        hang=hang,
        wall_s=time.perf_counter() - t0,
    )


def guarded_upstream_run(
    scenario: Any,
    *,
    vtime_limit_s: float = VTIME_LIMIT_S,
    real_time_limit_s: float = REAL_TIME_LIMIT_S,
    hooks: Any = None,
    **runner_kwargs: Any,
) -> tuple[Any, str | None]:
    """``UpstreamRunner(scenario, **runner_kwargs).run()`` under the watchdog: returns the
    ``UpstreamRunResult`` and ``None``, or a description of the hang (virtual-time deadlock,
    virtual or real time limit)."""
    from harness.upstream.runner import UpstreamRunner

    state: dict[str, Any] = {}

    def guarded(run: Any) -> None:
        task, loop = asyncio.current_task(), asyncio.get_running_loop()

        def watchdog() -> None:
            state["hang"] = f"still running at the virtual time limit ({vtime_limit_s:g} s)"
            task.cancel()

        loop.call_at(vtime_limit_s, watchdog)
        if hooks is not None:
            hooks(run)

    with _real_time_guard(real_time_limit_s):
        res = UpstreamRunner(scenario, hooks=guarded, **runner_kwargs).run()
    hang = state.get("hang")
    if isinstance(res.error, WatchdogTripped):  # upstream's run stopped progressing: a finding, with its report
        hang = f"watchdog {res.error}\n{res.error.report}"
    elif isinstance(res.error, VirtualDeadlock):
        hang = f"virtual-time deadlock: {res.error}"
    elif isinstance(res.error, RealTimeLimit):
        hang = str(res.error)
    return res, hang


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class Finding:
    category: str  # invariant | run_error | hang | runaway | orphaned_task | silent_drop
    detail: str
    mode: str  # sync | one_step | fully_async
    message: str = field(default="", compare=False)

    @property
    def kind(self) -> str:
        return f"{self.category}:{self.detail}@{self.mode}"


CATEGORIES = ("invariant", "run_error", "hang", "runaway", "orphaned_task", "silent_drop")


def findings(out: RunnerOutcome) -> list[Finding]:
    m = mode(out.case)
    found: list[Finding] = []
    if out.hang is not None and out.hang.startswith("watchdog runaway"):
        found.append(Finding("runaway", "watchdog", m, out.hang))
    elif out.hang is not None:
        found.append(Finding("hang", out.hang.split(":")[0].split(" (")[0], m, out.hang))
    seen: set[str] = set()
    for v in check_all(out.events, out.case.scenario.config, complete=out.complete):
        if v.invariant not in seen:
            seen.add(v.invariant)
            found.append(Finding("invariant", v.invariant, m, v.message))
    err = out.error
    if out.hang is None and err is not None and not (out.case.faults.may_end_early and _explained(err, out)):
        found.append(Finding("run_error", type(err).__name__, m, repr(err)[:300]))
    ended_normally = out.error is None and out.hang is None
    roles: dict[str, list[str]] = {}
    for t in out.live_tasks:
        role = TASK_ROLES.get(t, t)
        if not (ended_normally and role in AFTER_NORMAL_END):
            roles.setdefault(role, []).append(t)
    for role, names in sorted(roles.items()):
        found.append(
            Finding(
                "orphaned_task",
                role,
                m,
                f"the driver {'returned' if ended_normally else 'ended with ' + type(err).__name__} "
                f"and {len(names)} such tasks still run: {sorted(set(names))}",
            )
        )
    failed = {e["group_index"] for e in out.events if e.kind == ev.GROUP_DONE and not e["ok"]}
    lost = sorted(
        {
            e["group_index"]
            for e in out.events
            if e.kind == ev.DROPPED and e["reason"] == "not_returned" and e["group_index"] in failed
        }
    )
    if lost:
        found.append(
            Finding(
                "silent_drop",
                "failed_group_discarded",
                m,
                f"groups {lost[:8]} failed during generation and were discarded: no retry, no metric",
            )
        )
    return found


def _explained(err: BaseException, out: RunnerOutcome) -> bool:
    """An injected fault ended the run: its own error, or the refactored trainer controller's
    report of it. On the controller-executor shape a train step's error fails the trainer
    cell, and with no cell left the controller raises its own ``All cells failed in this
    training attempt`` (``miles/ray/train/group.py:L259-L267``, ``_make_all_cells_failed_error``:
    ``NonRetryableError``, or ``RuntimeError`` while a cell could recover) without chaining the
    cell's error: it is the injected trainer failure when the trainer took exactly the steps
    before the failing one."""
    if isinstance(err, EXPECTED_ERRORS):
        return True
    fail_at = out.case.faults.trainer_fail_at_step
    return (
        fail_at is not None
        and type(err).__name__ in ("NonRetryableError", "RuntimeError")
        and str(err).startswith("All cells failed")
        and len(out.history) == fail_at
    )


# --------------------------------------------------------------------------- sweeps


@contextmanager
def _quiet_upstream_logs() -> Iterator[None]:
    """Upstream logs every failed group with its traceback, asyncio every orphan's
    exception at teardown; a sweep records findings instead."""
    import logging

    logs = [logging.getLogger(name) for name in ("miles", "asyncio")]
    before = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, before):
            log.setLevel(level)


def run_seed(seed: int, *, keep_log: list[str] | None = None) -> tuple[RunnerOutcome, list[Finding]]:
    """One drawn case on upstream; upstream's log is silenced, or captured into
    ``keep_log`` when given. A member missing on a leaf fake of the harness raises
    ``LeafMemberMissing`` (a harness error, never a finding)."""
    from harness.upstream import source
    from harness.upstream.case_log import captured
    from harness.upstream.judge import check_leaves

    if keep_log is None:
        with _quiet_upstream_logs():
            out = runner_run_with_faults(case_from_seed(seed), seed=seed)
    else:
        with captured() as log:
            out = runner_run_with_faults(case_from_seed(seed), seed=seed)
        keep_log.append(log.getvalue())
    check_leaves(out, source.active())
    return out, findings(out)


def _row(seed: int) -> dict:
    from harness.upstream.seams import SeamMissing

    try:
        out, found = run_seed(seed)
    except SeamMissing as exc:  # the tree lacks a seam this case's driver needs: not run
        c = case_from_seed(seed)
        return {"seed": seed, "mode": mode(c), "fault": fault_kind(c.faults), "refused": exc.seams}
    except Exception as exc:  # the harness' own machinery failed: never folded into upstream findings
        return {"seed": seed, "harness_error": repr(exc)[:500]}
    c = out.case
    injected = sum(1 for e in out.events if e.kind == ev.FAULT)
    rejects = sum(1 for e in out.events if e.kind == ev.PUT_REJECTED and e["reason"] == "dynamic_filter:fault")
    return {
        "seed": seed,
        "mode": mode(c),
        "fault": fault_kind(c.faults),
        "error": type(out.error).__name__ if out.error is not None else None,
        "complete": out.complete,
        "trained": len(out.history),
        "fault_events": injected,
        "filter_rejects": rejects,
        "events": len(out.events),
        "silent_drops": sum(1 for f in found if f.category == "silent_drop"),
        "real_s": round(out.wall_s, 4),
        "findings": [
            {"kind": f.kind, "category": f.category, "detail": f.detail, "mode": f.mode, "message": f.message}
            for f in found
        ],
    }


def sweep(seeds: Iterable[int], *, jobs: int = 1, progress: bool = False) -> list[dict]:
    """One row per seed (see ``_row``); ``jobs`` > 1 forks worker processes."""
    seeds = list(seeds)

    if jobs <= 1:
        rows = []
        for i, s in enumerate(seeds):
            rows.append(_row(s))
            if progress and (i + 1) % 500 == 0:
                print(f"  {i + 1}/{len(seeds)}", file=sys.stderr, flush=True)
        return rows
    import multiprocessing as mp

    with mp.get_context("fork").Pool(jobs) as pool:
        rows = []
        for i, r in enumerate(pool.imap(_row, seeds, chunksize=20)):
            rows.append(r)
            if progress and (i + 1) % 500 == 0:
                print(f"  {i + 1}/{len(seeds)}", file=sys.stderr, flush=True)
        return rows


def tree_digest(tree: Path) -> str:
    h = hashlib.sha256()
    for rel in TREE_FILES:
        f = tree / rel
        h.update(rel.encode() + b"\0" + (f.read_bytes() if f.is_file() else b"(missing)"))
    return h.hexdigest()[:16]


def summarize(
    rows: list[dict], *, tree: Path, seeds: str, seconds: float | None = None, example_seeds: int = 5
) -> dict:
    """The findings file's content: per kind, the count, fault kinds and first seeds."""
    kinds: dict[str, dict] = {}
    by_fault: dict[str, int] = {}
    by_mode: dict[str, int] = {}
    for r in rows:
        if "harness_error" in r or "refused" in r:
            continue
        by_fault[r["fault"]] = by_fault.get(r["fault"], 0) + 1
        by_mode[r["mode"]] = by_mode.get(r["mode"], 0) + 1
        for f in r["findings"]:
            k = kinds.setdefault(
                f["kind"],
                {
                    "category": f["category"],
                    "detail": f["detail"],
                    "mode": f["mode"],
                    "runs": 0,
                    "faults": {},
                    "seeds": [],
                    "case_digests": [],
                    "example": f["message"],
                },
            )
            k["runs"] += 1
            k["faults"][r["fault"]] = k["faults"].get(r["fault"], 0) + 1
            if len(k["seeds"]) < example_seeds:
                k["seeds"].append(r["seed"])
                k["case_digests"].append(case_digest(r["seed"]))
    with_findings = sum(1 for r in rows if r.get("findings"))
    return {
        "upstream_tree": tree.name,
        "tree_digest": tree_digest(tree),
        "tree_files": list(TREE_FILES),
        "seeds": seeds,
        "runs": len(rows),
        "harness_errors": [r for r in rows if "harness_error" in r][:20],
        "refused_runs": sum(1 for r in rows if "refused" in r),
        "runs_with_findings": with_findings,
        "runs_by_fault": dict(sorted(by_fault.items())),
        "runs_by_mode": dict(sorted(by_mode.items())),
        "complete_runs": sum(1 for r in rows if r.get("complete")),
        "real_seconds": None if seconds is None else round(seconds, 1),
        "replay": "python -m harness.upstream.fault_sweep replay SEED",
        "kinds": dict(sorted(kinds.items())),
    }


def format_md(doc: dict) -> str:
    lines = [
        "# Fault schedules on upstream Miles: findings",
        "",
        f"Upstream tree `{doc['upstream_tree']}` (digest `{doc['tree_digest']}` over the files listed in the JSON)"
        + ", its own orchestration over the harness' leaves. "
        + f"Seeds `{doc['seeds']}`: {doc['runs']} runs"
        + (f" in {doc['real_seconds']} s" if doc.get("real_seconds") else "")
        + f", {doc['complete_runs']} complete, {doc['runs_with_findings']} with at least one finding"
        + (
            f", {doc['refused_runs']} not run (the tree lacks a seam their driver needs)"
            if doc.get("refused_runs")
            else ""
        )
        + ".",
        "",
        *(
            [
                f"Harness errors (runs the harness could not host faithfully; no finding is made of them): "
                f"{len(doc['harness_errors'])}{'+' if len(doc['harness_errors']) >= 20 else ''}, the first: seed "
                f"{doc['harness_errors'][0]['seed']}: {doc['harness_errors'][0]['harness_error'][:300]}",
                "",
            ]
            if doc.get("harness_errors")
            else []
        ),
        "Runs by fault kind: " + ", ".join(f"{k} {v}" for k, v in doc["runs_by_fault"].items()) + ".",
        "Runs by mode: " + ", ".join(f"{k} {v}" for k, v in doc["runs_by_mode"].items()) + ".",
        "",
        "Replay one: `.venv/bin/python -m harness.upstream.fault_sweep replay SEED` (prints the case, the outcome, "
        "every finding with its trace).",
        "",
        "| finding | mode | runs | under faults | first seeds | example |",
        "|---|---|---|---|---|---|",
    ]
    for k in doc["kinds"].values():
        ex = k["example"].replace("|", "\\|").replace("\n", " ")[:160]
        lines.append(
            f"| {k['category']}: `{k['detail']}` | {k['mode']} | {k['runs']} | "
            + ", ".join(f"{f} {n}" for f, n in sorted(k["faults"].items()))
            + f" | {', '.join(map(str, k['seeds']))} | {ex} |"
        )
    if not doc["kinds"]:
        lines.append("| (none) | | | | | |")
    lines += ["", "Reading the kinds (upstream code at the pinned tree):", ""] + [f"* {line}" for line in READING]
    if not any(k["category"] in ("invariant", "run_error", "hang", "runaway") for k in doc["kinds"].values()):
        lines.append(
            "* No invariant violation, unexplained error or hang was found: on every schedule upstream's "
            "buffer, drains, versions, pauses and accounting satisfy every applicable checker (relaxed to "
            "the prefix when a fault ends the run)."
        )
    return "\n".join(lines) + "\n"


READING = (
    "`orphaned_task: launched_generate`: `train_async.py:L81` launches generate(N+1) before step N trains (and "
    "`train.py:L99` awaits generate(N), a Ray call); when the step raises or the driver is cancelled, that "
    "generate keeps running in the rollout manager's actor (a Ray call nobody cancels; next-generate-launched-early, "
    "which the core now reproduces).",
    "`orphaned_task: train_call` / `weight_update_call`: the driver cancelled while it awaits "
    "`actor_model.train(...)` or `update_weights()` (`train_async.py:L92`, `train.py:L118`; `update_weights` "
    "after each training step): the train "
    "actor's call keeps running (a Ray call nobody cancels).",
    "Tasks a Ray actor started itself (the rollout manager's fully-async worker, its group tasks, the "
    "sample-backfill waiter, an `/abort_request` post, the drain's buffer get) are that actor's process's: listed "
    "as `actor_tasks`, never an orphan of the driver (Ray ends a job's actors with its driver).",
    "`run_error: TypeError` (sync, one_step, under injected aborts and abort storms): an aborted sample keeps "
    "`reward=None` and reaches the rollout manager's post-processing: the reward normalisation "
    "(`miles/ray/rollout/train_data_conversion.py:L241`, `torch.tensor(shared_rewards)`: 'must be real number, "
    "not NoneType', seed 11) or the zero-std metrics (`miles/ray/rollout/metrics.py:L183`, `round(None, 1)`, "
    "seed 19); the generate call fails and the driver with it. Upstream's finding: the runner runs that "
    "post-processing as upstream wrote it (`rollout_manager.py:L156-L157`).",
    "`silent_drop: failed_group_discarded` (sync, one_step): a group whose request failed is logged and skipped "
    "(`inference_rollout_train.py`, `except Exception: ... continue`): no retry, no metric, its prompt is gone.",
)


def load_known(path: Path = FINDINGS_FILE) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def replay(seed: int, *, verbose: bool = False) -> str:
    """The case, outcome and findings of one seed; with ``verbose`` upstream's captured log too."""
    from harness.checking.invariants import format_violations

    log: list[str] = []
    out, found = run_seed(seed, keep_log=log)
    c = out.case
    lines = [
        f"seed {seed}: {mode(c)}, fault {fault_kind(c.faults)}",
        c.describe(),
        f"error: {out.error!r}  hang: {out.hang}  trained steps: {len(out.history)}  "
        f"live tasks at end: {out.live_tasks}  in actors: {out.actor_tasks}",
    ]
    if not found:
        lines.append("no findings")
    for f in found:
        lines.append(f"FINDING {f.kind}: {f.message}")
    vs = check_all(out.events, c.scenario.config, complete=out.complete)
    if vs:
        lines.append(format_violations(vs))
    text = log[0] if log else ""
    if verbose and text.strip():
        lines += ["upstream's log:", text.rstrip("\n")]
    elif text.strip():
        lines.append(f"upstream's log: {len(text.splitlines())} lines captured (-v prints them)")
    return "\n".join(lines)


def _activate(path: str | None) -> Path:
    from harness.upstream import source

    tree, how = source.find_miles_src(path)
    if tree is None:
        print(how, file=sys.stderr)
        raise SystemExit(2)
    try:
        return source.activate(tree)
    except (source.UpstreamUnavailable, source.SeamMissing) as exc:
        print(f"cannot run upstream Miles at {tree} faithfully: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.upstream.fault_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--miles-src", default=None)
    from harness.upstream import source

    source.add_orchestration_flag(p)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="run seeds START..START+RUNS-1 and summarize the findings")
    s.add_argument("--runs", type=int, default=200)
    s.add_argument("--start", type=int, default=0)
    s.add_argument("--jobs", type=int, default=1)
    s.add_argument(
        "--write", action="store_true", help=f"write {FINDINGS_FILE.relative_to(RESULTS.parents[1])} and its .md"
    )
    s.add_argument(
        "--known",
        type=Path,
        default=FINDINGS_FILE,
        help="the findings file whose kinds are accepted (default: the pinned tree's); a kind not in it exits 1",
    )
    s.add_argument(
        "--out", type=Path, default=None, help="also write OUT.json and OUT.md (e.g. another tree's findings)"
    )
    r = sub.add_parser("replay", help="run one seed and print its case, outcome and findings")
    r.add_argument("seed", type=int)
    r.add_argument("-v", "--verbose", action="store_true", help="print upstream's captured log of the run too")
    a = p.parse_args(argv)
    tree = _activate(a.miles_src)
    if a.cmd == "replay":
        print(replay(a.seed, verbose=a.verbose))
        return 0
    t0 = time.perf_counter()
    rows = sweep(range(a.start, a.start + a.runs), jobs=a.jobs, progress=True)
    doc = summarize(rows, tree=tree, seeds=f"{a.start}..{a.start + a.runs - 1}", seconds=time.perf_counter() - t0)
    known = load_known(a.known)
    new = sorted(set(doc["kinds"]) - set(known.get("kinds", {})))
    print(format_md(doc))
    if new and known:
        print(f"NEW finding kinds (not in {a.known.name}): {new}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        a.out.with_suffix(".md").write_text(format_md(doc))
        print(f"wrote {a.out.with_suffix('.json')} and its .md")
    if a.write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        FINDINGS_FILE.write_text(json.dumps(doc, indent=1) + "\n")
        FINDINGS_FILE.with_suffix(".md").write_text(format_md(doc))
        print(f"wrote {FINDINGS_FILE} and its .md")
    return 2 if doc["harness_errors"] else (1 if new and known else 0)


if __name__ == "__main__":
    sys.exit(main())
