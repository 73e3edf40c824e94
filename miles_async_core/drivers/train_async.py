"""The async driver (`train_async.py:L22-L128`): one-step-ahead, or fully async when the
rollout function is ``FullyAsyncRolloutFn``.

Loop, for each ``rollout_id``: await the generate launched earlier, launch the next one
*before* training, train, and after iterations with ``(rollout_id + 1) % k == 0`` await
the in-flight generate and only then update the weights. So a weight update never
overlaps a generate call: in one-step mode nothing is generating
during an update; in fully-async mode only the drain has finished and the worker's
live requests are paused with ``--pause-generation-mode``.

Before anything starts it asserts what ``train_async.py:L23-L24`` asserts:
no ``--colocate``, unless the harness extension ``allow_async_colocate`` is on (the seed
manual's colocated fully-async mode), and with ``--use-critic`` one of the off-policy
corrections (``AssertionError``, as upstream).
"""

from __future__ import annotations

import asyncio
from typing import Any

from miles_async_core.drivers.common import RunContext, debug_exit, maybe_save, train_step, update_weights


async def _await_generate(
    ctx: RunContext, task: asyncio.Future[tuple[list[Any], dict[str, Any]]], rollout_id: int
) -> tuple[list[Any], dict[str, Any]]:
    ctx.phase("train", "waiting", True, rollout_id=rollout_id)
    try:
        return await task
    finally:
        ctx.phase("train", "waiting", False, rollout_id=rollout_id)


def check_async_args(args: Any) -> None:
    """What ``train_async.py:L23-L24`` asserts before anything starts: no ``--colocate``
    (unless the harness extension ``allow_async_colocate`` is on), and with ``--use-critic``
    an explicit behaviour-policy correction (``arguments.py:L3591-L3609``)."""
    if args.colocate and not getattr(args, "allow_async_colocate", False):
        raise AssertionError("Colocation is not supported for async training.")
    if args.use_critic and not (args.use_rollout_logprobs or args.use_tis or args.keep_old_actor):
        raise AssertionError(
            "Async PPO training requires an explicit behavior-policy correction: pass one of "
            "--use-rollout-logprobs, --use-tis or --keep-old-actor."
        )


async def train_async(ctx: RunContext) -> list[dict[str, Any]]:
    args = ctx.args
    check_async_args(args)
    k = args.update_weights_interval
    rm = ctx.rollout_manager
    await update_weights(ctx)  # initial update -> version 1 (train_async.py:L50)
    start, num = args.start_rollout_id, args.num_rollout
    next_task: asyncio.Future[tuple[list[Any], dict[str, Any]]] | None = rm.launch(start)
    ctx.pending_generate = next_task
    curr: tuple[list[Any], dict[str, Any]] | None = None
    # A generate launched before a step that raises is left running, as upstream's Ray call
    # (train_async.py:L80); it stays on ctx.pending_generate for the caller.
    for rollout_id in range(start, num):
        if next_task is not None:
            curr = await _await_generate(ctx, next_task, rollout_id)
            ctx.pending_generate = None
        if rollout_id + 1 < num:
            next_task = ctx.pending_generate = rm.launch(rollout_id + 1)
        assert curr is not None  # the first iteration awaited the launch of `start`
        data, metrics = curr
        await train_step(ctx, rollout_id, data, metrics)
        # a due save: model, then data source, while generate(rollout_id + 1) runs (L95-L105)
        await maybe_save(ctx, rollout_id)
        if (rollout_id + 1) % k == 0:  # absolute rollout_id, as upstream
            curr = (await _await_generate(ctx, next_task, rollout_id + 1)) if next_task is not None else None
            next_task = ctx.pending_generate = None
            await update_weights(ctx)
        if debug_exit(ctx, rollout_id):
            break
    return ctx.history
