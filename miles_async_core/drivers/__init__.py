"""Drivers: ``train`` (synchronous) and ``train_async`` (one-step-ahead or fully async).

``make_context`` wires a config, an engine, a trainer and a prompt source into a
``RunContext`` the way Miles' ``arguments.py`` selects the rollout function (an
``observer`` receives the measurement hooks, see ``drivers.common.StepObserver``);
``run`` executes the configured driver.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from miles_async_core.contracts import NullSink
from miles_async_core.data_source import RolloutDataSourceWithBuffer
from miles_async_core.drivers.common import RolloutManager, RunContext
from miles_async_core.drivers.train import train
from miles_async_core.drivers.train_async import train_async
from miles_async_core.fully_async import FullyAsyncRolloutFn
from miles_async_core.rollout import OneStepRollout
from miles_async_core.types import SamplingParams

logger = logging.getLogger(__name__)


def make_context(
    args: Any,
    engine: Any,
    trainer: Any,
    prompt_fn: Callable[..., Any],
    *,
    sampling: SamplingParams,
    reward_fn: Callable[..., Any] | None = None,
    sink: Any = None,
    observer: Any = None,
    buffer_factory: Callable[..., Any] | None = None,
    data_source: Any = None,
    generate_function: Callable[..., Any] | None = None,
) -> RunContext:
    sink = sink or NullSink()
    data_source = data_source or RolloutDataSourceWithBuffer(args.n_samples_per_prompt, prompt_fn, sink=sink)
    rollout_fn: FullyAsyncRolloutFn | OneStepRollout
    if args.fully_async:
        rollout_fn = FullyAsyncRolloutFn(
            args,
            engine,
            data_source,
            sampling=sampling,
            reward_fn=reward_fn,
            buffer_factory=buffer_factory,
            sink=sink,
            generate_function=generate_function,
        )
    else:
        rollout_fn = OneStepRollout(
            args,
            engine,
            data_source,
            sampling=sampling,
            reward_fn=reward_fn,
            sink=sink,
            generate_function=generate_function,
        )
    rm = RolloutManager(rollout_fn, sink=sink)
    return RunContext(
        args=args,
        engine=engine,
        trainer=trainer,
        rollout_manager=rm,
        sink=sink,
        observer=observer,
        data_source=data_source,
    )


async def run(ctx: RunContext) -> list[dict[str, Any]]:
    try:
        return await (train(ctx) if ctx.args.driver == "train" else train_async(ctx))
    finally:
        _report_worker_death(ctx)


def _report_worker_death(ctx: RunContext) -> None:
    """A fully-async worker that died after the last drain is not silent: no later drain
    raises its error, so it is logged and kept as ``ctx.worker_error``."""
    unreported = getattr(ctx.rollout_manager.rollout_fn, "unreported_worker_error", None)
    error = unreported() if unreported is not None else None
    if error is None:
        return
    ctx.worker_error = error
    logger.warning("the fully-async rollout worker died after the last drain: %r", ctx.worker_error)


__all__ = ["RunContext", "make_context", "run", "train", "train_async"]
