"""Whole driver runs as hypothesis strategies, for the property suites and the mutant zoo.

``run_cases(faults=...)`` draws a ``RunCase``: a ``Scenario`` (an ``AsyncConfig`` valid
under the ``manual`` rule profile, simulated engine and trainer settings, a response
length distribution) and a ``FaultSchedule`` with at most one kind of fault.
``run_case(case, **variant)`` runs it with ``run_with_faults``; ``violations(outcome)``
is ``check_all`` over the trace (relaxed to the prefix checkers when the run ended
early), plus a ``run_error`` violation when the run failed in a way no fault explains.

Every run is small (B <= 8, n <= 4, 3-8 rollouts) so an example costs milliseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, assume, settings
from hypothesis.errors import InvalidArgument
from hypothesis import strategies as st

from miles_async_core import rules
from miles_async_core.config import AsyncConfig
from harness.sim.faults import FaultSchedule, RunOutcome, run_with_faults
from harness.checking.invariants import Violation, check_all
from harness.sim.scenario import Scenario
from harness.sim.engine import LengthDist, SimEngine, SimEngineConfig
from harness.sim.trainer import SimTrainerConfig


@dataclass(frozen=True)
class RunCase:
    scenario: Scenario
    faults: FaultSchedule

    def describe(self) -> str:
        c = self.scenario.config
        d = {k: v for k, v in c.to_dict().items() if v != getattr(AsyncConfig(), k)}
        return (
            f"config={d} engine={self.scenario.engine} trainer={self.scenario.trainer} "
            f"max_new_tokens={self.scenario.max_new_tokens} faults={self.faults}"
        )


@st.composite
def configs(draw: st.DrawFn, *, fully_async: bool | None = None, driver: str | None = None) -> AsyncConfig:
    fa = draw(st.booleans()) if fully_async is None else fully_async
    drv = "train_async" if fa else (driver or draw(st.sampled_from(["train_async", "train"])))
    b = draw(st.integers(1, 8))
    n = draw(st.integers(1, 4))
    mode = draw(st.sampled_from(["retract", "in_place"] + ([] if fa else ["abort"])))
    backend = draw(st.sampled_from(["megatron", "megatron", "fsdp"]))
    may_colocate = drv == "train" or (fa and mode == "retract" and backend == "megatron")
    cfg = AsyncConfig(
        driver=drv,
        fully_async=fa,
        rollout_batch_size=b,
        n_samples_per_prompt=n,
        update_weights_interval=draw(st.integers(1, 4)),
        max_weight_staleness=draw(st.one_of(st.none(), st.integers(0, 3))),
        async_unused_samples_handler=draw(st.sampled_from(["drop", "retry"])),
        async_max_concurrent_samples=draw(st.one_of(st.none(), st.integers(n, 3 * n))),
        pause_generation_mode=mode,
        train_backend=backend,
        colocate=(colocate := draw(st.booleans()) if may_colocate else False),
        allow_async_colocate=colocate and drv == "train_async",  # Miles' manual's mode, an extension
        rollout_submission_granularity=draw(st.sampled_from([None, "group", "sample"])),
        over_sampling_batch_size=None if fa else draw(st.one_of(st.none(), st.integers(b, 2 * b))),
        async_data_buffer_capacity_factor=draw(st.sampled_from([1.0, 1.5, 2.0, 3.0])),
        async_max_retries=draw(st.one_of(st.none(), st.integers(0, 2))),
        num_rollout=draw(st.integers(3, 8)),
        seed=draw(st.integers(0, 1000)),
    )
    assume(not rules.errors(rules.validate(cfg, "manual")))
    return cfg


@st.composite
def length_dists(draw: st.DrawFn) -> LengthDist:
    kind = draw(st.sampled_from(["lognormal", "uniform", "fixed"]))
    low = draw(st.integers(1, 16))
    return LengthDist(
        kind=kind,
        median=float(draw(st.integers(2, 64))),
        sigma=draw(st.sampled_from([0.2, 0.8, 1.5])),
        low=low,
        high=draw(st.integers(low, 96)),
    )


def engines() -> st.SearchStrategy[SimEngineConfig]:
    return st.builds(
        SimEngineConfig,
        max_running=st.sampled_from([2, 8, 1024]),
        decode_base_s=st.sampled_from([0.005, 0.02, 0.05]),
        decode_per_seq_s=st.sampled_from([0.0, 0.0002, 0.002]),
        prompt_tokens=st.integers(1, 64),
        response_length=length_dists(),
        seed=st.integers(0, 1000),
    )


def trainers() -> st.SearchStrategy[SimTrainerConfig]:
    return st.builds(
        SimTrainerConfig, step_base_s=st.sampled_from([0.02, 0.3, 1.0, 3.0]), per_token_s=st.sampled_from([0.0, 0.001])
    )


FAULT_KINDS = (
    "request_failure",
    "injected_abort",
    "abort_storm",
    "trainer_failure",
    "worker_crash",
    "cancel",
    "dynamic_filter",
)


@st.composite
def fault_schedules(draw: st.DrawFn, config: AsyncConfig, kinds: tuple[str, ...] = FAULT_KINDS) -> FaultSchedule:
    allowed = [k for k in kinds if config.fully_async or k not in ("worker_crash", "dynamic_filter")]
    kind = draw(st.sampled_from(["none", *allowed]))
    seed = draw(st.integers(0, 1000))
    times = st.floats(0.01, 6.0, allow_nan=False).map(lambda t: round(t, 3))
    if kind == "request_failure":
        return FaultSchedule(request_failure_rate=draw(st.sampled_from([0.01, 0.05, 0.2])), seed=seed)
    if kind == "injected_abort":
        return FaultSchedule(injected_abort_rate=draw(st.sampled_from([0.05, 0.2, 0.4])), seed=seed)
    if kind == "abort_storm":
        return FaultSchedule(
            abort_storm_times_s=tuple(sorted(draw(st.lists(times, min_size=1, max_size=4)))), seed=seed
        )
    if kind == "trainer_failure":
        return FaultSchedule(trainer_fail_at_step=draw(st.integers(0, config.num_rollout - 1)), seed=seed)
    if kind == "worker_crash":
        return FaultSchedule(worker_crash_after_requests=draw(st.integers(1, 80)), seed=seed)
    if kind == "cancel":
        return FaultSchedule(cancel_at_s=draw(times), seed=seed)
    if kind == "dynamic_filter":
        return FaultSchedule(dynamic_filter_reject_rate=draw(st.sampled_from([0.1, 0.3])), seed=seed)
    return FaultSchedule(seed=seed)


@st.composite
def run_cases(
    draw: st.DrawFn,
    *,
    faults: bool | tuple[str, ...] = False,
    fully_async: bool | None = None,
    driver: str | None = None,
) -> RunCase:
    cfg = draw(configs(fully_async=fully_async, driver=driver))
    if faults:
        schedule = draw(fault_schedules(cfg, faults if isinstance(faults, tuple) else FAULT_KINDS))
    else:
        schedule = FaultSchedule()
    scenario = Scenario(
        name="property",
        config=cfg,
        engine=draw(engines()),
        trainer=draw(trainers()),
        max_new_tokens=draw(st.integers(4, 96)),
    )
    return RunCase(scenario, schedule)


def run_case(case: RunCase, *, engine_cls: type = SimEngine, **variant: type) -> RunOutcome:
    return run_with_faults(case.scenario, case.faults, engine_cls=engine_cls, **variant)


def violations(outcome: RunOutcome, case: RunCase) -> list[Violation]:
    out = check_all(outcome.events, outcome.config, complete=outcome.complete)
    if outcome.error is not None and (not outcome.clean or not case.faults.may_end_early):
        out.append(
            Violation(invariant="run_error", message=f"run failed: {outcome.error!r}", events=outcome.events[-10:])
        )
    return out


def property_settings(max_examples: int) -> settings:
    """Settings for a whole-run property: the profile picked by ``HYPOTHESIS_PROFILE`` (the
    plugin registers ``miles-harness-dev``/``-ci``/``-nightly``) with ``max_examples`` scaled by its
    budget relative to hypothesis' default 100; if that profile is not registered, a
    ``ci``-like one (derandomized, no deadline, ``print_blob``)."""
    name = os.environ.get("HYPOTHESIS_PROFILE")
    try:
        base = settings.get_profile(name) if name else settings()  # settings() is the loaded profile
    except InvalidArgument:
        base = settings(derandomize=True, database=None, print_blob=True)
    scale = max(0.1, base.max_examples / 100)
    return settings(
        base,
        max_examples=max(1, int(max_examples * scale)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
