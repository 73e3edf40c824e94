"""Every point where the harness touches upstream Miles beyond its public flags, how it is
probed in a tree, and what the harness does without it.

The harness runs upstream's own code (``harness.upstream.runner``); to do so it rebinds
some of upstream's module-level names, wraps some methods, installs the lifecycle sink
and reads a few private attributes. A Miles checkout other than the pinned one may lack
any of them. ``probe(tree)`` reads the tree's source files (``ast``, nothing imported,
so a tree that does not import is still described) and returns a ``TreeReport``: for
every seam, found or missing and where it looked, and per driver whether the harness
can run it faithfully. ``miles-harness doctor --miles-src PATH`` prints it; the
differential, the fault sweep and the pytest tier refuse what the report refuses,
naming the seam and the file, instead of reporting the harness' blind spot as an
upstream finding.

Drivers: ``sync`` (``train.py``, ``InferenceRolloutFn``), ``one-step``
(``train_async.py`` without ``--fully-async``) and ``fully-async``.

A seam with a ``fallback`` is not needed when the fallback is found: the runner then
works through the fallback (the lifecycle sink announces each sample on the pinned tree;
on a tree whose ``generate_and_rm`` does not announce, the runner wraps
``generate_and_rm`` itself). An ``optional`` seam only costs a convenience.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from harness.upstream.drivers import Driver
from harness.upstream.harness_errors import HarnessError

DRIVERS: tuple[Driver, ...] = tuple(Driver)
ROLLING = frozenset(DRIVERS)
INFERENCE = frozenset({"sync", "one-step"})
FULLY = frozenset({"fully-async"})

COMMON = "miles/rollout/inference_rollout/inference_rollout_common.py"
TRAIN_MOD = "miles/rollout/inference_rollout/inference_rollout_train.py"
FULLY_MOD = "miles/rollout/fully_async_rollout.py"
BUFFER_MOD = "miles/rollout/fully_async_data_buffer.py"
SINGLE_TURN = "miles/rollout/generate_hub/single_turn.py"
BASE_TYPES = "miles/rollout/base_types.py"
DATA_SOURCE = "miles/rollout/data_source.py"
LIFECYCLE = "miles/utils/lifecycle.py"
FILTERS = "miles/rollout/filter_hub/base_types.py"
RM_MOD = "miles/ray/rollout/rollout_manager.py"
SERVER_GROUP_MOD = "miles/ray/rollout/server_group.py"
TRAIN_ACTOR_MOD = "miles/ray/train_actor.py"
OBJECT_STORE_MOD = "miles/utils/object_store.py"
EXECUTOR_MOD = "miles/ray/rollout/rollout_executor.py"
CONTROLLER_MOD = "miles/ray/rollout/inference_controller.py"
PLACEMENT_MOD = "miles/ray/placement_group.py"
WORKER_MANAGER_MOD = "miles/utils/workers/ray_worker_manager.py"
COMMAND_ACTOR_MOD = "miles/utils/workers/command_actor.py"
HTTP_UTILS = "miles/utils/http_utils.py"
SGLANG_ENGINE_MOD = "miles/backends/sglang_utils/sglang_engine.py"

# The two shapes of upstream's orchestration layer, told apart by what the drivers call:
# ``create_rollout_manager`` (one ``RolloutManager`` actor runs the data source, the rollout
# function and the engines' control) or ``create_rollout_components`` (an
# ``InferenceController`` for the engines and a ``RolloutExecutor`` for the rollout, started
# by a worker manager from worker specs, ``miles/ray/placement_group.py``).
ROLLOUT_MANAGER = "rollout-manager"
CONTROLLER_EXECUTOR = "controller-executor"
SHAPES = (ROLLOUT_MANAGER, CONTROLLER_EXECUTOR)
SHAPE_CALLS = {ROLLOUT_MANAGER: "create_rollout_manager", CONTROLLER_EXECUTOR: "create_rollout_components"}
# the shapes the harness hosts: upstream's own orchestration over the rollout-manager
# shape's leaves (harness.upstream.leaves) and the controller-executor shape's
# (harness.upstream.leaves_refactor)
HOSTED: tuple[str, ...] = (ROLLOUT_MANAGER, CONTROLLER_EXECUTOR)


class SeamMissing(HarnessError):
    """The tree lacks a seam the harness needs for what was asked: running it would
    report the harness' blind spot as upstream's behaviour. ``seams`` are the missing
    seams' names; the message names each with its file and the consequence."""


# --------------------------------------------------------------------------- source facts


@dataclass
class _Module:
    """What a file binds: module-level names, classes with their methods, the attribute
    names each function reads or assigns, the annotated fields of each class."""

    exists: bool
    names: set[str] = field(default_factory=set)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (module, name there)
    methods: dict[str, set[str]] = field(default_factory=dict)
    fields: dict[str, set[str]] = field(default_factory=dict)
    attrs: dict[str, set[str]] = field(default_factory=dict)  # "func" or "Class.method" -> attribute names
    async_defs: set[str] = field(default_factory=set)  # module-level `async def` functions


def _attrs_of(fn: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}


@lru_cache(maxsize=64)
def _parse(path: Path) -> _Module:
    if not path.is_file():
        return _Module(exists=False)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError:
        return _Module(exists=False)
    m = _Module(exists=True)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            m.names.add(node.name)
            m.attrs[node.name] = _attrs_of(node)
            if isinstance(node, ast.AsyncFunctionDef):
                m.async_defs.add(node.name)
        elif isinstance(node, ast.ClassDef):
            m.names.add(node.name)
            m.methods[node.name] = set()
            m.fields[node.name] = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    m.methods[node.name].add(item.name)
                    m.attrs[f"{node.name}.{item.name}"] = _attrs_of(item)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    m.fields[node.name].add(item.target.id)
        elif isinstance(node, ast.Import):
            m.names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                m.names.add(a.asname or a.name)
                if node.module and node.level == 0:
                    m.imported[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            m.names.update(t.id for t in targets if isinstance(t, ast.Name))
    return m


class _Tree:
    def __init__(self, root: Path) -> None:
        self.root = root

    def mod(self, rel: str) -> _Module:
        return _parse((self.root / rel).resolve())

    def name(self, rel: str, name: str, depth: int = 4) -> bool:
        """``rel`` binds ``name`` at module level; a name imported from another module
        of the tree must be defined there too (followed ``depth`` imports deep)."""
        m = self.mod(rel)
        if name not in m.names:
            return False
        origin = m.imported.get(name)
        if origin is None or not origin[0].startswith("miles.") or depth == 0:
            return True
        module, there = origin
        base = self.root / Path(*module.split("."))
        target = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not target.is_file():
            return base.is_dir() and (base / f"{there}.py").is_file()  # a submodule imported by name
        return self.name(str(target.relative_to(self.root)), there, depth - 1)

    def method(self, rel: str, cls: str, name: str) -> bool:
        return name in self.mod(rel).methods.get(cls, set())

    def reads(self, rel: str, where: str, attr: str) -> bool:
        return attr in self.mod(rel).attrs.get(where, set())


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Seam:
    name: str
    file: str  # relative to the tree
    looks_for: str  # what the probe looks for in that file
    role: str  # what the harness does with it
    without: str  # what the harness does when the tree lacks it
    drivers: frozenset
    probe: Callable[[_Tree], bool]
    optional: bool = False
    fallback: str | None = None  # a seam that replaces this one when found
    shapes: frozenset = frozenset(SHAPES)  # the orchestration shapes it belongs to
    explain: Callable[[_Tree], str] | None = None  # what the probe found and did not find


def _all(*checks: Callable[[_Tree], bool]) -> Callable[[_Tree], bool]:
    return lambda t: all(c(t) for c in checks)


def driver_shape(t: _Tree, driver_file: str) -> str | None:
    """The orchestration shape ``driver_file`` runs: the one whose entry point it binds."""
    return next((shape for shape, call in SHAPE_CALLS.items() if t.name(driver_file, call)), None)


def _driver_found(driver_file: str) -> Callable[[_Tree], bool]:
    """A module-level ``train`` (``def`` or ``async def``) over either shape's entry point."""
    return lambda t: t.name(driver_file, "train") and driver_shape(t, driver_file) is not None


def _driver_explain(driver_file: str) -> Callable[[_Tree], str]:
    def explain(t: _Tree) -> str:
        m = t.mod(driver_file)
        if not m.exists:
            return f"{driver_file}: no such file (or it does not parse)"
        train = (
            ("`async def train` found" if "train" in m.async_defs else "`train` found")
            if "train" in m.names
            else "no module-level `train`"
        )
        calls = "; ".join(
            f"`{c}` ({shape}) {'found' if t.name(driver_file, c) else 'not found'}" for shape, c in SHAPE_CALLS.items()
        )
        return f"{train}; {calls}"

    return explain


SEAMS: tuple[Seam, ...] = (
    Seam(
        "lifecycle_sink",
        COMMON,
        "`generate_and_rm` calls `TrajectoryLifecycle().sink.gen_start(sample)`",
        "tells the runner which sample each /generate request is for (the payload carries only token ids)",
        "the runner announces each sample from its own wrapper of `generate_and_rm` (seam generate_and_rm)",
        ROLLING,
        lambda t: t.name(COMMON, "TrajectoryLifecycle") and t.reads(COMMON, "generate_and_rm", "gen_start"),
        fallback="generate_and_rm",
    ),
    Seam(
        "generate_and_rm",
        COMMON,
        "module-level `generate_and_rm`, called by `generate_and_rm_group`",
        "rebound to announce each sample when the lifecycle sink does not",
        "not needed while the lifecycle sink is found; without both, no /generate can be attributed: refused",
        ROLLING,
        lambda t: t.name(COMMON, "generate_and_rm") and t.name(COMMON, "generate_and_rm_group"),
        optional=True,
    ),
    Seam(
        "trajectory_lifecycle",
        LIFECYCLE,
        "class `TrajectoryLifecycle` with a `sink`",
        "the runner's sink is installed there; the nested-group generate function announces its turns through it",
        "no sink to install: refused",
        ROLLING,
        lambda t: (
            t.name(LIFECYCLE, "TrajectoryLifecycle") and t.reads(LIFECYCLE, "TrajectoryLifecycle.__init__", "sink")
        ),
    ),
    Seam(
        "make_submission_scheduler(one-step)",
        TRAIN_MOD,
        "module-level `make_submission_scheduler`",
        "wrapped: the `done` set of each `wait_for_progress` is walked in a pinned order (by first sample index)",
        "upstream would walk `done` sets in memory-address order: runs not reproducible, refused",
        INFERENCE,
        lambda t: t.name(TRAIN_MOD, "make_submission_scheduler"),
    ),
    Seam(
        "make_submission_scheduler(fully-async)",
        FULLY_MOD,
        "module-level `make_submission_scheduler`",
        "wrapped: pinned `done` order, and the runner follows the worker's waits for its group accounting",
        "set order not pinned and groups not accounted: refused",
        FULLY,
        lambda t: t.name(FULLY_MOD, "make_submission_scheduler"),
    ),
    Seam(
        "generate_and_rm_group(one-step)",
        TRAIN_MOD,
        "module-level `generate_and_rm_group`",
        "wrapped: the end of each group task is recorded (`group_done`), its task keyed for set order",
        "group ends unrecorded, set order unkeyed: refused",
        INFERENCE,
        lambda t: t.name(TRAIN_MOD, "generate_and_rm_group"),
    ),
    Seam(
        "generate_and_rm_group(fully-async)",
        FULLY_MOD,
        "module-level `generate_and_rm_group`",
        "wrapped: the end of each group task is recorded (`group_done`), its task keyed for set order",
        "group ends unrecorded, set order unkeyed: refused",
        FULLY,
        lambda t: t.name(FULLY_MOD, "generate_and_rm_group"),
    ),
    Seam(
        "http_post(single_turn)",
        SINGLE_TURN,
        "module-level `post` (from `miles.utils.http_utils`)",
        "rebound: /generate is served by the simulated engine",
        "no engine to talk to: refused",
        ROLLING,
        lambda t: t.name(SINGLE_TURN, "post"),
    ),
    Seam(
        "http_post_get(one-step)",
        TRAIN_MOD,
        "module-level `post` and `get`",
        "rebound: /abort_request and the router's worker list are served by the runner",
        "the end-of-rollout abort would go to the network: refused",
        INFERENCE,
        lambda t: t.name(TRAIN_MOD, "post") and t.name(TRAIN_MOD, "get"),
    ),
    Seam(
        "as_completed_async",
        TRAIN_MOD,
        "module-level `as_completed_async`",
        "rebound: the groups already done at the end-of-rollout abort are taken in the pinned set order",
        "that order would follow memory addresses: refused",
        INFERENCE,
        lambda t: t.name(TRAIN_MOD, "as_completed_async"),
    ),
    Seam(
        "submit_generate_tasks",
        TRAIN_MOD,
        "module-level `submit_generate_tasks`",
        "wrapped: each group task holds its group from creation (the runner's group accounting)",
        "groups between creation and first step would be counted lost (false conservation findings): refused",
        INFERENCE,
        lambda t: t.name(TRAIN_MOD, "submit_generate_tasks"),
    ),
    Seam(
        "call_dynamic_filter",
        TRAIN_MOD,
        "module-level `call_dynamic_filter`",
        "wrapped: a group the dynamic filter rejects is recorded as dropped when upstream drops it",
        "filter rejects would read as lost groups: refused",
        INFERENCE,
        lambda t: t.name(TRAIN_MOD, "call_dynamic_filter"),
    ),
    Seam(
        "tqdm",
        TRAIN_MOD,
        "module-level `tqdm`",
        "rebound with `disable=True` (the progress bar)",
        "the one-step progress bar prints on every rollout",
        INFERENCE,
        lambda t: t.name(TRAIN_MOD, "tqdm"),
        optional=True,
    ),
    Seam(
        "weight_version_source",
        BASE_TYPES,
        "field `weight_version` of `RolloutFnTrainInput`",
        "the trainer passes the engine weight version to the drain (the staleness filter reads it)",
        "upstream polls the router's /model_info on a real-time cache instead: the drain's version would not "
        "be the trainer's, and the runner has no virtual-time router: fully-async refused",
        FULLY,
        lambda t: "weight_version" in t.mod(BASE_TYPES).fields.get("RolloutFnTrainInput", set()),
    ),
    Seam(
        "data_buffer",
        BUFFER_MOD,
        "class `DefaultDataBuffer` (`put`, `get`, `self._buffer`, `self._capacity`) and `group_oldest_weight_version`",
        "built through `--custom-async-data-buffer-path`; `put`/`get` wrapped to record events; its queue read "
        "for the group accounting",
        "no buffer to observe: fully-async refused",
        FULLY,
        _all(
            lambda t: t.method(BUFFER_MOD, "DefaultDataBuffer", "put"),
            lambda t: t.method(BUFFER_MOD, "DefaultDataBuffer", "get"),
            lambda t: t.reads(BUFFER_MOD, "DefaultDataBuffer.__init__", "_buffer"),
            lambda t: t.reads(BUFFER_MOD, "DefaultDataBuffer.__init__", "_capacity"),
            lambda t: t.name(BUFFER_MOD, "group_oldest_weight_version"),
        ),
    ),
    Seam(
        "unused_samples_handler",
        FULLY_MOD,
        "attribute `FullyAsyncRolloutFn._handle_unused` (set in `__init__`)",
        "wrapped: the groups the buffer rejects (stale or aborted) are recorded with the handler's choice",
        "stale and aborted groups would read as lost: fully-async refused",
        FULLY,
        lambda t: t.reads(FULLY_MOD, "FullyAsyncRolloutFn.__init__", "_handle_unused"),
    ),
    Seam(
        "submit_one_group",
        FULLY_MOD,
        "method `FullyAsyncRolloutFn._submit_one_group`",
        "wrapped: each group task holds its group from creation (the runner's group accounting)",
        "a group between creation and first step would be counted lost: fully-async refused",
        FULLY,
        lambda t: t.method(FULLY_MOD, "FullyAsyncRolloutFn", "_submit_one_group"),
    ),
    Seam(
        "worker_task",
        FULLY_MOD,
        "attribute `FullyAsyncRolloutFn._worker`",
        "read after the run: a worker that died after the last drain has its exception reported with the result",
        "that exception is left to the garbage collector's log",
        FULLY,
        lambda t: t.reads(FULLY_MOD, "FullyAsyncRolloutFn.__init__", "_worker"),
        optional=True,
    ),
    Seam(
        "data_source",
        DATA_SOURCE,
        "class `RolloutDataSourceWithBuffer` (`get_samples`, `add_samples`, `buffer`)",
        "instance methods wrapped: taken and recycled groups are recorded; its queue read for the accounting",
        "no prompt source: refused",
        ROLLING,
        _all(
            lambda t: t.name(DATA_SOURCE, "RolloutDataSourceWithBuffer"),
            lambda t: t.method(DATA_SOURCE, "RolloutDataSourceWithBuffer", "add_samples"),
        ),
    ),
    Seam(
        "rollout_manager",
        RM_MOD,
        "class `RolloutManager` (`generate`, `save`, `load`, `set_weight_version`) running the rollout function "
        "through `asyncio.to_thread(call_rollout_function, ...)`, built with `load_rollout_function`",
        "runs as upstream wrote it; `to_thread` awaits the rollout coroutine on the virtual-time loop (leaf "
        "rollout_thread), `load_rollout_function` and `call_rollout_function` observed",
        "the rollout manager's generate cannot be hosted in one process: refused",
        ROLLING,
        _all(
            lambda t: t.method(RM_MOD, "RolloutManager", "generate"),
            lambda t: t.name(RM_MOD, "call_rollout_function"),
            lambda t: t.name(RM_MOD, "load_rollout_function"),
            lambda t: t.name(RM_MOD, "asyncio"),
        ),
        shapes=frozenset({ROLLOUT_MANAGER}),
    ),
    Seam(
        "engine_actor",
        SERVER_GROUP_MOD,
        "module-level `SGLangEngine`, the engine's Ray actor class `ServerGroup.start_engines` creates",
        "replaced by the leaf SimEngineActor: the engine's control calls go to the run's SimEngine",
        "the engine fleet would start real SGLang servers: refused",
        ROLLING,
        lambda t: t.name(SERVER_GROUP_MOD, "SGLangEngine", depth=0),
        shapes=frozenset({ROLLOUT_MANAGER}),
    ),
    Seam(
        "train_actor",
        TRAIN_ACTOR_MOD,
        "class `TrainRayActor` (`set_rollout_manager`), the base of Megatron's and FSDP's train actors",
        "the base of the train actor leaf: its constructor, `set_rollout_manager` and every member the leaf does "
        "not fake run as upstream wrote them; the leaf fakes the kernels (init's checkpoint load and process "
        "group, train, save, weight update) and the constructor's logger",
        "the train actor group would start Megatron on GPUs: refused",
        ROLLING,
        lambda t: t.method(TRAIN_ACTOR_MOD, "TrainRayActor", "set_rollout_manager"),
        shapes=frozenset({ROLLOUT_MANAGER}),
    ),
    Seam(
        "rollout_executor",
        EXECUTOR_MOD,
        "class `RolloutExecutor` (`init`, `get`, `save`, `load`, `set_weight_version`) running the rollout function "
        "through `asyncio.to_thread(call_rollout_function, ...)`, built with `load_rollout_function`",
        "runs as upstream wrote it; `to_thread` awaits the rollout coroutine on the virtual-time loop (leaf "
        "rollout_thread), `load_rollout_function` and `call_rollout_function` observed",
        "the rollout executor's get cannot be hosted in one process: refused",
        ROLLING,
        _all(
            lambda t: t.method(EXECUTOR_MOD, "RolloutExecutor", "get"),
            lambda t: t.method(EXECUTOR_MOD, "RolloutExecutor", "set_weight_version"),
            lambda t: t.name(EXECUTOR_MOD, "call_rollout_function"),
            lambda t: t.name(EXECUTOR_MOD, "load_rollout_function"),
            lambda t: t.name(EXECUTOR_MOD, "asyncio"),
        ),
        shapes=frozenset({CONTROLLER_EXECUTOR}),
    ),
    Seam(
        "inference_controller",
        CONTROLLER_MOD,
        "class `InferenceController` (`start_update_weights`, `end_update_weights`, `prepare_rollout`)",
        "runs as upstream wrote it: it hands the trainer the engines' API clients for each weight update",
        "no weight-update window to host: refused",
        ROLLING,
        _all(
            lambda t: t.method(CONTROLLER_MOD, "InferenceController", "start_update_weights"),
            lambda t: t.method(CONTROLLER_MOD, "InferenceController", "end_update_weights"),
            lambda t: t.method(CONTROLLER_MOD, "InferenceController", "prepare_rollout"),
        ),
        shapes=frozenset({CONTROLLER_EXECUTOR}),
    ),
    Seam(
        "worker_manager",
        WORKER_MANAGER_MOD,
        "class `RayWorkerManager` (`launch`, `init`, `get_worker_infos`), the Ray worker transport the "
        "worker specs are started on",
        "the worker transport: it starts every worker of the specs as a Ray actor (vray)",
        "the workers cannot be started in one process: refused",
        ROLLING,
        _all(
            lambda t: t.method(WORKER_MANAGER_MOD, "RayWorkerManager", "launch"),
            lambda t: t.method(WORKER_MANAGER_MOD, "RayWorkerManager", "get_worker_infos"),
        ),
        shapes=frozenset({CONTROLLER_EXECUTOR}),
    ),
    Seam(
        "engine_process",
        COMMAND_ACTOR_MOD,
        "class `CommandActor` (`run`, `shutdown`): the actor that runs an engine's or router's launch command",
        "the SGLang server and router processes: a leaf that starts nothing (the run's SimEngine serves them)",
        "the engine fleet would start real SGLang servers: refused",
        ROLLING,
        lambda t: t.method(COMMAND_ACTOR_MOD, "CommandActor", "run"),
        shapes=frozenset({CONTROLLER_EXECUTOR}),
    ),
    Seam(
        "engine_http",
        HTTP_UTILS,
        "class `GeneralHttpClientProvider` (`client`): the HTTP client every engine API call goes through",
        "the engines' HTTP API (pause, continue, weight loads, health) served by the run's SimEngine",
        "the engines' control calls would go to the network: refused",
        ROLLING,
        lambda t: t.method(HTTP_UTILS, "GeneralHttpClientProvider", "client"),
        shapes=frozenset({CONTROLLER_EXECUTOR}),
    ),
    Seam(
        "engine_launch",
        SGLANG_ENGINE_MOD,
        "module-level `launch_server_process` and `ServerArgs`, called by `SGLangEngine._init_normal`",
        "the served run (harness.serve.upstream_e2e) keeps upstream's `SGLangEngine` actor and fakes only the "
        "server process it launches: a CPU server on the host and port upstream allocated (leaf sglang_server)",
        "the served run cannot start its engines through upstream's engine actor: refused (virtual-time runs "
        "replace the engine actor and do not need it)",
        ROLLING,
        _all(
            lambda t: t.name(SGLANG_ENGINE_MOD, "launch_server_process", depth=0),
            lambda t: t.name(SGLANG_ENGINE_MOD, "ServerArgs", depth=0),
            lambda t: t.method(SGLANG_ENGINE_MOD, "SGLangEngine", "_init_normal"),
        ),
        optional=True,
        shapes=frozenset({ROLLOUT_MANAGER}),
    ),
    Seam(
        "object_store",
        OBJECT_STORE_MOD,
        "module-level `init_instance`, `get_instance` and `_create_instance`",
        "one client per run shared by the in-process actors (leaf object_store_client)",
        "the second process to start would fail its once-per-process assertion: refused",
        ROLLING,
        _all(
            lambda t: t.name(OBJECT_STORE_MOD, "init_instance"),
            lambda t: t.name(OBJECT_STORE_MOD, "_create_instance"),
        ),
    ),
    Seam(
        "train_async.py",
        "train_async.py",
        "module-level `train` (`def` or `async def`) calling `create_rollout_manager` (rollout-manager shape) or "
        "`create_rollout_components` (controller-executor shape)",
        "executed as a module over upstream's own orchestration (`harness.upstream.leaves`: fakes only at the leaves)",
        "no one-step or fully-async driver: refused",
        frozenset({"one-step", "fully-async"}),
        _driver_found("train_async.py"),
        explain=_driver_explain("train_async.py"),
    ),
    Seam(
        "train.py",
        "train.py",
        "module-level `train` (`def` or `async def`) calling `create_rollout_manager` (rollout-manager shape) or "
        "`create_rollout_components` (controller-executor shape)",
        "executed as a module over upstream's own orchestration (`harness.upstream.leaves`: fakes only at the leaves)",
        "no sync driver: refused",
        frozenset({"sync"}),
        _driver_found("train.py"),
        explain=_driver_explain("train.py"),
    ),
)

BY_NAME = {s.name: s for s in SEAMS}


# --------------------------------------------------------------------------- probing


@dataclass(frozen=True)
class Probe:
    seam: Seam
    found: bool
    needed: bool  # missing and nothing replaces it: the drivers it serves are refused
    detail: str = ""  # what the probe found and did not find (the seam's ``explain``)


@dataclass
class TreeReport:
    tree: Path
    probes: list[Probe]
    shape: str | None = None  # ROLLOUT_MANAGER or CONTROLLER_EXECUTOR (None: neither entry point found)

    def found(self, name: str) -> bool:
        return next(p.found for p in self.probes if p.seam.name == name)

    def missing_for(self, driver: str) -> list[Seam]:
        """The seams without which ``driver`` cannot run faithfully on this tree (only the
        seams of its shape count). A shape the harness does not host is a missing seam
        ``shape <name>``."""
        out = [
            p.seam
            for p in self.probes
            if p.needed and driver in p.seam.drivers and (self.shape is None or self.shape in p.seam.shapes)
        ]
        if self.shape is not None and self.shape not in HOSTED:
            out.append(_unhosted(self.shape))
        return out

    @property
    def runnable(self) -> tuple[str, ...]:
        return tuple(d for d in DRIVERS if not self.missing_for(d))

    @property
    def verdict(self) -> str:
        if not self.runnable:
            return "refused"
        return "runs" if len(self.runnable) == len(DRIVERS) else "runs partly"

    def format(self) -> str:
        """The table: seam, found / missing (MISSING: needed), where it looked, and what
        the harness does without it; then the verdict per driver."""
        w = max(len(p.seam.name) for p in self.probes)
        lines = [
            f"upstream Miles tree: {self.tree}",
            f"orchestration shape: {_describe_shape(self.shape)}",
            "",
            f"{'seam':<{w}}  {'state':<7}  where it looked / without it",
        ]
        other = []
        for p in self.probes:
            s = p.seam
            if self.shape is not None and self.shape not in s.shapes:
                other.append(s.name)
                continue
            state = "found" if p.found else ("MISSING" if p.needed else "missing")
            lines.append(f"{s.name:<{w}}  {state:<7}  {s.file}: {s.looks_for}")
            if p.detail and not p.found:
                lines.append(f"{'':<{w}}  {'':<7}  found here: {p.detail}")
            if not p.found:
                lines.append(f"{'':<{w}}  {'':<7}  without it: {s.without}")
        if other:
            lines.append(f"(not probed on the {self.shape} shape: {', '.join(other)})")
        lines += ["", f"verdict: {self.verdict}"]
        for d in DRIVERS:
            miss = self.missing_for(d)
            absent = self.absent_files(d)
            if absent:
                state = f"NOT RUN: this tree has no {', '.join(absent)} (an older Miles); the other drivers are judged"
            else:
                state = "runs" if not miss else "REFUSED: missing " + ", ".join(_named(s) for s in miss)
            lines.append(f"  {d:<12} {state}")
        return "\n".join(lines)

    def absent_files(self, driver: str) -> list[str]:
        """The files of ``driver``'s missing seams that the tree does not have at all, when
        every one of its missing seams is in such a file (a tree older than the driver's
        module), else ``[]``."""
        miss = self.missing_for(driver)
        files = sorted({s.file for s in miss})
        gone = [f for f in files if not (self.tree / f).is_file()]
        return gone if miss and len(miss) == len(self.missing_for(driver)) and gone == files else []

    def refusal(self, driver: str | None = None) -> SeamMissing:
        """``SeamMissing`` naming what ``driver`` lacks (``None``: every needed seam)."""
        if driver:
            miss = self.missing_for(driver)
        else:
            miss = list({s.name: s for d in DRIVERS for s in self.missing_for(d)}.values())
        details = {p.seam.name: p.detail for p in self.probes if p.detail}
        text = "; ".join(
            f"seam {s.name} missing in {self.tree / s.file} (looked for {s.looks_for}, following imports to where "
            f"they are defined{'; found: ' + details[s.name] if s.name in details else ''}): {s.without}"
            for s in miss
        )
        return SeamMissing(
            f"the harness cannot run {driver or 'any driver'} on upstream Miles at {self.tree} faithfully: {text}. "
            f"Run `miles-harness doctor --miles-src {self.tree}` for the whole table.",
            list(dict.fromkeys(s.name for s in miss)),
        )

    def require(self, driver: str) -> None:
        """Raise ``SeamMissing`` naming the seams ``driver`` lacks on this tree."""
        if self.missing_for(driver):
            raise self.refusal(driver)


SHAPE_PREFIX = "shape "


def _describe_shape(shape: str | None) -> str:
    if shape is None:
        return (
            "none found (the drivers call neither `create_rollout_manager` (rollout-manager) nor "
            "`create_rollout_components` (controller-executor))"
        )
    how = (
        "hosted: upstream's own orchestration over the leaves" if shape in HOSTED else "not hosted by this harness yet"
    )
    return f"{shape} (the drivers call `{SHAPE_CALLS[shape]}`; {how})"


def _unhosted(shape: str) -> Seam:
    """The seam a shape the harness does not host lacks."""
    return Seam(
        f"{SHAPE_PREFIX}{shape}",
        "train_async.py",
        f"an orchestration shape the harness hosts ({', '.join(HOSTED)})",
        "",
        f"the drivers call `{SHAPE_CALLS[shape]}`: the {shape} shape, which the harness does not host yet "
        "(doctor lists the leaves not faked yet); refused",
        ROLLING,
        lambda t: False,
    )


def _named(s: Seam) -> str:
    return f"{s.name} ({s.file})"


def probe(tree: Path) -> TreeReport:
    """The seam table of ``tree`` (read from its source files; nothing is imported)."""
    t = _Tree(Path(tree).resolve())
    found = {s.name: bool(s.probe(t)) for s in SEAMS}
    probes = []
    for s in SEAMS:
        replaced = s.fallback is not None and found[s.fallback]
        detail = s.explain(t) if s.explain is not None else ""
        needed = not found[s.name] and not s.optional and not replaced
        probes.append(Probe(seam=s, found=found[s.name], needed=needed, detail=detail))
    # an optional seam that stands in for a missing one is needed after all
    for i, p in enumerate(probes):
        if p.seam.optional and not p.found and any(q.seam.fallback == p.seam.name and not q.found for q in probes):
            probes[i] = Probe(seam=p.seam, found=False, needed=True, detail=p.detail)
    return TreeReport(tree=t.root, probes=probes, shape=shape_of(t.root))


def shape_of(tree: Path) -> str | None:
    """The orchestration shape of ``tree``: that of ``train_async.py``, else ``train.py``."""
    t = _Tree(Path(tree).resolve())
    return next((shape for f in ("train_async.py", "train.py") if (shape := driver_shape(t, f)) is not None), None)


def driver_of(config: object) -> Driver:
    """The driver a scenario config runs (``Driver.of``)."""
    return Driver.of(config)


__all__ = [
    "BY_NAME",
    "CONTROLLER_EXECUTOR",
    "DRIVERS",
    "HOSTED",
    "Probe",
    "ROLLOUT_MANAGER",
    "SEAMS",
    "SHAPES",
    "Seam",
    "SeamMissing",
    "TreeReport",
    "driver_of",
    "probe",
    "shape_of",
]
