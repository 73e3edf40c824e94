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
  version, health, the router's worker list (``SimHttpClient``, on the run's ``SimEngine``).
* **real-time clocks**: ``time`` in the modules whose deadlines gate a run
  (``retry_until_deadline``, ``miles/utils/retry_utils.py:L69-L91``, with its jitter drawn from
  a generator of the run's own; a cell's start-up, ``miles/ray/rollout/server_cell.py:L136``;
  the controller's wait for ready cells, ``inference_controller.py:L234-L242``; ``wait_dead``,
  ``miles/utils/workers/worker_handle.py:L29-L33``; the engine-env audit's cadence) reads
  the virtual-time loop (``VirtualClock``): one process, one clock.
* **the trainer** (``MegatronTrainRayActor`` / ``FSDPTrainRayActor``, the trainer pool's
  ``worker_class``, ``miles/ray/specs/train.py:L36-L39``, ``:L213``): the train actor,
  as on the other shape; its methods on this shape (``init``, ``train``,
  ``update_weights(info)`` returning the version, ``get_train_parallel_config``,
  ``miles/ray/train_actor.py:L93-L222``) differ from the rollout-manager shape's
  (``SimCellTrainActor``). Its weight update goes through the engines' API clients the
  inference controller hands it (pause, flush, load with the version, continue), and the
  version it returns is what upstream's ``update_weights`` reports to the executor.
* **the rollout thread**: ``RolloutExecutor._get_rollout_data`` runs the rollout function
  through ``asyncio.to_thread(call_rollout_function, ...)``
  (``miles/ray/rollout/rollout_executor.py:L281-L289``): awaited on the one loop, observed
  as the runner observes ``RolloutManager``'s (``generate_start`` .. ``metrics``). The
  fully-async rollout's ``dispose`` closes its worker on Miles' background loop
  (``fully_async_rollout.py:L309-L310``, ``run(self.aclose())``, where the worker runs):
  on the one loop too (``leaves.run_on_loop``), the caller blocked as on a ``ray.get``.
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
stops without it; ``doctor`` lists it (empty now: ``harness.upstream.seams.HOSTED`` hosts
the shape under ``--orchestration upstream``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import inspect
import json
import random
import sys
import time
from typing import Any

from harness.upstream import host, leaves
from harness.upstream.host import Rebind
from harness.upstream.leaves import Leaf
from harness.upstream.leaf_fakes import LeafMissing

EXECUTOR_MOD = "miles.ray.rollout.rollout_executor"
WORKER_MANAGER_MOD = "miles.utils.workers.ray_worker_manager"
ORCHESTRATION_UTILS_MOD = "miles.utils.orchestration_utils"
ROUTER_MANAGER_MOD = "miles.ray.rollout.router_manager"
OBJECT_STORE_MOD = "miles.utils.object_store"
HTTP_UTILS_MOD = "miles.utils.http_utils"
SERVER_CELL_MOD = "miles.ray.rollout.server_cell"
CONTROLLER_MOD = "miles.ray.rollout.inference_controller"
FULLY_ASYNC_MOD = "miles.rollout.fully_async_rollout"


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
        "the engines' and router's HTTP API, served on the run's SimEngine",
    ),
    Leaf(
        "real_time_clock",
        "time in miles/utils/retry_utils.py (retry_until_deadline, and random for its jitter), "
        "miles/ray/rollout/server_cell.py, inference_controller.py, engine_env_reporter.py, "
        "miles/utils/workers/worker_handle.py",
        "deadlines and polls on the wall clock; one process runs on the virtual-time loop's clock",
    ),
    Leaf(
        "train_actor",
        "miles/ray/specs/train.py:L36-L39: the trainer pool's worker_class (MegatronTrainRayActor / FSDPTrainRayActor)",
        "Megatron/FSDP training on GPUs: the kernels (init's checkpoint load, train, save, weight update) over "
        "the tree's own TrainRayActor, whose constructor runs as written",
    ),
    Leaf(
        "rollout_thread",
        "miles/ray/rollout/rollout_executor.py:L281: asyncio.to_thread(call_rollout_function, ...); "
        "miles/rollout/fully_async_rollout.py:L310: run(self.aclose()) in dispose",
        "Miles' background-loop thread; the rollout coroutine and its close run on the one virtual-time loop",
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
# needs of it, where a run stops without it); doctor lists them. None is left for a run's
# start-up, its weight updates and its train steps; what a case reaches beyond them (a member
# a leaf fake lacks) is a harness error naming the member and the line (LeafMissing).
UNHOSTED: tuple[tuple[str, str, str], ...] = ()


class SimNodeProbe:
    """What the worker manager asks every worker's process about its node
    (``NodeProbeMixin``, ``miles/utils/misc.py:L115-L130``; ``alloc_ports``,
    ``miles/utils/workers/ray_worker_manager.py:L352``), answered for the one simulated node:
    its address, and every port free."""

    @staticmethod
    def _get_node_ip() -> str:
        return leaves.NODE_IP

    @staticmethod
    def _is_port_available(*, port: int) -> bool:
        return True

    @staticmethod
    def _get_free_port_block(*, start_port: int, count: int) -> int:
        return free_port(start_port, count)


class SimCellTrainActor(SimNodeProbe, leaves.SimTrainActor):
    """The kernels of the trainer pool's worker on this shape (``TrainRayActor``,
    ``miles/ray/train_actor.py:L47-L222``, built by ``ServeWorkerSpec.ctor_kwargs`` with
    ``(args, world_size, rank, role, cell_index)``, ``miles/ray/specs/train.py:L214-L220``) on
    ``SimTrainer``: what ``TrainerCell.execute`` calls (``miles/ray/train/cell.py:L61-L113``,
    ``miles/ray/train/group.py:L360-L430``). A run hosts it over the tree's own
    ``TrainRayActor`` (``leaves.train_actor_class``): upstream's constructor and every member
    these kernels do not define run as written.
    Rank 0 of the actor records for the run, as ``SimTrainActor``. Its node probes are
    ``SimNodeProbe``'s: upstream's ``TrainRayActor`` is a ``NodeProbeMixin``
    (``train_actor.py:L48``), which trees before the tip's ``BootstrappedWorker`` added it
    to every served worker (``ray_worker_manager.py:L526``) ask of the train actor itself."""

    def __init__(self, *, args: Any, world_size: int, rank: int, role: str, cell_index: int) -> None:
        super().__init__(args, world_size, rank, None, None, role=role, cell_index=cell_index)

    def _attach(self, *args: Any, role: str = "actor", cell_index: int = 0, **kwargs: Any) -> None:
        """Beside upstream's constructor (``train_actor.py:L49-L82``: its heartbeat, ranks,
        environment, logger and object-store client), what the leaf keeps: its role, and the
        rendezvous address it proposes (``propose_master_addr_and_port``), fixed here so
        that every run starts the same."""
        super()._attach()
        self.role, self.cell_index = role, cell_index
        self.master_addr, self.master_port = leaves.NODE_IP, leaves.MASTER_PORT

    def propose_master_addr_and_port(self) -> tuple[str, int]:
        return self.master_addr, self.master_port

    def configure_master_addr_and_port(self, *, master_addr: str, master_port: int) -> None:
        self.master_addr, self.master_port = master_addr, master_port

    def get_train_parallel_config(self) -> dict[str, Any]:
        return self.train_parallel_config

    def kill_self(self) -> None:
        """The process exits (``os._exit(1)``, ``miles/ray/train_actor.py:L177-L179``), as the
        trainer cell asks of its failed workers (``_kill_worker``, ``miles/ray/train/cell.py:L302-L310``):
        the actor dies (``vray.kill_actor``), so this call, and every later one, fails with
        Ray's ``ActorDiedError``, which ``RayWorkerHandle`` reads as the worker gone
        (``miles/utils/workers/ray_worker_handle.py:L24-L28``)."""
        from harness.upstream import vray

        vray.kill_actor(vray.get_runtime_context().current_actor, "kill_self: its process exited")

    # this shape's TrainRayActor API (miles/ray/train_actor.py:L195-L222), not the rollout-manager shape's
    async def train(  # type: ignore[override]
        self,
        rollout_id: int,
        rollout_data_ref: Any,
        witness_info: Any = None,
        attempt: int = 0,
        external_data: Any = None,
    ) -> Any:
        """Train the rank's shard; a normal step (``TrainStepOutput``, which the trainer
        controller checks, ``group.py:L259-L286``)."""
        from miles.backends.megatron_utils.ft.types import TrainStepOutcome, TrainStepOutput
        from miles.utils.data import process_rollout_data

        data, _got = process_rollout_data(self.args, rollout_data_ref, self._rank, self._world_size, witness_info)
        if self.records:
            await self.run.train_shard(rollout_id, data)
        return TrainStepOutput(outcome=TrainStepOutcome.NORMAL)

    async def update_weights(self, info: Any) -> int:  # type: ignore[override]
        """The weight updater on the engines' API clients ``InferenceController.start_update_weights``
        hands over (``UpdatableEngines``): every rank counts the version, rank 0 pauses in
        ``--pause-generation-mode`` (FSDP: SGLang's default), flushes the cache, opens the
        load, loads with the version, closes it and continues
        (``megatron_utils/update_weight/update_weight_from_tensor.py:L233-L320``,
        ``fsdp_utils/update_weight_utils.py:L78-L124``); the version is returned to upstream,
        which reports it to the rollout executor (``placement_group.py:L320-L355``)."""
        self.weight_version += 1
        if self.records:
            mode = "retract" if self.args.train_backend == "fsdp" else self.args.pause_generation_mode
            clients = list(info.rollout_engines)
            self.run.weight_update_begins(self.weight_version)
            await asyncio.gather(*(c.pause_generation(mode=mode) for c in clients))
            await asyncio.gather(*(c.flush_cache() for c in clients))
            await asyncio.gather(*(c.begin_weight_update() for c in clients))
            weights = self.run.ctx.trainer.get_weights()
            version = str(self.weight_version)
            await asyncio.gather(*(c.update_weights_from_tensor([weights], weight_version=version) for c in clients))
            await asyncio.gather(*(c.end_weight_update() for c in clients))
            await asyncio.gather(*(c.continue_generation() for c in clients))
        return self.weight_version


# --------------------------------------------------------------------------- the engines' HTTP API


class SimResponse:
    """What upstream reads of an ``httpx.Response``: the status, the body, ``raise_for_status``."""

    def __init__(self, url: str, body: Any = None, status_code: int = 200) -> None:
        self.url, self.status_code, self._body = url, status_code, body

    @property
    def content(self) -> bytes:
        return b"" if self._body is None else json.dumps(self._body).encode()

    @property
    def text(self) -> str:
        return self.content.decode()

    def json(self) -> Any:
        return self._body

    def raise_for_status(self) -> "SimResponse":
        if self.status_code >= 400:
            import httpx

            request = httpx.Request("GET", self.url)
            raise httpx.HTTPStatusError(
                f"{self.status_code} for {self.url}", request=request, response=httpx.Response(self.status_code)
            )
        return self


_RESET_TENSORS = object()  # parameters overwritten by the weights checker: equal to no load


class SimHttpClient(leaves._Leaf):
    """The client ``GeneralHttpClientProvider.client()`` returns (``miles/utils/http_utils.py:L223-L230``),
    serving the engines' and router's HTTP API on the run's ``SimEngine``: what
    ``SGLangApiClient`` (``miles/backends/sglang_utils/sglang_api_client.py``), the launch gate
    (``miles/utils/workers/launch_gate.py:L13-L27``) and the health probes ask. Every engine URL
    is the one ``SimEngine``; an endpoint it does not serve is ``LeafMissing`` naming it."""

    role = "engine_network"

    def __init__(self, run: Any) -> None:
        self.run = run
        self.workers: list[dict] = []  # the router's workers, as ServerCell registers them
        # What the engine's parameters hold, for SGLang's weights checker: it launches from
        # ``--hf-checkpoint``, the untrained weights the simulated trainer's step count 0 stands for;
        # every load replaces them with the payload it carries (the trainer's ``get_weights()``).
        self.weights: Any = 0
        self.snapshot: Any = None

    async def get(self, url: str, **_: Any) -> SimResponse:
        return await self._serve("GET", url, {})

    async def post(self, url: str, json: Any = None, **_: Any) -> SimResponse:
        return await self._serve("POST", url, json or {})

    async def delete(self, url: str, **_: Any) -> SimResponse:
        return await self._serve("DELETE", url, {})

    def _check_weights(self, url: str, payload: dict) -> SimResponse:
        """SGLang's ``/weights_checker`` (``CheckWeightsReqInput``) on what the engine's parameters
        hold: ``snapshot`` copies them, ``reset_tensors`` overwrites them (SGLang fills them with
        noise), ``compare`` fails unless a load since put back exactly the snapshot, and ``checksum``
        reports one rank's digest in the shape ``flatten_inference_engine_checksums`` reads
        (``miles/utils/audit_utils/checksum_utils.py:L6-L33``). Upstream calls it under
        ``--check-weight-update-equal``: snapshot and reset as an engine comes up
        (``server_cell.py:L177-L192``), compare after the first weight update (``train_async.py:L43-L49``)."""
        action = payload.get("action")
        if action == "snapshot":
            self.snapshot = self.weights
        elif action == "reset_tensors":
            self.weights = _RESET_TENSORS
        elif action == "compare":
            if self.snapshot is None or self.weights != self.snapshot:
                held = "reset tensors" if self.weights is _RESET_TENSORS else repr(self.weights)
                message = f"weights_checker compare: the engine holds {held}, the snapshot {self.snapshot!r}"
                return SimResponse(url, {"success": False, "message": message}, status_code=400)
        elif action == "checksum":
            digest = hashlib.sha256(repr(self.weights).encode()).hexdigest()
            rank = {"parallelism_info": [{"rank": 0}], "checksums": {"model": digest}}
            return SimResponse(url, {"success": True, "ranks": [rank]})
        else:
            message = f"weights_checker: action={action!r} is not one of snapshot, reset_tensors, compare, checksum"
            return SimResponse(url, {"success": False, "message": message}, status_code=400)
        return SimResponse(url, {"success": True, "message": ""})

    async def _serve(self, method: str, url: str, payload: dict) -> SimResponse:
        path = "/" + url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        run, eng = self.run, self.run.engine
        # the router's worker registry (sglang_router_api_client.py: add_worker, remove_worker); every
        # worker is the one SimEngine, so registration changes where nothing is routed
        if path == "/workers" and method == "POST":
            self.workers.append({"id": str(len(self.workers)), "url": payload["url"]})
            return SimResponse(url, {})
        if path == "/workers" and method == "GET":
            return SimResponse(url, {"workers": list(self.workers)})
        if path.startswith("/workers/") and method == "DELETE":
            self.workers = [w for w in self.workers if w["id"] != path.rsplit("/", 1)[1]]
            return SimResponse(url, {})
        if path in ("/health_generate", "/health", "/flush_cache", "/gate/activate", "/begin_weight_update"):
            return SimResponse(url)  # up from the start, no cache to flush, the gate open, the load opened
        if path == "/end_weight_update":
            return SimResponse(url)
        if path in ("/release_memory_occupation", "/resume_memory_occupation"):
            return SimResponse(url)  # the simulated engine holds no GPU memory to offload or bring back
        if path == "/weights_checker":
            return self._check_weights(url, payload)
        if path == "/server_info":
            # SGLang's server info as the engine-env audit and external engines read it: one GPU per engine
            # (the runner's wiring), nothing else to report (miles/ray/rollout/engine_env_reporter.py:L33-L45)
            return SimResponse(url, {"internal_states": [{"world_size": 1}]})
        if path in ("/model_info", "/get_weight_version"):
            return SimResponse(url, {"weight_version": str(eng.weight_version)})
        if path == "/pause_generation":
            await eng.pause_generation(payload.get("mode", "abort"))  # SGLang's PauseGenerationReqInput default
            return SimResponse(url)
        if path == "/continue_generation":
            await eng.continue_generation()
            return SimResponse(url)
        if path == "/update_weights_from_tensor":
            version = int(payload["weight_version"])
            [weights] = payload["serialized_named_tensors"]
            await eng.update_weights(version, weights)
            self.weights = weights
            run.engine_loaded(version)
            return SimResponse(url, {"success": True, "message": ""})
        if path == "/update_weights_from_disk":
            # the engine reloads the checkpoint at model_path under the version given (else the one it has)
            version = int(payload.get("weight_version") or eng.weight_version)
            await eng.update_weights(version, payload["model_path"])
            self.weights = ("disk", payload["model_path"])
            run.engine_loaded(version)
            return SimResponse(url, {"success": True, "message": ""})
        if path == "/update_weight_version":
            eng.weight_version = int(payload["new_version"])
            if payload.get("abort_all_requests", True):
                await run.serve_abort({"abort_all": True})
            return SimResponse(url, {"success": True})
        if path == "/abort_request":
            return SimResponse(url, await run.serve_abort(payload))
        if path == "/generate":
            return SimResponse(url, await run.serve_generate(payload))
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_code.co_filename == __file__:
            frame = frame.f_back
        raise LeafMissing(self.role, f"{method} {path}", frame.f_code.co_filename, frame.f_lineno)


class VirtualClock:
    """``time`` as a module of upstream's sees it: ``monotonic`` and ``time`` read the
    virtual-time loop's clock, so deadlines (``retry_until_deadline``, ``miles/utils/retry_utils.py:L69-L91``;
    a cell's start-up deadline, ``server_cell.py:L136``, ``:L157``; the controller's wait for
    ready cells, ``inference_controller.py:L234-L242``; ``wait_dead``, ``worker_handle.py:L29-L33``)
    pass as the loop's sleeps do; everything else is ``time``'s."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def monotonic() -> float:
        return asyncio.get_running_loop().time()

    @staticmethod
    def time() -> float:
        return asyncio.get_running_loop().time()


class SimCommandActor(SimNodeProbe, leaves._Leaf):
    """``CommandActor`` (``miles/utils/workers/command_actor.py``) that starts no process:
    the engine and router it would launch are the run's ``SimEngine``."""

    role = "engine_process"

    def __init__(self) -> None:
        self.cmd: str | None = None

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


def tcp_ready_blocking(host_: str, port: int, *, timeout: float = 30) -> None:
    """``wait_tcp_ready`` where a tree polls the port synchronously (``miles/utils/http_utils.py:L68``
    of ``miles-pr2649-48920692a``, called without ``await`` by ``wait_router_ready``): up
    from the start."""
    return None


def tcp_ready_like(upstream: Any) -> Any:
    """The leaf of the same kind as the tree's ``wait_tcp_ready``: a coroutine function
    where upstream awaits it, a plain one where it calls it (an un-awaited coroutine is
    fatal in Miles' logging set-up, ``miles/utils/logging_utils.py:L60-L70``)."""
    return tcp_ready if inspect.iscoroutinefunction(upstream) else tcp_ready_blocking


def _reported(set_weight_version: Any, run: Any) -> Any:
    """``RolloutExecutor.set_weight_version`` observed: the run records the version once the
    executor holds it (the end of the weight sync, as ``SimTrainActor`` records it on the
    rollout-manager shape)."""

    @functools.wraps(set_weight_version)
    def reported(self: Any, weight_version: int, *args: Any, **kwargs: Any) -> None:
        set_weight_version(self, weight_version, *args, **kwargs)
        run.weight_update_reported(weight_version)

    return reported


API_SERVER_MOD = "miles.utils.ft_utils.api_server.server"


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package the tree lacks
        return False


def refactor_rebinds(run: Any, observed_load: Any) -> list[Rebind]:
    """The leaves put in upstream's modules for one run on the controller-executor shape;
    ``observed_load(load, run)``: ``load_rollout_function`` with the data source and the
    rollout function it makes observed (``orchestration._observed_load_rollout_function``)."""
    ex, wm, ou = host.module(EXECUTOR_MOD), host.module(WORKER_MANAGER_MOD), host.module(ORCHESTRATION_UTILS_MOD)
    store, misc = host.module(OBJECT_STORE_MOD), host.module("miles.utils.misc")
    client = SimHttpClient(run)
    clock = VirtualClock()
    return [
        # every engine and router API call (miles/utils/http_utils.py:L223-L230): served on the run's SimEngine
        Rebind(
            "engine_http",
            lambda: host.module(HTTP_UTILS_MOD)().GeneralHttpClientProvider,
            "client",
            lambda _: staticmethod(lambda: client),
        ),
        # real-time deadlines read the virtual-time loop's clock (VirtualClock)
        Rebind("worker_manager", host.module("miles.utils.retry_utils"), "time", lambda _: clock),
        # retry_until_deadline's jitter (retry_utils.py:L81) drawn from a generator of the run's own, so a
        # case's start-up waits are the same on every run
        Rebind("worker_manager", host.module("miles.utils.retry_utils"), "random", lambda _: random.Random(0)),
        Rebind("worker_manager", host.module("miles.utils.workers.worker_handle"), "time", lambda _: clock),
        Rebind("inference_controller", host.module(SERVER_CELL_MOD), "time", lambda _: clock),
        Rebind("inference_controller", host.module(CONTROLLER_MOD), "time", lambda _: clock),
        Rebind("inference_controller", host.module("miles.ray.rollout.engine_env_reporter"), "time", lambda _: clock),
        # the version upstream's update_weights reports to the executor (placement_group.py:L354-L355)
        Rebind(
            "rollout_executor",
            lambda: host.module(EXECUTOR_MOD)().RolloutExecutor,
            "set_weight_version",
            lambda f: _reported(f, run),
        ),
        Rebind("engine_process", wm, "CommandActor", lambda _: SimCommandActor),
        Rebind("engine_process", host.module(ROUTER_MANAGER_MOD), "wait_tcp_ready", tcp_ready_like),
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
        *leaves.rollout_rebinds("rollout_executor", ex, run, observed_load),
        # the rollout function's dispose runs its close on Miles' background loop, where its worker
        # runs (fully_async_rollout.py:L309-L310, ``run(self.aclose())``): here the one loop
        Rebind(
            "rollout_executor",
            host.module(FULLY_ASYNC_MOD),
            "run",
            lambda _: leaves.run_on_loop,
            probe=lambda _: "run" in vars(importlib.import_module(FULLY_ASYNC_MOD)),
        ),
        Rebind("worker_manager", wm, "configure_logger", lambda _: leaves.noop),
        # the logger TrainRayActor's constructor configures (train_actor.py:L71-L79): an outside service
        Rebind("worker_manager", host.module(leaves.TRAIN_ACTOR_MOD), "configure_logger", lambda _: leaves.noop),
        # --api-server-port's listening socket (leaf api_server_socket): the app is built, nothing listens
        Rebind(
            "inference_controller",
            host.module(API_SERVER_MOD),
            "_start_api_server_raw",
            leaves.api_server_unbound,
            probe=lambda _: _has_module(API_SERVER_MOD),
        ),
        *leaves.object_store_rebinds(store),
    ] + (
        # trees whose drivers start the outside services themselves (before init_orchestration_script)
        # have them turned off in the driver module (orchestration.driver_services_off)
        [
            Rebind("worker_manager", ou, "configure_logger", lambda _: leaves.noop),
            Rebind("worker_manager", ou, "maybe_start_periodic_pyspy_dump", lambda _: leaves.noop),
            Rebind("worker_manager", ou, "init_tracking", lambda _: leaves.noop),
        ]
        if importlib.util.find_spec(ORCHESTRATION_UTILS_MOD) is not None
        else []
    )


__all__ = [
    "LEAVES",
    "UNHOSTED",
    "SimCellTrainActor",
    "SimCommandActor",
    "SimHttpClient",
    "VirtualClock",
    "refactor_rebinds",
    "tcp_ready",
]
