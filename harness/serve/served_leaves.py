"""The leaves of upstream's orchestration for the served run (``harness.serve.upstream_e2e``):
real time, real HTTP, real threads. Everything between them runs as upstream wrote it:
``train_async.py``, ``create_placement_groups`` / ``create_rollout_manager`` /
``create_training_models`` (``miles/ray/placement_group.py``), the ``RolloutManager`` actor
with its data source, rollout function (on Miles' own background-loop thread, through
``asyncio.to_thread(call_rollout_function, ...)``), post-processing, train-data conversion
and save/load, the engine fleet's start-up (``server_group.py``, ``addr_allocator.py``)
with upstream's ``SGLangEngine`` actor and its HTTP client methods, the router
(``MilesRouter``, given by address as ``--sglang-router-ip/--sglang-router-port``), and the
train actor group (``actor_group.py``) over the tree's own ``TrainRayActor``.

The leaves (``SERVED_LEAVES``; ``doctor`` lists them):

* **Ray**: ``harness.upstream.vray`` in its real-time mode (a sync actor, the engine, runs
  its calls on a thread of its own).
* **the SGLang server process**: ``launch_server_process(ServerArgs(...))``, which
  ``SGLangEngine._init_normal`` calls (``sglang_engine.py:L246-L248``), starts a CPU server
  (``harness.serve.server.serve_in_thread``, the tiny model) on the host and port upstream
  allocated; upstream then registers it with the router (``/add_worker``) itself.
  ``ServerArgs`` is a dataclass of the fields Miles sets (sglang is not installable here);
  ``_compute_server_args`` drops the others, as it does for an older sglang.
* **the trainer**: ``ServedTrainActor``, the kernels of Megatron's train actor on
  ``TorchTrainer`` (GRPO on the tiny model): ``init`` loads ``trainer.pt`` under ``--load``
  (``start_rollout_id = loaded + 1``, ``megatron_utils/actor.py:L212``), ``train`` trains on
  the shard upstream's object store hands it, ``save_model`` writes the trainer and then
  Megatron's tracker, ``update_weights`` pushes the weights through the engine handles
  upstream passes (``EnginesAndLock``) in the order of Megatron's updaters
  (``update_weight_from_distributed/mixin.py:L309-L331`` for tensors, ``delta.py:L252-L266``
  for disk) and reports the version to the rollout manager (``megatron_utils/actor.py:L781``).
* **the object-store client**, **outside services** and **process-wide singletons**: as
  for the virtual-time run (``harness.upstream.leaves``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from harness.upstream.leaves import TRACKER, Leaf, SimTrainActor

SGLANG_ENGINE_MOD = "miles.backends.sglang_utils.sglang_engine"

SERVED_LEAVES: tuple[Leaf, ...] = (
    Leaf("ray", "the `ray` package (harness.upstream.vray, real-time mode)", "Ray's cluster and transport"),
    Leaf(
        "sglang_server",
        "miles/backends/sglang_utils/sglang_engine.py: launch_server_process(ServerArgs(...)) in "
        "SGLangEngine._init_normal",
        "a GPU inference server process; a CPU server (the tiny model) on the host and port upstream allocated",
    ),
    Leaf(
        "train_actor",
        "miles/ray/train/actor_factory.py: MegatronTrainRayActor (a subclass of the tree's own TrainRayActor)",
        "Megatron training on GPUs; TorchTrainer on the tiny model, a checkpoint of its own",
    ),
    Leaf(
        "object_store_client",
        "miles/utils/object_store.py: init_instance (once per process)",
        "one process hosts every Ray process: one client per run, shared",
    ),
    Leaf(
        "outside_services",
        "configure_logger, init_tracking, maybe_start_periodic_pyspy_dump, start_control_server, "
        "maybe_start_mini_ft_controller",
        "logging set-up, tracking, profiling and fault-tolerance services, left off as their flags leave them",
    ),
)


@dataclasses.dataclass
class ServerArgs:
    """SGLang's ``ServerArgs`` as Miles' engine fills it (``_compute_server_args``,
    ``sglang_engine.py:L696-L820``): the fields Miles sets; ``url`` as SGLang's."""

    model_path: str = ""
    trust_remote_code: bool = False
    random_seed: int | None = None
    enable_memory_saver: bool = False
    host: str = "127.0.0.1"
    port: int = 30000
    nccl_port: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    gpu_id_step: int = 1
    base_gpu_id: int = 0
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1
    skip_server_warmup: bool = False
    enable_draft_weights_cpu_backup: bool = False
    enable_metrics: bool = False
    engine_info_bootstrap_port: int | None = None
    api_key: str | None = None

    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class ServedProcess:
    """What ``launch_server_process`` returns (a ``multiprocessing.Process`` in upstream):
    the CPU server it started."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.pid = None

    def is_alive(self) -> bool:
        return self.server.thread.is_alive()


class ServedTrainActor(SimTrainActor):
    """The kernels of Megatron's train actor on the served run's ``TorchTrainer``
    (``host.current``: the run holds the host). All but the checkpoint are
    ``SimTrainActor``'s, calling the run's ``train_shard`` and ``weight_update``;
    ``train_actor_class`` puts the tree's own ``TrainRayActor`` under it."""

    role = "train_actor"

    def _load_checkpoint(self, args: Any) -> int | None:
        """The trainer, and the checkpoint under ``--load`` the tracker names (rank 0 loads it)."""
        return self.run.trainer_init(args, load=self.records)

    def save_model(self, rollout_id: int, force_sync: bool = False) -> None:
        if self.records and self.args.save:
            self.run.save_trainer(Path(self.args.save), rollout_id, self.weight_version)


def read_tracker(folder: Path | None) -> int | None:
    """The rollout Megatron's tracker under ``folder`` names, or ``None``."""
    if folder is None or not (folder / TRACKER).is_file():
        return None
    return int((folder / TRACKER).read_text().strip())


async def each_engine(engines: list[Any], method: str, *args: Any, **kwargs: Any) -> list[Any]:
    """``method`` on every engine handle at once, as Megatron's updater calls them
    (``ray.get([engine.method.remote(...) for engine in engines])``)."""
    return await asyncio.gather(*[getattr(e, method).remote(*args, **kwargs) for e in engines])


def served_rebinds(run: Any) -> list:
    """What the served run rebinds in upstream's modules (``host.installed``): the leaves
    above, the rollout manager's outside services off, and ``call_rollout_function``
    observed (``run.observe_rollout``: upstream's call, its input and output recorded)."""
    from harness.upstream import leaves
    from harness.upstream.host import Rebind, module
    from harness.upstream.orchestration import OBJECT_STORE_MOD, RM_MOD

    engine, rm = module(SGLANG_ENGINE_MOD), module(RM_MOD)
    return [
        Rebind("engine_launch", engine, "ServerArgs", lambda _: ServerArgs),
        Rebind("engine_launch", engine, "launch_server_process", lambda _: run.launch_engine),
        Rebind("rollout_manager", rm, "call_rollout_function", lambda real: run.observe_rollout(real)),
        Rebind("rollout_manager", rm, "configure_logger", lambda _: leaves.noop),
        Rebind("rollout_manager", rm, "init_tracking", lambda _: leaves.noop),
        *leaves.object_store_rebinds(module(OBJECT_STORE_MOD)),
        *leaves.train_actor_rebinds(),
    ]


__all__ = [
    "SERVED_LEAVES",
    "ServedProcess",
    "ServedTrainActor",
    "ServerArgs",
    "each_engine",
    "read_tracker",
    "served_rebinds",
]
