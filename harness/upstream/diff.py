"""Core versus upstream, same scenario and seed: what each run observably did, and the
first place they part.

``run_case(case)`` runs ``case`` on the core (``harness.sim.run_scenario``) and on upstream's
code (``harness.upstream.runner``), both on ``SimEngine``/``SimTrainer`` in virtual time,
and returns a ``DiffReport``: what each run observably did, aspect by aspect
(``harness.upstream.observables``: weight versions read, updates, trained batches, ages,
``get_samples`` calls, recycles, pauses, metrics, the end), and the first divergence, the
earliest differing item over all aspects (by virtual time), printed with the items around
it on both sides. ``core_run`` / ``upstream_run`` run a case on one side alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from miles_async_core.config import AsyncConfig
from miles_async_core.types import DataBufferConstructorInput
from harness.sim.engine import SimEngine, SimEngineConfig
from harness.sim.faults import FaultSchedule, fault_engine_class
from harness.sim.scenario import Scenario
from harness.sim.run_scenario import simulate
from harness.sim.trainer import SimTrainerConfig
from harness.upstream.observables import ASPECTS, first_divergence, observables


@dataclass(frozen=True)
class DiffCase:
    """One scenario of the matrix. ``known`` names the divergence (by its name in
    ``docs/upstream.md``) the case is expected to show, with the upstream code that decides it; ``None`` = identical."""

    name: str
    config: dict[str, Any]
    engine: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 96
    dynamic_filter: str | None = None  # a name in harness.upstream.filters.FORMS
    generate_function: str | None = None  # a name in harness.upstream.generate_fns.FORMS (nested groups)
    faults: FaultSchedule | None = None
    known: str | None = None
    # upstream refuses the case at start-up by design: the refusal is what it checks (the
    # gate reads the same refusal on both trees as unchanged, not as a case neither started)
    refused: bool = False

    def scenario(self) -> Scenario:
        cfg = AsyncConfig(
            **{"rollout_batch_size": 4, "n_samples_per_prompt": 2, "num_rollout": 5, "seed": 3, **self.config}
        )
        eng = SimEngineConfig(**{"seed": 3, **self.engine})
        if self.faults is not None:
            eng = dataclasses.replace(eng, request_failure_rate=self.faults.request_failure_rate)
        tr = SimTrainerConfig(**{"step_base_s": 2.0, **self.trainer})
        if self.faults is not None and self.faults.trainer_fail_at_step is not None:
            tr = dataclasses.replace(tr, fail_at_step=self.faults.trainer_fail_at_step)
        return Scenario(name=self.name, config=cfg, engine=eng, trainer=tr, max_new_tokens=self.max_new_tokens)


@dataclass
class DiffReport:
    case: DiffCase
    core: dict[str, list]
    upstream: dict[str, list]
    first: tuple[str, int] | None  # (aspect, position) of the first divergence
    core_result: Any = field(default=None, repr=False)
    upstream_result: Any = field(default=None, repr=False)

    @property
    def identical(self) -> bool:
        return self.first is None

    def format(self, context: int = 2) -> str:
        if self.first is None:
            n = {a: len(self.core[a]) for a in ASPECTS}
            return f"{self.case.name}: identical ({', '.join(f'{a} {k}' for a, k in n.items())})"
        aspect, i = self.first
        lo = max(0, i - context)

        def show(items: list) -> str:
            rows = []
            for j in range(lo, min(len(items), i + context + 1)):
                t, v = items[j]
                rows.append(f"  {'>' if j == i else ' '} [{j}] t={t:9.3f}  {v}")
            if i >= len(items):
                rows.append(f"  > [{i}] (none: this side has only {len(items)} items)")
            return "\n".join(rows)

        return (
            f"{self.case.name}: first divergence in {aspect!r} at item {i}"
            + (f" (known: {self.case.known})" if self.case.known else "")
            + f"\ncore:\n{show(self.core[aspect])}\nupstream:\n{show(self.upstream[aspect])}"
        )


def core_run(case: DiffCase, sc: Scenario) -> Any:
    from harness.upstream import filters

    fn = filters.FORMS[case.dynamic_filter] if case.dynamic_filter else None
    engine = fault_engine_class(SimEngine, case.faults) if case.faults is not None else SimEngine

    class _Args:
        def __init__(self, cfg: AsyncConfig) -> None:
            self._cfg = cfg
            self.dynamic_sampling_filter = fn

        def __getattr__(self, name: str) -> Any:
            return getattr(self._cfg, name)

    def buffer_factory(ci: DataBufferConstructorInput) -> Any:
        from miles_async_core.buffer import DefaultDataBuffer

        return DefaultDataBuffer(
            DataBufferConstructorInput(_Args(sc.config), ci.unused_handler_fn), sink=holder["ctx"].sink
        )

    holder: dict[str, Any] = {}

    def hooks(ctx: Any) -> None:
        holder["ctx"] = ctx
        if fn is not None and not sc.config.fully_async:
            ctx.rollout_manager.rollout_fn.dynamic_filter = fn
        if case.generate_function:
            from harness.upstream.generate_fns import FORMS

            ctx.rollout_manager.rollout_fn.generate_function = FORMS[case.generate_function][0]

    return simulate(sc, buffer_factory=buffer_factory, engine_factory=engine, hooks=hooks)


def upstream_run(case: DiffCase, sc: Scenario, *, set_order: str = "index") -> Any:
    from harness.upstream.runner import run_upstream

    engine = fault_engine_class(SimEngine, case.faults) if case.faults is not None else SimEngine
    path = f"harness.upstream.filters.{case.dynamic_filter}" if case.dynamic_filter else None
    gen = None
    if case.generate_function:
        from harness.upstream.generate_fns import FORMS

        gen = FORMS[case.generate_function][1]  # upstream loads it: --custom-generate-function-path
    return run_upstream(
        sc,
        engine_factory=engine,
        dynamic_filter_path=path,
        generate_function_path=gen,
        set_order=set_order,
    )


def run_case(case: DiffCase, *, set_order: str = "index") -> DiffReport:
    """Both runs of ``case`` (the upstream tree must be activated first). ``set_order``:
    how the runner iterates upstream's ``done`` sets (divergence ``done-set-order``): ``index`` (the core's order) or
    ``reverse``."""
    sc = case.scenario()
    core = core_run(case, sc)
    up = upstream_run(case, sc, set_order=set_order)
    a = observables(core.events, core.history, core.wall_s, core.error)
    b = observables(up.events, up.history, up.wall_s, up.error)
    return DiffReport(case=case, core=a, upstream=b, first=first_divergence(a, b), core_result=core, upstream_result=up)


def _c(name: str, known: str | None = None, **kw: Any) -> DiffCase:
    return DiffCase(name=name, known=known, **kw)


def matrix() -> list[DiffCase]:
    """The scenario matrix: every case runs core and upstream side by side."""
    G, S = {"rollout_submission_granularity": "group"}, {"rollout_submission_granularity": "sample"}
    FA = {"fully_async": True}
    cases = [
        _c("sync", config={"driver": "train"}),
        _c("sync-start2", config={"driver": "train", "start_rollout_id": 2, "num_rollout": 6}),
        _c("sync-over-sampling", config={"driver": "train", "over_sampling_batch_size": 6}),
    ]
    for k in (1, 2, 3, 4):
        cases.append(_c(f"one-step-k{k}", config={"update_weights_interval": k, "num_rollout": 6}))
    cases += [
        _c("one-step-k2-start1", config={"update_weights_interval": 2, "start_rollout_id": 1, "num_rollout": 6}),
        _c("one-step-k3-start2", config={"update_weights_interval": 3, "start_rollout_id": 2, "num_rollout": 7}),
        _c("one-step-over-sampling", config={"over_sampling_batch_size": 6}),
        _c("one-step-sample-granularity", config={**S}),
        _c("one-step-filter-reason", config={}, dynamic_filter="with_reason"),
        _c("one-step-filter-bool", config={}, dynamic_filter="bare_bool"),
        _c("one-step-filter-none", config={}, dynamic_filter="none_rejects"),
        _c("one-step-fsdp", config={"train_backend": "fsdp"}),
        # partial-rollout-handback: --partial-rollout hands the groups pending at the end of a rollout back to the
        # data source; the next rollout resumes them (inference_rollout_train.py:L40-L53,
        # inference_rollout_common.py:L225)
        _c("one-step-partial-rollout", config={"partial_rollout": True, "over_sampling_batch_size": 6}),
        _c(
            "one-step-partial-rollout-k2",
            config={
                "partial_rollout": True,
                "over_sampling_batch_size": 6,
                "update_weights_interval": 2,
                "num_rollout": 6,
            },
        ),
        _c("sync-partial-rollout", config={"driver": "train", "partial_rollout": True, "over_sampling_batch_size": 6}),
    ]
    for mode in ("retract", "in_place"):
        for gran, gname in ((G, "group"), (S, "sample")):
            cases.append(_c(f"fa-{mode}-{gname}", config={**FA, "pause_generation_mode": mode, **gran}))
    cases += [
        _c("fa-group-staleness0-drop", config={**FA, **G, "max_weight_staleness": 0}),
        _c(
            "fa-group-staleness0-retry",
            config={**FA, **G, "max_weight_staleness": 0, "async_unused_samples_handler": "retry"},
        ),
        _c(
            "fa-group-staleness1-retry",
            config={**FA, **G, "max_weight_staleness": 1, "async_unused_samples_handler": "retry"},
        ),
        _c(
            "fa-sample-staleness1-retry",
            config={**FA, **S, "max_weight_staleness": 1, "async_unused_samples_handler": "retry"},
        ),
        _c("fa-group-cap-concurrency", config={**FA, **G, "async_max_concurrent_samples": 4}),
        _c("fa-sample-cap-concurrency", config={**FA, **S, "async_max_concurrent_samples": 4}),
        _c(
            "fa-sample-small-buffer-retry",
            config={
                **FA,
                **S,
                "async_data_buffer_capacity_factor": 0.5,
                "max_weight_staleness": 0,
                "async_unused_samples_handler": "retry",
            },
        ),
        _c("fa-sample-fast-trainer", config={**FA, **S}, trainer={"step_base_s": 0.2}),
        _c("fa-group-small-buffer", config={**FA, **G, "async_data_buffer_capacity_factor": 0.5}),
        _c("fa-group-k2", config={**FA, **G, "update_weights_interval": 2, "num_rollout": 6}),
        _c("fa-group-start1", config={**FA, **G, "start_rollout_id": 1, "num_rollout": 6}),
        _c("fa-group-filter-reason", config={**FA, **G}, dynamic_filter="with_reason"),
        _c("fa-group-filter-bool", config={**FA, **G}, dynamic_filter="bare_bool"),
        _c("fa-group-filter-none", config={**FA, **G}, dynamic_filter="none_rejects"),
        _c("fa-group-n1", config={**FA, **G, "n_samples_per_prompt": 1, "rollout_batch_size": 6}),
        _c("fa-group-fast-trainer", config={**FA, **G}, trainer={"step_base_s": 0.2}),
        _c(
            "fa-group-abort-storm-retry",
            config={**FA, **G, "async_unused_samples_handler": "retry"},
            faults=FaultSchedule(abort_storm_times_s=(1.0, 4.5), seed=1),
        ),
        _c("fa-group-injected-aborts-drop", config={**FA, **G}, faults=FaultSchedule(injected_abort_rate=0.2, seed=2)),
        _c("fa-group-trainer-fails", config={**FA, **G}, faults=FaultSchedule(trainer_fail_at_step=2)),
        _c("one-step-trainer-fails", config={}, faults=FaultSchedule(trainer_fail_at_step=2)),
        # orphaned-group-tasks: the worker dies on a failed request after the last drain; upstream leaves its
        # sibling group tasks running (fully_async_rollout.py:L128-L136), so they are still
        # generating at the last weight update's pause
        _c(
            "fa-group-request-fails",
            config={**FA, **G},
            engine={"seed": 11},
            faults=FaultSchedule(request_failure_rate=0.03, seed=1),
        ),
        # same-wakeup-failure: a group whose request fails ends in the loop step the waiter resumes in, one
        # after a finished group: upstream's asyncio.wait collects both (f.done() on resume),
        # so the fully-async worker dies before it puts (fully_async_rollout.py:L134-L136) and
        # one-step logs and skips the failed group (inference_rollout_train.py:L117-L121)
        _c(
            "fa-group-request-fails-with-finish",
            config={**FA, **G},
            faults=FaultSchedule(request_failure_rate=0.025, seed=1),
        ),
        _c(
            "one-step-request-fails-with-finish",
            config={"over_sampling_batch_size": 8},
            faults=FaultSchedule(request_failure_rate=0.15, seed=1),
        ),
        # failure-at-abort: an over-sampled group still pending at the end of a rollout fails during the
        # abort; upstream's as_completed_async loop (inference_rollout_train.py:L40) raises it
        _c(
            "one-step-request-fails-at-abort",
            config={"over_sampling_batch_size": 6},
            faults=FaultSchedule(request_failure_rate=0.15, seed=1),
        ),
        # async-refusals: train_async.py:L23-L24 refuses these before anything runs
        _c("one-step-colocate", config={"colocate": True}, refused=True),
        _c("fa-colocate", config={**FA, **G, "colocate": True}, refused=True),
        _c("one-step-critic-no-correction", config={"use_critic": True}, refused=True),
        _c("fa-critic-no-correction", config={**FA, **G, "use_critic": True}, refused=True),
        # nested-groups: A generate function (--custom-generate-function-path) returns a
        # list of samples per prompt sample (harness.upstream.generate_fns.multi_sample: 1-3
        # turns), so a group is n trajectories: len(group) == n at the top level
        # (fully_async_rollout.py:L171, inference_rollout_train.py:L138), flattened one
        # level by the buffer (fully_async_data_buffer.py:L28-L43)
        _c("fa-group-nested", config={**FA, **G}, generate_function="multi_sample"),
        _c("fa-sample-nested", config={**FA, **S}, generate_function="multi_sample"),
        _c(
            "fa-group-nested-staleness1-retry",
            config={**FA, **G, "max_weight_staleness": 1, "async_unused_samples_handler": "retry"},
            generate_function="multi_sample",
        ),
        _c(
            "fa-group-nested-abort-storm-retry",
            config={**FA, **G, "async_unused_samples_handler": "retry"},
            faults=FaultSchedule(abort_storm_times_s=(1.0, 4.5), seed=1),
            generate_function="multi_sample",
        ),
        _c(
            "fa-group-nested-filter-reason",
            config={**FA, **G},
            dynamic_filter="with_reason",
            generate_function="multi_sample",
        ),
        _c("one-step-nested", config={}, generate_function="multi_sample"),
        _c("one-step-nested-over-sampling", config={"over_sampling_batch_size": 6}, generate_function="multi_sample"),
        _c("sync-nested", config={"driver": "train"}, generate_function="multi_sample"),
    ]
    return cases + pairwise_cases()


# Pairwise cases: for each driver, every flag that driver's upstream code reads (or the
# core's weight updater, which both sides share, reads) with its values; the cases cover
# every pair of values of two flags at least once (greedy, deterministic), leaving out
# combinations the miles profile refuses (``miles_async_core.rules``). ``dynamic_filter``
# and ``generate_function`` are the case's hooks, not config fields.
PAIRWISE_FLAGS: dict[str, dict[str, list]] = {
    "sync": {
        "update_weights_interval": [1, 2],  # train.py does not read it: both sides must ignore it
        "rollout_submission_granularity": [None, "sample"],
        "over_sampling_batch_size": [None, 6],
        "partial_rollout": [False, True],
        "start_rollout_id": [0, 2],
        "n_samples_per_prompt": [2, 1],
        "train_backend": ["megatron", "fsdp"],
        "pause_generation_mode": ["retract", "in_place"],
        "dynamic_filter": [None, "with_reason"],
    },
    "one-step": {
        "update_weights_interval": [1, 2, 3],
        "rollout_submission_granularity": [None, "sample"],
        "over_sampling_batch_size": [None, 6],
        "partial_rollout": [False, True],
        "start_rollout_id": [0, 1],
        "n_samples_per_prompt": [2, 1],
        "train_backend": ["megatron", "fsdp"],
        "pause_generation_mode": ["retract", "in_place"],
        "dynamic_filter": [None, "with_reason"],
    },
    "fully-async": {
        "update_weights_interval": [1, 2],
        "rollout_submission_granularity": ["group", "sample"],
        "max_weight_staleness": [None, 0, 1],
        "async_unused_samples_handler": ["drop", "retry"],
        "async_max_concurrent_samples": [None, 4],
        "async_data_buffer_capacity_factor": [2.0, 0.5],
        "pause_generation_mode": ["retract", "in_place"],
        "start_rollout_id": [0, 1],
        "n_samples_per_prompt": [2, 1],
        "train_backend": ["megatron", "fsdp"],
        "dynamic_filter": [None, "with_reason"],
    },
}
DRIVER_BASE = {"sync": {"driver": "train"}, "one-step": {}, "fully-async": {"fully_async": True}}
HOOKS = ("dynamic_filter", "generate_function")


def _valid(driver: str, row: dict) -> bool:
    from miles_async_core.rules import PINNED_MILES_COMMIT, validate

    cfg = AsyncConfig(
        **{
            "rollout_batch_size": 4,
            "n_samples_per_prompt": 2,
            "num_rollout": 5,
            "seed": 3,
            **DRIVER_BASE[driver],
            **{k: v for k, v in row.items() if k not in HOOKS},
        }
    )
    return not [v for v in validate(cfg, f"miles-{PINNED_MILES_COMMIT}") if v.severity == "error"]


def pairwise_rows(driver: str) -> list[dict]:
    """Flag settings for ``driver`` covering every pair of values of two flags of
    ``PAIRWISE_FLAGS[driver]`` (the pairs no valid setting has are left out)."""
    flags = PAIRWISE_FLAGS[driver]
    names = list(flags)

    def pair(a: str, x: Any, b: str, y: Any) -> tuple:
        return ((a, x), (b, y)) if names.index(a) < names.index(b) else ((b, y), (a, x))

    todo = [pair(a, x, b, y) for i, a in enumerate(names) for b in names[i + 1 :] for x in flags[a] for y in flags[b]]
    uncovered = set(todo)
    rows: list[dict] = []
    while uncovered:
        (a, x), (b, y) = next(p for p in todo if p in uncovered)
        row = {a: x, b: y}
        for n in names:
            if n not in row:
                row[n] = max(
                    flags[n],
                    key=lambda v: (sum(pair(m, w, n, v) in uncovered for m, w in row.items()), -flags[n].index(v)),
                )
        row = {n: row[n] for n in names}
        if not _valid(driver, row):  # this completion is refused: the pair with every other flag at its default
            row = {**{n: vs[0] for n, vs in flags.items()}, a: x, b: y}
            if not _valid(driver, row):
                uncovered.discard(pair(a, x, b, y))  # the profile refuses the pair itself
                continue
        uncovered -= {pair(m, row[m], n, row[n]) for i, m in enumerate(names) for n in names[i + 1 :]}
        rows.append(row)
    return rows


def pairwise_cases() -> list[DiffCase]:
    prefix = {"sync": "sync", "one-step": "one-step", "fully-async": "fa"}
    out = []
    for driver in PAIRWISE_FLAGS:
        defaults = {n: vs[0] for n, vs in PAIRWISE_FLAGS[driver].items()}
        rows = [r for r in pairwise_rows(driver) if r != defaults]  # the plain case is in the matrix already
        for i, row in enumerate(rows):
            config = {**DRIVER_BASE[driver], **{k: v for k, v in row.items() if k not in HOOKS}}
            out.append(
                _c(f"{prefix[driver]}-pairwise-{i:02d}", config=config, dynamic_filter=row.get("dynamic_filter"))
            )
    return out


def extension_cases() -> list[DiffCase]:
    """The deliberate harness extensions (``miles_async_core.config.HARNESS_EXTENSIONS`` and
    named options), each switched on in a case that then parts from upstream by design
    (``known`` = ``EXT <name>: ...``). Each is the matrix case named by its prefix with one
    extension set; that matrix case, with the extension off (the default), is identical."""
    return [
        _c(
            "fa-group-staleness0-retry+max-retries0",
            config={
                "fully_async": True,
                "rollout_submission_granularity": "group",
                "max_weight_staleness": 0,
                "async_unused_samples_handler": "retry",
                "async_max_retries": 0,
            },
            known="EXT async_max_retries: a stale group past the retry cap is dropped, upstream recycles it forever",
        ),
        _c(
            "fa-colocate+allow-async-colocate",
            config={
                "fully_async": True,
                "rollout_submission_granularity": "group",
                "colocate": True,
                "allow_async_colocate": True,
            },
            # upstream: train_async.py:L23
            known="EXT allow_async_colocate: Miles' manual's colocated fully-async mode runs; upstream's "
            "train_async.py refuses --colocate",
        ),
        _c(
            "fa-group-request-fails+cancel-orphaned-tasks",
            config={"fully_async": True, "rollout_submission_granularity": "group", "cancel_orphaned_tasks": True},
            engine={"seed": 11},
            faults=FaultSchedule(request_failure_rate=0.03, seed=1),
            # upstream: fully_async_rollout.py:L128-L136
            known="EXT cancel_orphaned_tasks: a dead fully-async worker's sibling group tasks are cancelled; "
            "upstream's fully_async_rollout.py leaves them running",
        ),
    ]


def format_summary(reports: list[DiffReport]) -> str:
    rows = []
    for r in reports:
        status = (
            "identical"
            if r.identical
            else (f"diverges ({r.case.known.split(':')[0]})" if r.case.known else "DIVERGES (unexplained)")
        )
        rows.append(f"{r.case.name:<36} {status}" + ("" if r.identical else f"  first: {r.first[0]}[{r.first[1]}]"))
    return "\n".join(rows)


def case_named(name: str) -> DiffCase:
    """A case of the matrix or of ``extension_cases``."""
    cases = matrix() + extension_cases()
    for c in cases:
        if c.name == name:
            return c
    raise KeyError(f"no case {name!r} in the matrix; cases: {', '.join(c.name for c in cases)}")


__all__ = [
    "ASPECTS",
    "PAIRWISE_FLAGS",
    "case_named",
    "core_run",
    "DiffCase",
    "DiffReport",
    "extension_cases",
    "matrix",
    "observables",
    "pairwise_cases",
    "pairwise_rows",
    "run_case",
    "upstream_run",
    "format_summary",
]
