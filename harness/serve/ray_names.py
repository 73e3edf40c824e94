"""Upstream's driver module (``train_async.py``) with its Ray names rebound to in-process
objects, for the served end-to-end runs (``harness.serve.upstream_e2e``, ``harness.record``):
real HTTP to real CPU engines on real threads, where the virtual-time Ray
(``harness.upstream.vray``) does not apply. The virtual-time runner runs upstream's own
orchestration over its leaves instead (``harness.upstream.orchestration``).

``rebind_ray_names(mod, generate=..., update_weights=..., train=...)`` replaces the
placement groups, the rollout manager actor, the training actors, the object store,
tracking, logging and control-server hooks. ``generate(rollout_id)`` is what
``rollout_manager.generate.remote(rollout_id)`` returns: it must start the work at once
and return an awaitable, as a Ray call does. Each object put in upstream's hands has
exactly the members listed on its class; anything else upstream reads on it raises
``LeafMissing`` naming the member and the upstream file:line that read it (a harness
error, never upstream's error).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from harness.upstream.leaf_fakes import LeafCalled, LeafMissing


class _Remote:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def remote(self, *a: Any, **k: Any) -> Any:
        return self._fn(*a, **k)


async def _noop(*a: Any, **k: Any) -> None:
    return None


def _noop_remote(*a: Any, **k: Any) -> Any:
    return asyncio.ensure_future(_noop())


class _StandIn:
    """A member the class does not define is missing: ``LeafMissing`` names it, the
    role and the caller's file:line (the frame that read it: upstream's code)."""

    role = ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # Python's own protocol probes (copy, pickle, inspect)
            raise AttributeError(name)
        frame = sys._getframe(1)
        raise LeafMissing(self.role, name, frame.f_code.co_filename, frame.f_lineno)


class RolloutManagerStand(_StandIn):
    """``create_rollout_manager``'s actor: ``generate`` is the host's rollout; the rest
    are no-ops (the runs set no eval, save, offload or weight check)."""

    role = "rollout_manager"
    save = dispose = eval = check_weights = onload_weights = onload_kv = offload = _Remote(_noop_remote)

    def __init__(self, generate: Callable[..., Any]) -> None:
        self._generate = generate

    @property
    def generate(self) -> _Remote:
        return _Remote(self._generate)


class ActorModelStand(_StandIn):
    """``create_training_models``' actor group: ``update_weights`` and ``train`` are the
    host's; saving, offloading and memory clearing are no-ops."""

    role = "actor_model"

    def __init__(
        self, update_weights: Callable[[], Awaitable[object]], train: Callable[[int, Any], Awaitable[None]]
    ) -> None:
        self._update_weights, self._train = update_weights, train

    async def update_weights(self, rollout_id: int | None = None) -> None:
        await self._update_weights()

    async def train(self, rollout_id: int, ref: Any, external_data: Any = None) -> None:
        await self._train(rollout_id, ref)

    save_model = offload = onload = clear_memory = staticmethod(_noop)


class EvalDispatcherStand(_StandIn):
    role = "eval_dispatcher"

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    async def dispatch(self, *a: Any, **k: Any) -> None:
        raise LeafCalled("eval is not hosted (the harness sets no --eval-interval)", seam="train_async.py")

    drain = staticmethod(_noop)


class ObjectStoreStand(_StandIn):
    role = "object_store"

    @staticmethod
    def init_instance(*a: Any, **k: Any) -> None:
        return None


def rebind_ray_names(
    mod: Any,
    *,
    generate: Callable[[int], Any],
    update_weights: Callable[[], Awaitable[object]],
    train: Callable[[int, Any], Awaitable[None]],
) -> Any:
    """Rebind ``mod``'s Ray names in place and return it."""
    actor = ActorModelStand(update_weights, train)

    async def create_training_models(*a: Any, **k: Any) -> tuple:
        return actor, None

    g = mod.__dict__
    g.update(
        create_placement_groups=lambda a: {"rollout": None, "actor": None},
        create_rollout_manager=lambda a, pg: (RolloutManagerStand(generate), None),
        create_training_models=create_training_models,
        object_store=ObjectStoreStand(),
        init_tracking=lambda a: None,
        configure_logger=lambda *a, **k: None,
        maybe_start_periodic_pyspy_dump=lambda: None,
        start_control_server=lambda **k: None,
        maybe_start_mini_ft_controller=lambda a: None,
        remove_rollout_data_refs=lambda *a: None,
    )
    if "EvalDispatcher" in g:
        g["EvalDispatcher"] = EvalDispatcherStand
    return mod


__all__ = [
    "ActorModelStand",
    "EvalDispatcherStand",
    "ObjectStoreStand",
    "RolloutManagerStand",
    "rebind_ray_names",
]
