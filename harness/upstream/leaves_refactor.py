"""The leaves of upstream Miles' controller-executor orchestration (``harness.upstream.seams``:
the drivers are ``async def train(args)`` over ``create_rollout_components``), faked for a
virtual-time run. Line numbers are those of the refactor's tip (``miles-pr2542-688cf82b9``).

On this shape the driver (``train_async.py`` / ``train.py``) calls
``init_orchestration_script`` (``miles/utils/orchestration_utils.py:L13-L19``), which starts
the outside services and a worker manager, then ``create_rollout_components``
(``miles/ray/placement_group.py:L488-L536``: an ``InferenceController`` and a
``RolloutExecutor``, each a worker the manager started, reached through a
``BaseWorkerHandle``), ``create_training_models(args, rollout_executor)``
(``placement_group.py:L204-L245``: a ``TrainerController`` per trainer, which drives the
train actors of its cells, ``miles/ray/train/group.py``, ``miles/ray/train/cell.py``) and
``update_weights(...)`` (``placement_group.py:L320-L355``: ``start_update_weights`` on the
controller hands the trainer the engines' API clients, the trainer loads and reports a
version, ``end_update_weights``; then ``rollout_executor.set_weight_version``).

Everything between the leaves runs as upstream wrote it. The leaves, each with the line
upstream reaches it at:

* **Ray** (``harness.upstream.vray``), as on the rollout-manager shape: every worker is a
  Ray actor the worker manager creates (``miles/utils/workers/ray_worker_manager.py:L385-L404``,
  ``_create_actor``).
* **the driver's blocking wait on the worker manager**: ``RayWorkerManager.launch``
  (``ray_worker_manager.py:L62-L67``) blocks the driver's thread in ``ray.get`` until the
  manager, another process, has started every cell. vray's blocking ``get`` steps the loop
  until the refs are done, which is what the blocked driver observes. The manager itself
  (pools, cells, ports, liveness scans) runs as upstream wrote it.
* **the SGLang server and router processes**: the engine and router pools are
  ``CommandWorkerSpec`` s (``miles/ray/specs/inference.py``: ``specs_router``,
  ``specs_inference_engine``) whose ``CommandActor`` (``miles/utils/workers/command_actor.py:L13-L55``)
  runs a launch command in a subprocess. ``SimCommandActor`` starts nothing: the run's
  ``SimEngine`` is the server.
* **the engines' and router's network**: ``wait_tcp_ready`` (``miles/ray/rollout/router_manager.py:L59``)
  and every engine API call through ``GeneralHttpClientProvider.client()``
  (``miles/utils/http_utils.py:L223-L230``; ``SGLangApiClient``,
  ``miles/backends/sglang_utils/sglang_api_client.py``): pause, continue, weight loads,
  version, health. Not served yet (see ``UNHOSTED``).
* **the trainer** (``MegatronTrainRayActor`` / ``FSDPTrainRayActor``, the trainer pool's
  ``worker_class``, ``miles/ray/specs/train.py:L36-L39``, ``:L213``): the train actor,
  as on the other shape; its methods on this shape (``init``, ``train``,
  ``update_weights(info)`` returning the version, ``get_train_parallel_config``,
  ``miles/ray/train_actor.py:L93-L222``) differ from the rollout-manager shape's.
* **the rollout thread**: ``RolloutExecutor._get_rollout_data`` runs the rollout function
  through ``asyncio.to_thread(call_rollout_function, ...)``
  (``miles/ray/rollout/rollout_executor.py:L281-L289``): awaited on the one loop, observed
  as the runner observes ``RolloutManager``'s (``generate_start`` .. ``metrics``).
* **process-wide singletons**: the object-store client (``object_store.init_instance``,
  called by the driver at ``orchestration_utils.py:L18`` and by the executor at
  ``rollout_executor.py:L97``), one per run, shared.
* **outside services**, left off as their flags leave them: ``configure_logger``,
  ``maybe_start_periodic_pyspy_dump``, ``init_tracking`` (``orchestration_utils.py:L14-L16``,
  ``rollout_executor.py:L67``, ``:L96``), ``maybe_start_api_server``
  (``placement_group.py:L469-L482``, off without ``--api-server-port``) and
  ``maybe_start_mini_ft_controller``.

* **SGLang's own flags** (``--sglang-*``, leaf ``sglang_server_args``): the engine pool's
  launch command (``compute_engine_launch_cmd``, ``miles/ray/specs/inference.py:L288-L303``)
  is built from SGLang's ``ServerArgs``, not installable here; the command goes to the
  engine process leaf, which runs nothing, so the harness builds a placeholder
  (``engine_launch_cmd``), and ``--sglang-api-key`` has SGLang's default (none).

``UNHOSTED`` names what the harness does not fake yet on this shape, with where a run
stops without it; ``doctor`` lists it, and ``harness.upstream.seams.HOSTED`` keeps the shape
refused until it is empty.
"""

from __future__ import annotations

from typing import Any

from harness.upstream import host, leaves
from harness.upstream.host import Rebind
from harness.upstream.leaves import Leaf

EXECUTOR_MOD = "miles.ray.rollout.rollout_executor"
WORKER_MANAGER_MOD = "miles.utils.workers.ray_worker_manager"
ORCHESTRATION_UTILS_MOD = "miles.utils.orchestration_utils"
ROUTER_MANAGER_MOD = "miles.ray.rollout.router_manager"
OBJECT_STORE_MOD = "miles.utils.object_store"


LEAVES: tuple[Leaf, ...] = (
    Leaf("ray", "the `ray` package (harness.upstream.vray)", "Ray's cluster and transport; one process here"),
    Leaf(
        "driver_blocking_get",
        "miles/utils/workers/ray_worker_manager.py:L66: ray.get(obj.init.remote(...)) in RayWorkerManager.launch",
        "the driver's thread blocks while the worker manager starts the cells; one thread runs the loop instead",
    ),
    Leaf(
        "engine_process",
        "miles/utils/workers/command_actor.py: CommandActor (the engine and router pools' launch commands)",
        "SGLang servers and the router are processes; the run's SimEngine serves them",
    ),
    Leaf(
        "engine_network",
        "miles/ray/rollout/router_manager.py:L59 wait_tcp_ready; miles/utils/http_utils.py:L223 "
        "GeneralHttpClientProvider.client (SGLangApiClient)",
        "the engines' and router's HTTP API",
    ),
    Leaf(
        "train_actor",
        "miles/ray/specs/train.py:L36-L39: the trainer pool's worker_class (MegatronTrainRayActor / FSDPTrainRayActor)",
        "Megatron/FSDP training on GPUs",
    ),
    Leaf(
        "rollout_thread",
        "miles/ray/rollout/rollout_executor.py:L281: asyncio.to_thread(call_rollout_function, ...)",
        "Miles' background-loop thread; the rollout coroutine runs on the one virtual-time loop",
    ),
    Leaf(
        "object_store_client",
        "miles/utils/object_store.py: init_instance (orchestration_utils.py:L18, rollout_executor.py:L97)",
        "one process hosts every Ray process: one client per run, shared",
    ),
    Leaf(
        "sglang_server_args",
        "miles/ray/specs/inference.py:L288-L303: compute_engine_launch_cmd (SGLang's ServerArgs); --sglang-api-key",
        "sglang is not installable next to a CPU torch; its flags only configure the engine process",
    ),
    Leaf(
        "outside_services",
        "configure_logger, maybe_start_periodic_pyspy_dump, init_tracking (orchestration_utils.py:L14-L16, "
        "rollout_executor.py:L67, :L96), maybe_start_api_server, maybe_start_mini_ft_controller",
        "logging set-up, profiling, tracking, the API server and fault tolerance, left off as their flags leave them",
    ),
)

# what this harness does not fake yet on the controller-executor shape: (leaf, what upstream
# needs of it, where a run stops without it). Measured on the tip with the shape forced
# hosted: the worker manager starts every cell over these leaves (the engine and router
# pools, the rollout executor, the inference controller, the trainer controller and its
# train actors), and the run stops at the first line of each entry.
UNHOSTED: tuple[tuple[str, str, str], ...] = (
    (
        "train_actor",
        "SimTrainActor with this shape's constructor and API: the trainer pool builds it with "
        "(args, world_size, rank, role, cell_index) and NodeProbeMixin (miles/ray/specs/train.py:L214-L220, "
        "ray_worker_manager.py:L523-L536); TrainerCell.execute calls init / load_state / train / update_weights(info) "
        "returning the version / get_train_parallel_config (miles/ray/train/cell.py, miles/ray/train_actor.py:L93-L222)",
        "the trainer cell's actor dies in its constructor (ray_worker_manager.py:L352, alloc_ports)",
    ),
    (
        "engine_network",
        "the engines' HTTP API behind GeneralHttpClientProvider.client() served on SimEngine: the launch gate "
        "(miles/utils/workers/launch_gate.py:L13-L27, posted by ServerCell at miles/ray/rollout/server_cell.py:L155), "
        "then SGLangApiClient's /health_generate, /get_weight_version, /pause_generation, /continue_generation, "
        "/update_weights_from_tensor, /flush_cache; and retry_until_deadline's real-time deadline "
        "(miles/utils/retry_utils.py) on virtual time",
        "InferenceController.init waits for the engine's launch gate over the real network and the run hangs "
        "(WatchdogTripped at virtual t=310 s)",
    ),
)


class SimCommandActor(leaves._Leaf):
    """``CommandActor`` (``miles/utils/workers/command_actor.py``) that starts no process:
    the engine and router it would launch are the run's ``SimEngine``."""

    role = "engine_process"

    def __init__(self) -> None:
        self.cmd: str | None = None

    @staticmethod
    def _get_node_ip() -> str:
        return leaves.NODE_IP

    @staticmethod
    def _is_port_available(*, port: int) -> bool:
        return True

    @staticmethod
    def _get_free_port_block(*, start_port: int, count: int) -> int:
        return free_port(start_port, count)

    def run(self, cmd: str, envs: dict[str, str]) -> None:
        assert self.cmd is None, "CommandActor.run can only be called once"
        self.cmd = cmd

    def shutdown(self) -> None:
        return None


def free_port(start_port: int = 10000, consecutive: int = 1) -> int:
    """``get_free_port`` on the one simulated node: every port is free, so the first asked
    for (upstream's ``PortAllocator`` hands out increasing blocks, ``addr_allocator.py:L16-L29``)."""
    return start_port


def engine_launch_cmd(**kwargs: Any) -> str:
    """The SGLang server's command line as the engine leaf records it (it runs nothing)."""
    return "sim-engine " + " ".join(f"--{k}={v}" for k, v in sorted(kwargs.items()) if k != "args")


def node_ip() -> str:
    return leaves.NODE_IP


def port_available(port: int) -> bool:
    return True


async def tcp_ready(host_: str, port: int, timeout: float | None = None) -> None:
    """``wait_tcp_ready`` on the run's router and engines: they are up from the start."""
    return None


def refactor_rebinds(run: Any, observed_load: Any) -> list[Rebind]:
    """The leaves put in upstream's modules for one run on the controller-executor shape;
    ``observed_load(load, run)``: ``load_rollout_function`` with the data source and the
    rollout function it makes observed (``orchestration._observed_load_rollout_function``)."""
    ex, wm, ou = host.module(EXECUTOR_MOD), host.module(WORKER_MANAGER_MOD), host.module(ORCHESTRATION_UTILS_MOD)
    store, misc = host.module(OBJECT_STORE_MOD), host.module("miles.utils.misc")
    shared = leaves.SharedObjectStore(store())
    return [
        Rebind("engine_process", wm, "CommandActor", lambda _: SimCommandActor),
        Rebind("engine_process", host.module(ROUTER_MANAGER_MOD), "wait_tcp_ready", lambda _: tcp_ready),
        # the engine process's command line, built from SGLang's ServerArgs (not installable here) for the
        # CommandActor leaf, which starts nothing (miles/ray/specs/inference.py:L288-L303)
        Rebind(
            "engine_process",
            host.module("miles.ray.specs.inference"),
            "compute_engine_launch_cmd",
            lambda _: engine_launch_cmd,
        ),
        # the node every worker probes (NodeProbeMixin, miles/utils/misc.py:L115-L130): one simulated node
        Rebind("worker_manager", misc, "get_current_node_ip", lambda _: node_ip),
        Rebind("worker_manager", misc, "get_free_port", lambda _: free_port),
        Rebind("worker_manager", misc, "is_port_available", lambda _: port_available),
        Rebind("rollout_executor", ex, "asyncio", lambda _: leaves.OnLoopAsyncio()),
        Rebind("rollout_executor", ex, "call_rollout_function", lambda _: run.call_rollout_function),
        Rebind("rollout_executor", ex, "load_rollout_function", lambda f: observed_load(f, run)),
        Rebind("rollout_executor", ex, "configure_logger", lambda _: leaves.noop),
        Rebind("rollout_executor", ex, "init_tracking", lambda _: leaves.noop),
        Rebind("worker_manager", wm, "configure_logger", lambda _: leaves.noop),
        Rebind("worker_manager", ou, "configure_logger", lambda _: leaves.noop),
        Rebind("worker_manager", ou, "maybe_start_periodic_pyspy_dump", lambda _: leaves.noop),
        Rebind("worker_manager", ou, "init_tracking", lambda _: leaves.noop),
        Rebind("object_store", store, "init_instance", lambda _: shared.init_instance),
        Rebind("object_store", store, "get_instance", lambda _: shared.get_instance),
    ]


__all__ = ["LEAVES", "UNHOSTED", "SimCommandActor", "refactor_rebinds", "tcp_ready"]
