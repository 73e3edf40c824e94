"""Upstream's driver module (``train_async.py`` / ``train.py``) with its Ray names rebound
to in-process objects, so the driver loop runs as upstream wrote it in one process.

``rebind_ray_names(mod, generate=..., update_weights=..., train=...)`` replaces the
placement groups, the rollout manager actor, the training actors, the object store,
tracking, logging and control-server hooks. ``generate(rollout_id)`` is what
``rollout_manager.generate.remote(rollout_id)`` returns: it must start the work at once
and return an awaitable, as a Ray call does. Used by the virtual-time runner
(``harness.upstream.runner``) and by the served end-to-end run (``harness.serve.upstream_e2e``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from harness.upstream.stand_ins import StandInCalled


class _Remote:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def remote(self, *a: Any, **k: Any) -> Any:
        return self._fn(*a, **k)


async def _noop(*a: Any, **k: Any) -> None:
    return None


def _noop_remote(*a: Any, **k: Any) -> Any:
    return asyncio.ensure_future(_noop())


class _EvalDispatcher:
    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    async def dispatch(self, *a: Any, **k: Any) -> None:
        raise StandInCalled("eval is not hosted (the harness sets no --eval-interval)", seam="train_async.py")

    drain = staticmethod(_noop)


class _ObjectStore:
    @staticmethod
    def init_instance(*a: Any, **k: Any) -> None:
        return None


def rebind_ray_names(mod: Any, *, generate: Callable[[int], Any], update_weights: Callable[[], Awaitable[None]],
                     train: Callable[[int, Any], Awaitable[None]]) -> Any:
    """Rebind ``mod``'s Ray names in place and return it."""

    class _RolloutManager:
        save = dispose = eval = check_weights = onload_weights = onload_kv = offload = _Remote(_noop_remote)

    _RolloutManager.generate = _Remote(generate)  # type: ignore[attr-defined]

    class _Actor:
        async def update_weights(self, rollout_id: int | None = None) -> None:
            await update_weights()

        async def train(self, rollout_id: int, ref: Any, external_data: Any = None) -> None:
            await train(rollout_id, ref)

        save_model = offload = onload = clear_memory = staticmethod(_noop)

    async def create_training_models(*a: Any, **k: Any) -> tuple:
        return _Actor(), None

    g = mod.__dict__
    g.update(
        create_placement_groups=lambda a: {"rollout": None, "actor": None},
        create_rollout_manager=lambda a, pg: (_RolloutManager(), None),
        create_training_models=create_training_models,
        object_store=_ObjectStore, init_tracking=lambda a: None, configure_logger=lambda *a, **k: None,
        maybe_start_periodic_pyspy_dump=lambda: None, start_control_server=lambda **k: None,
        maybe_start_mini_ft_controller=lambda a: None, remove_rollout_data_refs=lambda *a: None,
    )
    if "EvalDispatcher" in g:
        g["EvalDispatcher"] = _EvalDispatcher
    return mod


__all__ = ["rebind_ray_names"]
