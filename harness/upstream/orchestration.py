"""Upstream's orchestration hosted in one process: what a run installs so that Miles'
driver, ``RolloutManager``, engine fleet start-up and train actor group run as upstream
wrote them over the leaves of ``harness.upstream.leaves``.

``hosted(run)`` is the context a virtual-time run (``harness.upstream.runner``) holds:
the in-process Ray (``harness.upstream.vray``) is ``ray`` in ``sys.modules``, the trainer
backend modules are the train actor leaf, and ``orchestration_rebinds(run)`` are the
module names replaced for the run (each a ``Rebind`` restored after it). Upstream's
modules were imported under the same Ray (``harness.upstream.source.activate``), so the
``@ray.remote`` classes and the names imported from ``ray`` are vray's.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from harness.upstream import host, leaves, vray
from harness.upstream.host import Rebind

RM_MOD = "miles.ray.rollout.rollout_manager"
SERVER_GROUP_MOD = "miles.ray.rollout.server_group"
OBJECT_STORE_MOD = "miles.utils.object_store"
# one engine per rollout GPU, the trainer on its own: a cluster large enough for the cases
CLUSTER_GPUS = 16
CLUSTER_CPUS = 64


# the class-based rollout API the runner observes: the default on the pinned tree, behind
# this switch on trees before it (miles/utils/environ.py: enable_experimental_rollout_refactor)
ROLLOUT_ENV = {"MILES_EXPERIMENTAL_ROLLOUT_REFACTOR": "1", "MILES_USE_LEGACY_ROLLOUT_V1": None}


@contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def rollout_environment() -> Any:
    """The environment variables a hosted run sets (``ROLLOUT_ENV``), for the block."""
    return _environment(ROLLOUT_ENV)


# upstream's per-process singletons a hosted run starts without, as a new process would:
# (module, the setter upstream resets it with). The audit event logger is set by the first
# ``configure_logger`` of a process and never replaced (``miles/utils/logging_utils.py:L22-L24``,
# ``if not is_event_logger_initialized()``); it writes to ``--save-debug-event-data``, which
# defaults to ``<save>/events`` (``miles/utils/arguments.py:L3561-L3562``): one run's logger
# kept in the next would write into the previous run's (removed) checkpoint folder.
PROCESS_SINGLETONS = (("miles.utils.audit_utils.event_logger.logger", "set_event_logger"),)


def fresh_process_singletons() -> None:
    """Reset upstream's per-process singletons (``PROCESS_SINGLETONS``) with upstream's own
    setter, where the tree has imported them: each run, and each life of a resume, is a
    process of its own in a deployment. Within a run they stay process-wide (one process
    hosts every actor here)."""

    for module_name, setter in PROCESS_SINGLETONS:
        mod = sys.modules.get(module_name)
        if mod is not None:
            getattr(mod, setter)(None)


@contextmanager
def hosted(kernels: type | None = None, *, real_time: bool = False) -> Iterator[None]:
    """vray as ``ray``, the train actor leaf as the trainer backend (over the tree's own
    ``TrainRayActor``, ``leaves.train_actor_class``; ``kernels``: the faked Megatron kernels,
    by default ``leaves.SimTrainActor``, or the controller-executor shape's ``SimCellTrainActor``) and the class-based
    rollout selected, fresh for the run, and upstream's per-process singletons fresh
    (``fresh_process_singletons``). ``real_time``: vray's real-time mode (the served run)."""
    from harness.upstream import source
    from harness.upstream.seams import CONTROLLER_EXECUTOR

    vray.reset(num_gpus=CLUSTER_GPUS, num_cpus=CLUSTER_CPUS, real_time=real_time)
    fresh_process_singletons()
    with vray.installed():  # upstream's TrainRayActor is imported under the in-process Ray
        if kernels is None and source.report().shape == CONTROLLER_EXECUTOR:
            from harness.upstream.leaves_refactor import SimCellTrainActor

            kernels = SimCellTrainActor
        actor = leaves.train_actor_class(kernels or leaves.SimTrainActor)
    with vray.installed(leaves.trainer_backend_modules(actor)), _environment(ROLLOUT_ENV):
        try:
            yield
        finally:
            fresh_process_singletons()
            vray.reset(num_gpus=CLUSTER_GPUS, num_cpus=CLUSTER_CPUS)


def _observed_load_rollout_function(load: Any, run: Any) -> Any:
    """``load_rollout_function`` as upstream's ``RolloutManager.__init__`` calls it: the data
    source it is given and the rollout function it returns are observed (wrapped in place)."""

    @functools.wraps(load)
    def observed(input: Any, path: str) -> Any:
        run.observe_data_source(input.data_source)
        fn = load(input, path)
        run.observe_rollout_fn(fn)
        return fn

    return observed


def orchestration_rebinds(run: Any) -> list[Rebind]:
    """The leaves put in upstream's modules for one run (``host.installed``), for the
    active tree's shape (``harness.upstream.seams``)."""
    from harness.upstream import source
    from harness.upstream.seams import CONTROLLER_EXECUTOR

    if source.report().shape == CONTROLLER_EXECUTOR:
        from harness.upstream.leaves_refactor import refactor_rebinds

        return refactor_rebinds(run, _observed_load_rollout_function)
    rm, group, store = host.module(RM_MOD), host.module(SERVER_GROUP_MOD), host.module(OBJECT_STORE_MOD)
    return [
        Rebind("engine_actor", group, "SGLangEngine", lambda _: leaves.SimEngineActor),
        *leaves.rollout_rebinds("rollout_manager", rm, run, _observed_load_rollout_function),
        *leaves.object_store_rebinds(store),
        *leaves.train_actor_rebinds(),
    ]


# the driver module's outside services, left off as their flags leave them (leaf outside_services)
DRIVER_SERVICES = (
    "configure_logger",
    "init_tracking",
    "maybe_start_periodic_pyspy_dump",
    "start_control_server",
    "maybe_start_mini_ft_controller",
)


def driver_services_off(mod: Any) -> Any:
    """``mod`` (a freshly loaded driver) with its outside services turned off."""
    for name in DRIVER_SERVICES:
        if name in mod.__dict__:
            mod.__dict__[name] = leaves.noop
    return mod


__all__ = [
    "DRIVER_SERVICES",
    "PROCESS_SINGLETONS",
    "driver_services_off",
    "fresh_process_singletons",
    "hosted",
    "orchestration_rebinds",
]
