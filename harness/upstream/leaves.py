"""The leaves of upstream Miles' orchestration, faked for a virtual-time run: what cannot
run on this machine or is not Miles' async logic. Everything between them runs as
upstream wrote it: the driver, ``create_placement_groups`` / ``create_rollout_manager`` /
``create_training_models`` (``miles/ray/placement_group.py``), the ``RolloutManager`` actor
with its data source, rollout function, post-processing and save/load
(``miles/ray/rollout/rollout_manager.py``), the engine fleet's start-up
(``rollout_server.py``, ``server_group.py``, ``addr_allocator.py``), the train actor group
(``miles/ray/actor_group.py``, ``train/actor_factory.py``) and the eval dispatcher.

The leaves (``LEAVES`` names each with the boundary it sits on; ``doctor`` lists them):

* **Ray** (``harness.upstream.vray``): one process, the virtual-time loop; actors,
  refs, placement groups and resources as Ray's documented semantics have them.
* **the SGLang engine** (``SimEngineActor`` in place of ``SGLangEngine``, the Ray actor
  upstream creates per engine in ``server_group.py``): its control calls (pause,
  continue, weight loads, version, memory occupation) go to the run's ``SimEngine``;
  ``/generate`` and ``/abort_request`` are served by the runner behind ``post``.
* **the trainer** (``SimTrainActor`` in place of ``MegatronTrainRayActor``, a subclass of
  the tree's own ``TrainRayActor``, ``train_actor_class``: upstream's constructor,
  ``set_rollout_manager`` and every member it does not fake run as written): ``init``
  loads its own checkpoint (Megatron's ``start_rollout_id = loaded_rollout_id + 1``,
  ``megatron_utils/actor.py:L212``), ``train`` trains the shard upstream's object store
  hands it on ``SimTrainer``, ``save_model`` writes its state and Megatron's tracker
  last, ``update_weights`` does what Megatron's weight updater does with the engines
  upstream passes in ``EnginesAndLock`` (pause in ``--pause-generation-mode``, load,
  version, continue; ``update_weight_from_tensor.py:L237-L320``) and then reports the
  version to upstream's rollout manager (``megatron_utils/actor.py:L781``).
* **process-wide singletons**: in Miles the driver, the rollout manager and every train
  actor are separate processes, each with its own object-store client
  (``miles/utils/object_store.py``: ``init_instance`` asserts it runs once per process);
  here they share one process, so the client is made once per run and shared.
* **outside services** left off as their flags leave them: logging set-up, tracking,
  the periodic py-spy dump, the control server and the mini fault-tolerance controller.
* **the rollout thread**: ``RolloutManager`` runs the rollout function through
  ``asyncio.to_thread(call_rollout_function, ...)``, which bridges into Miles' background
  loop (``rollout_manager.py:L226-L231``, ``compatibility.py:L42-L48``); here the
  function's coroutine is awaited on the one virtual-time loop. A manager that submits
  coroutines to that background loop itself (``get_async_loop().loop``, the lifecycle
  calls of trees with train admission holds) gets the same loop (``BackgroundLoopOnLoop``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.upstream.leaf_fakes import LeafMissing

TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's tracker file
NODE_IP = "127.0.0.1"
MASTER_PORT = 29500  # the train group's rendezvous port (rank 0 picks it)
TRAIN_ACTOR_MOD = "miles.ray.train_actor"
# what TrainRayActor.__init__ writes into its process' environment (train_actor.py:L66-L73)
PROCESS_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")


@dataclass(frozen=True)
class Leaf:
    name: str
    boundary: str
    why: str


LEAVES: tuple[Leaf, ...] = (
    Leaf("ray", "the `ray` package (harness.upstream.vray)", "Ray's cluster and transport; one process here"),
    Leaf(
        "sglang_engine",
        "miles/ray/rollout/server_group.py: SGLangEngine (the engine's Ray actor class)",
        "a GPU inference server; the run's SimEngine serves its control calls",
    ),
    Leaf(
        "sglang_http",
        "miles.utils.http_utils.post/get as the rollout code calls them (/generate, /abort_request, /workers)",
        "the engine's and router's HTTP API, served by the runner on SimEngine",
    ),
    Leaf(
        "train_actor",
        "miles/ray/train/actor_factory.py: MegatronTrainRayActor / FSDPTrainRayActor (a subclass of the tree's own "
        "TrainRayActor, miles/ray/train_actor.py)",
        "Megatron/FSDP training on GPUs (init's process group and checkpoint load, train, save, weight update); "
        "SimTrainer's step times, a small checkpoint of its own",
    ),
    Leaf(
        "memory_saver",
        "torch_memory_saver.utils.get_binary_path_from_package (miles/ray/train/actor_factory.py, "
        "--offload-train with Megatron: the train process' LD_PRELOAD hook)",
        "a CUDA allocator hook for the train process, which is the train actor leaf here",
    ),
    Leaf(
        "object_store_client",
        "miles/utils/object_store.py: init_instance (once per process)",
        "one process hosts every Ray process: one client per run, shared",
    ),
    Leaf(
        "rollout_thread",
        "miles/ray/rollout/rollout_manager.py: asyncio.to_thread(call_rollout_function, ...), get_async_loop()",
        "Miles' background-loop thread; the rollout coroutine and what the manager submits to that loop run "
        "on the one virtual-time loop",
    ),
    Leaf(
        "outside_services",
        "configure_logger, init_tracking, maybe_start_periodic_pyspy_dump, start_control_server, "
        "maybe_start_mini_ft_controller",
        "logging set-up, tracking, profiling and fault-tolerance services, left off as their flags leave them",
    ),
    Leaf(
        "api_server_socket",
        "miles/utils/ft_utils/api_server/server.py: _start_api_server_raw (--api-server-port: uvicorn on 0.0.0.0)",
        "a listening socket for the cluster's operators; upstream's cell registry and app are still built, "
        "nothing listens",
    ),
    Leaf(
        "sglang_server_args",
        "sglang.srt.server_args.ServerArgs.add_cli_args (SGLang's own --sglang-* engine flags)",
        "sglang is not installable next to a CPU torch; its flags only configure the engine process",
    ),
)


class _Leaf:
    """A member upstream reads that the fake lacks is ``LeafMissing`` naming it and the
    upstream line (a harness error, never upstream's AttributeError)."""

    role = ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        frame = sys._getframe(1)
        raise LeafMissing(self.role, name, frame.f_code.co_filename, frame.f_lineno)

    @classmethod
    def vray_missing_method(cls, name: str, frame: Any) -> LeafMissing:
        """What an actor handle of this leaf raises for a method it lacks (``vray.ActorHandle``):
        upstream's ``handle.NAME.remote(...)`` at ``frame`` is a harness error naming the member,
        not the ``AttributeError`` Ray gives for a class of upstream's own."""
        return LeafMissing(cls.role, name, frame.f_code.co_filename, frame.f_lineno)


# --------------------------------------------------------------------------- the engine


class SimEngineActor(_Leaf):
    """``SGLangEngine``'s Ray actor (``miles/backends/sglang_utils/sglang_engine.py``) on the
    run's ``SimEngine``: the control calls Miles' orchestration and weight updater make."""

    role = "sglang_engine"

    def __init__(self, args: Any, rank: int, worker_type: str = "regular", **_: Any) -> None:
        from harness.upstream import host

        self.run = host.current("sglang_engine")
        self.args, self.rank, self.worker_type = args, rank, worker_type
        self.weight_version: str | None = None
        self._next_port = 0

    # RayActor's helpers (miles/ray/ray_actor.py): the node's ip and ports, deterministic
    def _get_current_node_ip_and_free_port(self, start_port: int = 10000, consecutive: int = 1) -> tuple[str, int]:
        port = max(start_port, self._next_port)
        self._next_port = port + consecutive
        return NODE_IP, port

    def init(self, **addr_and_ports: Any) -> None:
        self.addr_and_ports = addr_and_ports

    async def pause_generation(self, mode: str = "retract") -> None:
        await self.run.engine.pause_generation(mode)

    async def continue_generation(self) -> None:
        await self.run.engine.continue_generation()

    async def update_weights_from_tensor(self, version: int, weights: Any) -> None:
        await self.run.engine.update_weights(version, weights)
        self.run.engine_loaded(version)

    def update_weight_version(self, weight_version: str) -> None:
        self.weight_version = weight_version

    def get_weight_version(self) -> str | None:
        return self.weight_version

    def flush_cache(self) -> None:
        return None

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        return None

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def health_generate(self, timeout: float = 5.0) -> bool:
        return True


# --------------------------------------------------------------------------- the trainer


class SimTrainActor(_Leaf):
    """The kernels of Megatron's train actor (``miles/backends/megatron_utils/actor.py``) on
    ``SimTrainer``, one per rank of upstream's ``RayTrainGroup``; the actor's rank 0 records
    for the run. On the rollout-manager shape the actor is ``train_actor_class()``: these
    kernels over the active tree's own ``TrainRayActor``, whose constructor,
    ``set_rollout_manager`` and other members run as upstream wrote them. Standing alone
    (a test's bare actor) its constructor is its own."""

    role = "train_actor"

    def __init__(
        self,
        args: Any,
        world_size: int,
        rank: int,
        master_addr: Any,
        master_port: Any,
        indep_dp_store_addr: Any = None,
        role: str = "actor",
        cell_index: int = 0,
    ) -> None:
        from harness.upstream import host

        self.run = host.current("train_actor")
        self.args, self._world_size, self._rank, self.role = args, world_size, rank, role
        self.master_addr: str = master_addr or NODE_IP
        self.master_port: int = master_port if master_addr else MASTER_PORT
        self._attach()

    def _attach(self, *args: Any, **kwargs: Any) -> None:
        """What the leaf keeps beside upstream's state: the run it records for, its weight
        updater's counter, the manager (until ``set_rollout_manager``). Given the
        constructor's arguments (``train_actor_class``), which this shape's leaf needs not."""
        from harness.upstream import host

        self.run = host.current("train_actor")
        self.rollout_manager: Any = None
        self.weight_version = 0  # the updater's counter: 0 in a new process (update_weight_from_tensor.py:L103)

    # RayActor's helper (miles/ray/ray_actor.py) reads the node's ip and binds a free port:
    # here the node is one address and the port fixed, so every run starts the same
    def _get_current_node_ip_and_free_port(self, start_port: int = 10000, consecutive: int = 1) -> tuple[str, int]:
        return NODE_IP, MASTER_PORT

    @property
    def records(self) -> bool:
        """The actor group's rank 0 trains, saves and updates for the run; a critic's
        values are not modelled (SimTrainer trains the policy)."""
        return self._rank == 0 and self.role == "actor"

    def get_master_addr_and_port(self) -> tuple[str, int]:
        return self.master_addr, self.master_port

    def init(self, args: Any, role: str, with_ref: bool = False, with_opd_teacher: bool = False, **_: Any) -> int:
        """Megatron's init: the process group (``TrainRayActor.init``: one rank per actor of
        the group), then the checkpoint under ``--load`` (the tracker names the rollout),
        ``start_rollout_id = loaded + 1``; none: 0 (``megatron_utils/actor.py:L205-L218``)."""
        self.args, self.role = args, role
        self.with_ref, self.with_opd_teacher = with_ref, with_opd_teacher
        args.rank, args.world_size = self._rank, self._world_size
        self.train_parallel_config = {"dp_size": self._world_size}
        loaded = self._load_checkpoint(args)
        if "_heartbeat" in self.__dict__:  # upstream's heartbeat, bumped at the end of its init
            self._heartbeat.bump()
        return 0 if loaded is None else loaded + 1

    def _load_checkpoint(self, args: Any) -> int | None:
        """The checkpoint ``save_model`` wrote under ``--load``: the rollout its tracker names
        (``None``: none); rank 0 hands its state to the run."""
        loaded = read_checkpoint(args.load)
        if self.records:
            self.run.trainer_loaded(loaded)
        return None if loaded is None else int(loaded["rollout_id"])

    def _get_parallel_config(self) -> dict[str, Any]:
        return self.train_parallel_config

    async def train(self, rollout_id: int, rollout_data_ref: Any, external_data: Any = None, **_: Any) -> None:
        from miles.utils.data import process_rollout_data

        data, _got = process_rollout_data(self.args, rollout_data_ref, self._rank, self._world_size, None)
        if self.records:
            await self.run.train_shard(rollout_id, data)

    def save_model(self, rollout_id: int, force_sync: bool = False) -> None:
        if self.records and self.args.save:
            state = self.run.trainer_state()
            write_checkpoint(self.args.save, rollout_id, state)
            self.run.trainer_saved(rollout_id, state)

    async def update_weights(self, info: Any) -> None:
        """Megatron's weight update with the engines upstream passes (``EnginesAndLock``)."""
        import ray

        if not self.records:
            return
        self.weight_version += 1
        # FSDP's updater pauses in SGLang's default mode (fsdp_utils/update_weight_utils.py:L74)
        mode = "retract" if self.args.train_backend == "fsdp" else self.args.pause_generation_mode
        await self.run.weight_update(self.weight_version, list(info.rollout_engines), mode)
        # trees before the trainer passed the version (the engine's was polled from the router)
        # have no set_weight_version on the manager, and their Megatron actor makes no call
        if hasattr(self.rollout_manager, "set_weight_version"):
            ray.get(self.rollout_manager.set_weight_version.remote(self.weight_version))
        self.run.weight_update_reported(self.weight_version)

    def sleep(self, tags: Any = None) -> None:
        return None

    def wake_up(self, tags: Any = None) -> None:
        return None

    def clear_memory(self) -> None:
        return None


@contextmanager
def _own_process() -> Iterator[None]:
    """The block runs as in a Ray actor's own process: what it writes into the process'
    environment (``PROCESS_ENV``) and the global ``random`` stream it draws from
    (``random.randint`` for a master port) are put back after, so that the one process
    hosting every actor is not changed by one of them."""
    env = {k: os.environ.get(k) for k in PROCESS_ENV}
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def train_actor_class(kernels: type = SimTrainActor) -> type:
    """The train actor leaf on the rollout-manager shape: ``kernels`` (the faked Megatron
    kernels: init's checkpoint load, train, save, weight update, sleep and wake-up) over
    the active tree's own ``TrainRayActor`` (``miles/ray/train_actor.py``), imported now,
    under the in-process Ray. Its constructor runs upstream's (``_own_process``; the logger
    it configures is the leaf ``outside_services``), then attaches the leaf's state; every
    member the kernels do not define (``set_rollout_manager``, a pull request's new
    admission or heartbeat members) is upstream's."""
    import importlib

    base = importlib.import_module(TRAIN_ACTOR_MOD).TrainRayActor

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        with _own_process():
            base.__init__(self, *args, **kwargs)
        self._attach(*args, **kwargs)

    return type(
        kernels.__name__,
        (kernels, base),
        {
            "__init__": __init__,
            "__module__": __name__,
            "__qualname__": kernels.__qualname__,
            "__doc__": kernels.__doc__,
        },
    )


def train_actor_rebinds() -> list:
    """The outside service ``TrainRayActor.__init__`` starts (``configure_logger``), left off."""
    from harness.upstream.host import Rebind, module

    return [Rebind("train_actor", module(TRAIN_ACTOR_MOD), "configure_logger", lambda _: noop)]


def read_checkpoint(load: str | None) -> dict | None:
    """What ``SimTrainActor.save_model`` wrote under ``load``: the tracker names the rollout,
    ``iter_<N>/trainer.json`` holds the state; no tracker: nothing to load."""
    if not load or not (Path(load) / TRACKER).is_file():
        return None
    n = int((Path(load) / TRACKER).read_text().strip())
    state = json.loads((Path(load) / f"iter_{n:07d}" / "trainer.json").read_text())
    return {"rollout_id": n, **state}


def write_checkpoint(save: str | None, rollout_id: int, state: dict) -> None:
    """The trainer's state into ``iter_<N>/trainer.json``, then the tracker = N, last, as
    Megatron writes it (a crash before the tracker leaves the previous checkpoint)."""
    if not save:
        return
    folder = Path(save) / f"iter_{rollout_id:07d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer.json").write_text(json.dumps(state))
    (Path(save) / TRACKER).write_text(str(rollout_id))


# --------------------------------------------------------------------------- module-level leaves


def _fake_module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name, "miles-harness leaf: the trainer backend is faked at the train actor")
    mod.__miles_harness_fake__ = True  # type: ignore[attr-defined]
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


MEMORY_SAVER_HOOK = "torch_memory_saver_hook_mode_preload"
# what allocate_gpus_for_actor checks the hook for before --offload-train-target disk
MEMORY_SAVER_DISK_MARK = b"TMS_INIT_ENABLE_DISK_BACKUP"


def memory_saver_binary_path(name: str) -> Path:
    """``torch_memory_saver.utils.get_binary_path_from_package``: the hook library the train
    process preloads (``allocate_gpus_for_actor`` puts it in the actor's ``LD_PRELOAD``). No
    process starts here, so it is a small file naming both backends, made once."""
    import tempfile

    path = Path(tempfile.gettempdir()) / f"miles-harness-{name}.so"
    if not path.is_file():
        path.write_bytes(b"miles-harness leaf: TMS_INIT_ENABLE_CPU_BACKUP " + MEMORY_SAVER_DISK_MARK + b"\n")
    return path


def trainer_backend_modules(actor: type = SimTrainActor) -> dict[str, types.ModuleType]:
    """The train actor classes upstream imports (``allocate_gpus_for_actor``; the trainer pool's
    ``worker_class`` path on the controller-executor shape, ``miles/ray/specs/train.py:L36-L39``),
    as ``actor``, and the memory saver's hook path it reads with ``--offload-train``
    (``miles/ray/train/actor_factory.py:L44-L46``; ``--use-critic`` and ``--colocate`` set it)."""
    utils = _fake_module("torch_memory_saver.utils", get_binary_path_from_package=memory_saver_binary_path)
    return {
        "torch_memory_saver": _fake_module("torch_memory_saver", utils=utils),
        "torch_memory_saver.utils": utils,
        "miles.backends.megatron_utils.actor": _fake_module(
            "miles.backends.megatron_utils.actor", MegatronTrainRayActor=actor
        ),
        "miles.backends.fsdp_utils": _fake_module("miles.backends.fsdp_utils", FSDPTrainRayActor=actor),
        "miles.backends.fsdp_utils.actor": _fake_module("miles.backends.fsdp_utils.actor", FSDPTrainRayActor=actor),
    }


class SharedObjectStore:
    """``object_store.init_instance`` / ``get_instance`` for one process hosting every
    Ray process: the client upstream's ``_create_instance`` makes, made once per run."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.instance: Any = None

    def init_instance(self, args: Any, *, contribute_segment: bool | None = None) -> Any:
        if self.instance is None:
            self.instance = self.module._create_instance(args, contribute_segment=contribute_segment)
        return self.instance

    def get_instance(self) -> Any:
        assert self.instance is not None, "object store instance is not initialized; call init_instance first"
        return self.instance


class OnLoopAsyncio:
    """``asyncio`` as ``rollout_manager.py`` sees it: ``to_thread`` runs the call on the
    loop and awaits a coroutine it returns (Miles bridges it into its background loop).
    The work starts a loop step after the call, as the hand-off to a thread suspends the
    caller of ``asyncio.to_thread`` before the thread runs anything; the call itself
    (``call_rollout_function_on_loop``, the runner's ``call_rollout_function``) only
    builds the coroutine, and records what the manager passed, in the manager's step."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    def to_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """The call's coroutine runs as a task of its own that cancelling the caller does
        not cancel: a thread cannot be cancelled, and Miles' ``call_rollout_function``
        blocks it until the rollout coroutine ends on the background loop
        (``compatibility.py``), so a cancelled ``await asyncio.to_thread(...)`` leaves the
        rollout running, as it does on a cluster."""
        name = f"asyncio.to_thread({getattr(fn, '__qualname__', fn)})"

        async def run() -> Any:
            out = fn(*args, **kwargs)
            if not inspect.isawaitable(out):
                return out
            if not inspect.iscoroutine(out):
                out = _awaited(out)

            async def thread() -> Any:  # its first step is the task's: a loop step after the call
                return await out

            # a task is named by what it runs (the fault sweep lists orphaned tasks)
            thread.__qualname__ = name
            return await asyncio.shield(asyncio.ensure_future(thread()))

        run.__qualname__ = name  # the thread and what awaits it: one orphan, the rollout still running
        return run()


class BackgroundLoopOnLoop(_Leaf):
    """Miles' background loop (``miles.utils.async_utils.get_async_loop()``, an
    ``AsyncLoopThread``) as the module that runs the rollout function sees it: the loop the
    rollout coroutine runs on, which here is the one virtual-time loop. On a cluster the
    rollout function and every coroutine the manager submits to that loop
    (``asyncio.run_coroutine_threadsafe(coro, get_async_loop().loop)``) share Miles' one
    background thread; a real thread here would run them on a real clock beside the
    virtual one, where the virtual loop cannot wait for it."""

    role = "rollout_thread"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()


def background_loop_on_loop() -> BackgroundLoopOnLoop:
    """``get_async_loop`` for the rollout-thread leaf."""
    return BackgroundLoopOnLoop()


async def _awaited(out: Any) -> Any:
    return await out


def call_rollout_function_on_loop(fn: Any, input: Any) -> Any:
    """``compatibility.call_rollout_function`` with the coroutine returned, not run on
    Miles' background loop (``OnLoopAsyncio.to_thread`` awaits it)."""
    return fn(input)


def run_on_loop(coro: Any) -> Any:
    """Miles' ``async_utils.run(coro)`` (``miles/utils/async_utils.py:L40-L63``: the calling
    thread blocks while the coroutine runs on Miles' background loop, where
    ``call_rollout_function`` ran the rollout function and its tasks) on the one loop that
    runs them here: the coroutine runs as a task of the running loop and the caller blocks
    on it as on a ``ray.get`` (vray steps the loop until it ends). So what the rollout
    function started (the fully-async worker) is closed on the loop it runs on."""
    from harness.upstream import vray

    async def background_loop() -> Any:
        return await coro

    background_loop.__qualname__ = f"async_utils.run({getattr(coro, '__qualname__', coro)})"
    return vray.get(vray.remote(background_loop).remote())


def rollout_rebinds(seam: str, module: Callable[[], Any], run: Any, observed_load: Callable) -> list:
    """The rollout-thread leaf and the observation of the rollout function, in the module
    that runs it (``RolloutManager``'s, or ``RolloutExecutor``'s on the refactored shape),
    with its outside services left off."""
    from harness.upstream.host import Rebind

    return [
        Rebind(seam, module, "asyncio", lambda _: OnLoopAsyncio()),
        Rebind(seam, module, "call_rollout_function", lambda _: run.call_rollout_function),
        # trees whose manager submits the rollout function's lifecycle calls to Miles'
        # background loop itself (``rollout_manager.py`` importing ``get_async_loop``)
        Rebind(seam, module, "get_async_loop", lambda _: background_loop_on_loop),
        Rebind(seam, module, "load_rollout_function", lambda f: observed_load(f, run)),
        Rebind(seam, module, "configure_logger", lambda _: noop),
        Rebind(seam, module, "init_tracking", lambda _: noop),
    ]


def object_store_rebinds(store: Callable[[], Any]) -> list:
    """One object-store client for the run, shared by every in-process Ray process."""
    from harness.upstream.host import Rebind

    shared = SharedObjectStore(store())
    return [
        Rebind("object_store", store, "init_instance", lambda _: shared.init_instance),
        Rebind("object_store", store, "get_instance", lambda _: shared.get_instance),
    ]


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def api_server_unbound(start_raw: Any) -> Any:
    """``_start_api_server_raw(registry, port)`` (leaf ``api_server_socket``): upstream's app is
    built over the registry ``start_api_server`` made (``_create_api_app``), and returned
    without a server thread or a socket: a run binds no port of the host, and a port that
    would need privileges or is taken on this machine is no finding of the tree's."""
    create_app = start_raw.__globals__["_create_api_app"]

    def start(registry: Any, port: int) -> Any:
        return create_app(registry)

    return start


__all__ = [
    "LEAVES",
    "BackgroundLoopOnLoop",
    "Leaf",
    "OnLoopAsyncio",
    "SharedObjectStore",
    "SimEngineActor",
    "SimTrainActor",
    "background_loop_on_loop",
    "call_rollout_function_on_loop",
    "noop",
    "object_store_rebinds",
    "read_checkpoint",
    "rollout_rebinds",
    "run_on_loop",
    "train_actor_class",
    "train_actor_rebinds",
    "trainer_backend_modules",
    "write_checkpoint",
]
