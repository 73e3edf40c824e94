"""A Miles runner on virtual time: upstream's own drivers and rollout code, unmodified, on
the harness' ``SimEngine`` and ``SimTrainer``.

What runs as upstream wrote it (imported from the tree ``harness.upstream.source``
found): the driver loop of ``train_async.py`` / ``train.py`` (the file is executed as a
module, then its Ray-bound names are rebound, below), ``FullyAsyncRolloutFn``,
``InferenceRolloutFn`` (one-step / sync), ``DefaultDataBuffer``, the submission
schedulers, ``RolloutDataSourceWithBuffer`` reading a JSONL prompt file through a small
local tokenizer, ``generate_and_rm(_group)``, the single-turn ``generate`` and its
sample update from SGLang's response fields, the reward dispatch (``async_rm`` with
``--custom-rm-path``) and the dynamic-filter call.

What is faked, and where: only the leaves (``harness.upstream.leaves``: Ray in process,
the SGLang engine actor, the Megatron/FSDP train actor, the object store, the rollout
thread, the outside services), and upstream's orchestration (``create_rollout_manager``,
``RolloutManager``, ``create_training_models``, the actor group) runs as written over them
(``harness.upstream.orchestration``). Besides:

* HTTP: ``post`` in ``single_turn`` (``/generate``) and in ``inference_rollout_train``
  (``/abort_request``) and ``get`` (``/workers``) are served by ``SimEngine``. A
  ``/generate`` call returns what SGLang returns: ``text``, and in ``meta_info``
  ``output_token_logprobs`` ``[(logprob, token), ...]``, ``finish_reason.type``
  (``stop`` / ``length`` / ``abort``) and ``weight_version``; upstream's
  ``update_sample_from_response`` applies them. ``abort_request`` with ``abort_all``
  aborts whatever the engine is running (nothing when it is idle, as SGLang).
* Which sample a ``/generate`` call is for: the payload carries only token ids, so the
  runner installs a ``TrajectoryLifecycle`` sink (upstream's dashboard seam), whose
  ``gen_start(sample)`` runs in the sample's task just before the call.

Events are recorded from outside upstream's code: the engine (as for the core), the
data source (instance methods wrapped: ``taken``, ``recycled``), the buffer (an upstream
``DefaultDataBuffer`` built through ``--custom-async-data-buffer-path`` whose instance
methods are wrapped), the unused-samples handler, the drains, the trainer and the weight
updates (the core's driver helpers), and the run end (what is still live). Where upstream
holds each group it took is ``harness.upstream.group_accounting``, fed by these observations.

Every upstream name the runner rebinds is a ``harness.upstream.host.Rebind``
(``virtual_time_rebinds``), installed for one run and restored after it
(``host.installed``); each run loads its driver through ``host.load_driver``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from miles_async_core import events as ev
from miles_async_core.config import HARNESS_EXTENSIONS
from miles_async_core.contracts import NullSink
from miles_async_core.drivers.common import RunContext, train_step
from miles_async_core.drivers.common import weight_version_metrics
from miles_async_core.types import Sample as CoreSample
from miles_async_core.types import SamplingParams, Status
from harness.measure.ages import AgeRecorder
from harness.sim.draws import uniform
from harness.sim.engine import SimEngine
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainer
from harness.sim.vtime import run_virtual
from harness.sim.watchdog import for_scenario, install
from harness.trace import Event, TraceRecorder
from harness.upstream import host, leaf_fakes, source, vray
from harness.upstream.group_accounting import GroupAccounting
from harness.upstream.harness_errors import HarnessError, RunnerSeamError
from harness.upstream.host import Rebind, LifecycleSink
from harness.upstream import orchestration
from harness.upstream.orchestration import driver_services_off, orchestration_rebinds
from harness.upstream.seams import CONTROLLER_EXECUTOR, driver_of
from harness.upstream.leaf_fakes import LeafCalled

WORKER_URL = "http://sim-engine"
INFERENCE_ROLLOUT_FN = "miles.rollout.inference_rollout.inference_rollout_common.InferenceRolloutFn"
ROUTER = ("sim-router", 0)


# --------------------------------------------------------------------------- set-up pieces


@functools.cache
def _local_assets() -> tuple[Path, Path]:
    """A word-level tokenizer and a prompt file, made once per process in a temp dir (no
    download): upstream's data source and ``GenerateState`` load them for real."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = Path(tempfile.mkdtemp(prefix="miles-harness-upstream-"))
    vocab = {"[UNK]": 0, "[EOS]": 1, **{f"w{i}": i + 2 for i in range(64)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]").save_pretrained(root / "tok")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"text": f"w{k % 64} w{(k * 7) % 64}", "label": str(k)}) + "\n" for k in range(256))
    )
    return root / "tok", prompts


def _upstream_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Miles' own argument parser (``miles/utils/arguments.py``: the arguments
    ``get_miles_extra_args_provider`` adds; Megatron's are the train actor leaf's). While it
    is built it reads the command line for the rollout and generate functions' own
    arguments (``arguments.py:L2591-L2605``): that command line is the case's ``argv``."""
    from harness.upstream import vray

    parser = argparse.ArgumentParser(prog="miles", allow_abbrev=False)
    saved = sys.argv
    sys.argv = ["miles", *argv]
    try:
        with vray.installed():  # what it imports binds the in-process Ray
            from miles.utils.arguments import get_miles_extra_args_provider

            get_miles_extra_args_provider()(parser)
    finally:
        sys.argv = saved
    return parser


def upstream_args(
    scenario: Scenario,
    *,
    dynamic_filter_path: str | None = None,
    generate_function_path: str | None = None,
    partial_rollout: bool | None = None,
) -> argparse.Namespace:
    """The ``args`` upstream runs with: Miles' parser's defaults (every flag the tree
    defines has the tree's default), the scenario's Miles flags, and the runner's wiring
    (a local tokenizer and prompt file, the reward and buffer hooks, the router address,
    one engine and one trainer GPU). An argument neither defines (Megatron's, read by the
    trainer backend) is ``LeafMissing`` when upstream reads it."""
    cfg = scenario.config
    tok, prompts = _local_assets()
    argv = ["--rollout-batch-size", str(cfg.rollout_batch_size)]
    if generate_function_path is not None:
        argv += ["--custom-generate-function-path", generate_function_path]
    args = _upstream_parser(argv).parse_args(argv, namespace=leaf_fakes.ArgsNamespace())
    flags = {k: v for k, v in cfg.to_dict().items() if k not in ("driver", "seed", *HARNESS_EXTENSIONS)}
    flags.update(
        over_sampling_batch_size=cfg.resolved_over_sampling_batch_size,
        partial_rollout=cfg.partial_rollout if partial_rollout is None else partial_rollout,
    )
    # a critic is what --advantage-estimator ppo gives (arguments.py:L3205)
    if flags.get("use_critic"):
        flags["advantage_estimator"] = "ppo"
    # a run that starts at rollout S > 0 is a resumed one: Miles' validation keeps
    # --start-rollout-id only with a checkpoint under --load (arguments.py:L3045-L3058),
    # so the case gets one whose tracker names S - 1
    start = flags.get("start_rollout_id")
    if start:
        flags["load"] = str(_resumed_checkpoint(int(start) - 1))
    wiring = dict(
        hf_checkpoint=str(tok),
        prompt_data=str(prompts),
        input_key="text",
        label_key="label",
        rollout_seed=cfg.seed,
        rollout_shuffle=False,
        custom_rm_path="harness.upstream.runner.sim_reward_rm",
        harness_seed=cfg.seed,
        custom_async_data_buffer_path="harness.upstream.runner.observed_default_buffer",
        dynamic_sampling_filter_path=dynamic_filter_path,
        custom_generate_function_path=generate_function_path,
        # the runner's semaphore never blocks: every group is submitted at once
        sglang_server_concurrency=1 << 20,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        actor_num_nodes=1,
        actor_num_gpus_per_node=1,
        num_steps_per_rollout=1,  # one optimizer step per rollout, as SimTrainer trains
        rollout_max_response_len=scenario.max_new_tokens,
        # an external router is given: start_router returns it (router_manager.py:L20-L21)
        sglang_router_ip=ROUTER[0],
        sglang_router_port=ROUTER[1],
        # the class-based rollout the runner observes (trees whose default is the legacy
        # sglang_rollout.generate_rollout select it with this flag)
        rollout_function_path=None if cfg.fully_async else INFERENCE_ROLLOUT_FN,
        save_interval=None,
        eval_interval=None,
        skip_eval_before_train=True,
    )
    if source.report().shape == CONTROLLER_EXECUTOR:
        # this shape resolves its routers itself, from the router pool the worker manager
        # starts (router_manager.py:L27-L32 refuses an address given without that pool)
        # the engine pool's meta reads SGLang's --sglang-api-key (specs/inference.py:L358), a
        # flag of SGLang's ServerArgs (leaf sglang_server_args): SGLang's default, none
        wiring.update(sglang_router_ip=None, sglang_router_port=None, sglang_api_key=None)
    for key, value in {**flags, **wiring}.items():
        setattr(args, key, value)
    return args


def upstream_refusal(scenario: Scenario) -> str | None:
    """What Miles' own argument checks say of ``scenario``'s flags (``miles_validate_args``:
    a setting the job would refuse at start-up), or ``None`` when they accept them."""
    try:
        with orchestration.rollout_environment():  # the environment a run has (orchestration.hosted)
            validate_upstream_args(upstream_args(scenario))
    except (AssertionError, ValueError) as exc:
        return f"upstream refuses it at start-up (miles/utils/arguments.py): {exc}"
    return None


def validate_upstream_args(args: argparse.Namespace) -> None:
    """Upstream's own validation (``miles_validate_args``): derives what the flags imply
    (global batch size, eval datasets, fault-tolerance components, the rollout function
    paths) and refuses what Miles refuses, as the job would at start-up."""
    sys.modules["miles.utils.arguments"].miles_validate_args(args)


@functools.cache
def _resumed_checkpoint(rollout_id: int) -> Path:
    """A checkpoint folder as the train actor leaf writes it, saved at ``rollout_id`` by a
    trainer that has taken no step (``harness.upstream.leaves.write_checkpoint``)."""
    from harness.upstream.leaves import write_checkpoint

    root = Path(tempfile.mkdtemp(prefix=f"miles-harness-resumed-{rollout_id}-"))
    write_checkpoint(str(root), rollout_id, {"optimizer_step": 0, "lr_step": 0, "version": 0})
    return root


async def sim_reward_rm(args: Any, sample: Any, **_: Any) -> Any:
    """``--custom-rm-path`` target: the reward ``harness.sim.run_scenario.sim_reward`` gives the core.
    Called with one sample (``async_rm``) or, for the samples a generate function returned
    as a list, with that list (``batched_async_rm``, ``rm_hub/__init__.py:L104-L106``,
    called at ``inference_rollout_common.py:L124``): then the trajectory's reward, that of
    its prompt sample, on every sample (siblings of one rollout share one reward:
    ``train_data_conversion.py:L225-L238``)."""
    if isinstance(sample, list):
        reward = 1.0 if uniform(args.harness_seed + 7, sample[0].index) < 0.5 else 0.0
        return [reward] * len(sample)
    return 1.0 if uniform(args.harness_seed + 7, sample.index) < 0.5 else 0.0


# --------------------------------------------------------------------------- the runner's seams


def _current() -> "UpstreamRunner":
    """The upstream run the host holds (for targets upstream loads by path from ``args``)."""
    run = host.current()
    if not isinstance(run, UpstreamRunner):
        raise LeafCalled(
            f"a virtual-time target was called while {type(run).__name__} holds the host", seam="http_post(single_turn)"
        )
    return run


async def http_get(url: str, *args: Any, **kwargs: Any) -> dict:
    """The leaf for ``miles.utils.http_utils.get``: the router's worker list."""
    if url.endswith("/workers"):
        return {"workers": [{"url": WORKER_URL}]}
    if url.endswith("/list_workers"):
        return {"urls": [WORKER_URL]}
    raise LeafCalled(f"GET {url}: the runner serves only the router's worker list", seam="http_post_get(one-step)")


def _announced(generate_and_rm: Callable, sink: LifecycleSink) -> Callable:
    """Upstream's ``generate_and_rm``, called as is, with each sample announced to the
    run's sink first: for a tree whose ``generate_and_rm`` does not call the lifecycle
    sink itself (seam ``lifecycle_sink`` missing, ``harness.upstream.seams``). The pinned
    tree announces after the semaphore and the ``state.aborted`` check
    (``inference_rollout_common.py:L78-L93``); the runner's semaphore never blocks
    (``sglang_server_concurrency`` is huge) and a sample returned at the aborted check
    makes no request, so where the announcement happens changes nothing the runner sees."""

    @functools.wraps(generate_and_rm)
    async def announced(state: Any, sample: Any, *args: Any, **kwargs: Any) -> Any:
        evaluation = kwargs.get("evaluation", args[1] if len(args) > 1 else False)
        if evaluation or isinstance(sample, list):
            return await generate_and_rm(state, sample, *args, **kwargs)
        sink.attempt_start(sample)
        sink.gen_start(sample)
        try:
            return await generate_and_rm(state, sample, *args, **kwargs)
        finally:
            sink.attempt_end(sample)

    return announced


class _OrderedTasks(set):
    """A ``done`` set that iterates in a pinned order. Upstream handles the finished groups
    of one ``asyncio.wait`` return in set order, which follows memory addresses (``done-set-order``); the
    runner pins it: by first sample index (``index``, what the core does) or the reverse."""

    def __init__(self, members: Any, keys: dict, order: str) -> None:
        super().__init__(members)
        self.keys, self.order = keys, order

    def __iter__(self) -> Iterator[Any]:
        keys = self.keys
        return iter(sorted(set.__iter__(self), key=lambda t: keys.get(t, -1), reverse=self.order == "reverse"))


def _ordered_scheduler(make: Callable, run: "UpstreamRunner", *, worker: bool = False) -> Callable:
    """Upstream's ``make_submission_scheduler``; the scheduler's ``wait_for_progress``
    result is returned as ``_OrderedTasks`` (same members, pinned iteration order).
    ``worker``: the fully-async worker's scheduler, whose waits the runner's accounting
    follows (``GroupAccounting.worker_waits`` / ``worker_woke``)."""

    @functools.wraps(make)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        scheduler = make(*args, **kwargs)
        wait = scheduler.wait_for_progress

        async def ordered(pendings: set) -> tuple[set, set]:
            if worker:
                run.accounting.worker_waits(pendings, run.now())
            done, pending = await wait(pendings)
            out = _OrderedTasks(done, run.task_key, run.set_order)
            if worker:
                run.accounting.worker_woke(done, run.now())
            return out, pending

        scheduler.wait_for_progress = ordered
        return scheduler

    return wrapped


def _ordered_as_completed_async(run: "UpstreamRunner") -> Callable:
    """Upstream's ``as_completed_async`` (``miles/utils/misc.py``: ``for coro in
    asyncio.as_completed(tasks): yield await coro``), with the tasks already done when it
    starts taken in the runner's pinned set order (``done-set-order``): asyncio registers their callbacks in
    set order. The loop steps are asyncio's (``rollout.as_completed_in_order``)."""
    from miles_async_core.rollout import as_completed_in_order

    async def ordered(tasks: Any) -> Any:
        keys = run.task_key
        sign = -1 if run.set_order == "reverse" else 1
        for next_done in as_completed_in_order(tasks, key=lambda t: sign * keys.get(t, -1)):
            task = await next_done
            yield task.result()

    return ordered


def _observed_group(generate_and_rm_group: Callable, run: "UpstreamRunner") -> Callable:
    """Upstream's ``generate_and_rm_group``, called as is; its end is recorded."""

    @functools.wraps(generate_and_rm_group)
    async def observed(state: Any, group: list, *args: Any, **kwargs: Any) -> Any:
        gi = group[0].group_index
        task = asyncio.current_task()
        assert task is not None, "upstream runs each group in a task of its own"
        run.task_key[task] = group[0].index
        run.accounting.task_started(task, gi)
        try:
            out = await generate_and_rm_group(state, group, *args, **kwargs)
        except BaseException:
            run._emit(ev.GROUP_DONE, group_index=gi, ok=False)
            raise
        run._emit(ev.GROUP_DONE, group_index=gi, ok=True)
        return out

    return observed


def _observed_submit(submit_generate_tasks: Callable, run: "UpstreamRunner") -> Callable:
    """The one-step rollout's ``submit_generate_tasks`` (``inference_rollout_train.py:L66-L83``),
    called as is; each group task it creates is recorded as holding its group from creation
    (``UpstreamRunner.track_group_task``)."""

    @functools.wraps(submit_generate_tasks)
    def observed(state: Any, samples: list, *args: Any, **kwargs: Any) -> list:
        tasks = submit_generate_tasks(state, samples, *args, **kwargs)
        for group, task in zip(samples, tasks):
            run.track_group_task(task, group)
        return tasks

    return observed


def _observed_filter(call_dynamic_filter: Callable, run: "UpstreamRunner") -> Callable:
    """The one-step rollout's ``call_dynamic_filter``, called as is; a reject is recorded
    as the group's drop when upstream makes it (``inference_rollout_train.py:L140-L143``)."""

    @functools.wraps(call_dynamic_filter)
    def observed(fn: Any, args: Any, group: list, *rest: Any, **kwargs: Any) -> Any:
        out = call_dynamic_filter(fn, args, group, *rest, **kwargs)
        if not out.keep:
            gi = next(_iter_upstream(group)).group_index
            run.accounting.dropped(gi)
            run._emit(ev.DROPPED, group_index=gi, reason=f"dynamic_filter:{out.reason}")
        return out

    return observed


SINGLE_TURN_MOD = "miles.rollout.generate_hub.single_turn"
COMMON_MOD = "miles.rollout.inference_rollout.inference_rollout_common"
TRAIN_MOD = "miles.rollout.inference_rollout.inference_rollout_train"
FULLY_MOD = "miles.rollout.fully_async_rollout"


def virtual_time_rebinds(run: "UpstreamRunner") -> list[Rebind]:
    """What a virtual-time run rebinds in upstream (``host.installed``): its HTTP calls
    served by ``run``, the lifecycle sink (or, on a tree without it, a wrapper announcing
    each sample), the group tasks' ends, the submission schedulers and ``as_completed_async``
    with the set order pinned (``done-set-order``), the one-step dynamic filter and task
    submission observed, the one-step progress bar off."""
    single_turn, common, train, fully = (
        host.module(SINGLE_TURN_MOD),
        host.module(COMMON_MOD),
        host.module(TRAIN_MOD),
        host.module(FULLY_MOD),
    )
    return [
        Rebind("http_post(single_turn)", single_turn, "post", lambda _: run.http_post),
        Rebind("http_post_get(one-step)", train, "post", lambda _: run.http_post),
        # the one-step rollout's progress bar would print on every generate
        Rebind("tqdm", train, "tqdm", lambda tqdm: functools.partial(tqdm, disable=True)),
        Rebind("http_post_get(one-step)", train, "get", lambda _: http_get),
        Rebind("as_completed_async", train, "as_completed_async", lambda _: _ordered_as_completed_async(run)),
        host.sink_rebind(run.lifecycle),
        Rebind(
            "generate_and_rm",
            common,
            "generate_and_rm",
            lambda fn: _announced(fn, run.lifecycle),
            probe=lambda report: not report.found("lifecycle_sink"),
        ),
        # the group task's end, recorded as `group_done`
        Rebind("generate_and_rm_group(fully-async)", fully, "generate_and_rm_group", lambda f: _observed_group(f, run)),
        Rebind(
            "make_submission_scheduler(fully-async)",
            fully,
            "make_submission_scheduler",
            lambda make: _ordered_scheduler(make, run, worker=True),
        ),
        Rebind("generate_and_rm_group(one-step)", train, "generate_and_rm_group", lambda f: _observed_group(f, run)),
        Rebind(
            "make_submission_scheduler(one-step)",
            train,
            "make_submission_scheduler",
            lambda make: _ordered_scheduler(make, run),
        ),
        Rebind("call_dynamic_filter", train, "call_dynamic_filter", lambda f: _observed_filter(f, run)),
        Rebind("submit_generate_tasks", train, "submit_generate_tasks", lambda f: _observed_submit(f, run)),
    ]


def observed_default_buffer(ci: Any) -> Any:
    """``--custom-async-data-buffer-path`` target: upstream's own ``DefaultDataBuffer``,
    with its instance methods wrapped to record events (its behaviour is unchanged)."""
    from miles.rollout.fully_async_data_buffer import DefaultDataBuffer

    return _current().observe_buffer(DefaultDataBuffer(ci))


def _status_name(s: Any) -> str:
    return s.status.name if hasattr(s.status, "name") else str(s.status)


def _iter_upstream(group: Any):
    for item in group:
        if isinstance(item, list):
            yield from _iter_upstream(item)
        else:
            yield item


def _staleness(group: Any, current: int | None) -> int | None:
    from miles.rollout.fully_async_data_buffer import group_oldest_weight_version

    if current is None:
        return None
    oldest = group_oldest_weight_version(group)
    return None if oldest is None else current - oldest


def _weight_versions(recorded: list) -> list[str]:
    """A sample's engine versions as the core records them, one string per version: trees
    that record a string per generate call as they are; trees that record the versions'
    token spans per call (``WeightVersionsPerCall``, ``miles/utils/types.py:L20-L50`` of the
    refactor's tip) give each span's version, which is what their ``oldest_weight_version``
    reads (``types.py:L344-L348``)."""
    return (
        [span.version for call in recorded for span in call.spans]
        if recorded and not isinstance(recorded[0], str)
        else list(recorded)
    )


class RunnerAccountingError(HarnessError):
    """The runner's own accounting contradicted itself: a group it declared lost (held by
    nothing upstream, ``UpstreamRunner.unaccounted`` / ``worker_waits``) showed up again in
    upstream's hands (submitted, returned by a wait, put, in the buffer or the data
    source, got, handed to the handler, recycled, returned by a rollout). That proves the
    accounting missed a holder: a harness bug, never an upstream finding. ``run`` raises it
    after the run (``result`` is what the run left), so the fault sweep records the seed as
    a ``harness_error`` (``harness.upstream.fault_sweep._row``) and the differential fails."""

    def __init__(self, problems: list[str], result: "UpstreamRunResult") -> None:
        super().__init__(
            "harness_error: runner accounting: "
            + "; ".join(problems[:8])
            + (f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""),
            ["runner accounting"],
        )
        self.problems = problems
        self.result = result


@dataclass
class UpstreamRunResult:
    """What an upstream run leaves: the same shape the differential reads from a core run."""

    scenario: Scenario
    history: list[dict]
    wall_s: float
    events: list[Event]
    error: BaseException | None = None
    get_samples_calls: list[tuple[float, int, list[int]]] = field(default_factory=list)  # (t, asked, group ids)
    extra: dict[str, Any] = field(default_factory=dict)


class UpstreamRunner:
    # set by run(), for hooks (harness.upstream.lives): upstream's parsed args, its run context
    # and the driver module that runs
    args: Any
    ctx: Any
    driver_mod: Any

    def __init__(
        self,
        scenario: Scenario,
        *,
        engine_factory: Callable | None = None,
        trainer_factory: Callable | None = None,
        dynamic_filter_path: str | None = None,
        generate_function_path: str | None = None,
        trace: bool = True,
        hooks: Callable[["UpstreamRunner"], None] | None = None,
        set_order: str = "index",
    ) -> None:
        self.scenario = scenario
        self.engine_factory = engine_factory or SimEngine
        self.trainer_factory = trainer_factory or SimTrainer
        self.dynamic_filter_path = dynamic_filter_path
        self.generate_function_path = generate_function_path
        self.trace = trace
        self.hooks = hooks
        self.name = scenario.name
        # which sample each task is generating (upstream's lifecycle seam)
        self.lifecycle = LifecycleSink(on_trajectory_sample=self._trajectory_sample)
        self.task_key: dict[asyncio.Task, int] = {}  # group task -> first sample index (done-set-order)
        # where upstream holds each group it took (``unaccounted`` after every rollout)
        self.accounting: GroupAccounting[asyncio.Task] = GroupAccounting(fully_async=scenario.config.fully_async)
        self._last_taken: list = []  # the groups of the latest get_samples call
        self.set_order = set_order
        self.mirrors: dict[int, CoreSample] = {}
        self.taken_this_generate: list[int] = []
        self.get_samples_calls: list[tuple[float, int, list[int]]] = []
        self.abort_posts: list[float] = []
        self._in_get = False
        self._aborting = False
        self._get_version: int | None = None
        self.rollout_fn: Any = None
        self.data_source: Any = None
        self.closed_groups: set[int] = set()  # live groups the rollout function's close ended with the run
        self.sample_group: dict[int, list] = {}  # sample index -> its group as last returned
        self.rollout_metrics: dict[int, dict] = {}  # rollout id -> metrics, until trained
        # hooks that follow upstream's save and load at the leaves (harness.upstream.lives)
        self.ended = False  # the driver's train() returned, raised or was cancelled
        self.final_accounting: GroupAccounting[asyncio.Task] | None = None  # the accounting when it did
        self.on_trainer_loaded: Callable[[dict | None], None] | None = None
        self.on_trainer_saved: Callable[[int, dict], None] | None = None
        self.on_data_source: Callable[[Any], None] | None = None
        self.buffer: Any = None
        self.sink: Any = NullSink()

    # --- HTTP -------------------------------------------------------------------------
    async def http_post(self, url: str, payload: dict, *args: Any, **kwargs: Any) -> dict:
        """The leaf for ``miles.utils.http_utils.post`` on the runner's URLs."""
        if url.endswith("/generate"):
            return await self.serve_generate(payload)
        if url.endswith("/abort_request"):
            return await self.serve_abort(payload)
        raise LeafCalled(
            f"POST {url}: the runner serves only /generate and /abort_request", seam="http_post(single_turn)"
        )

    async def serve_generate(self, payload: dict) -> dict:
        task = asyncio.current_task()
        usample = self.lifecycle.sample_of(task)
        if usample is None:
            seam = "lifecycle_sink" if source.report().found("lifecycle_sink") else "generate_and_rm"
            raise LeafCalled(
                f"/generate called from a task the {seam} seam did not announce "
                f"(payload of {len(payload.get('input_ids') or [])} token ids)",
                seam=seam,
            )
        prompt = [0] * self.scenario.engine.prompt_tokens
        m = self.mirrors.get(usample.index)
        # a new attempt: a fresh sample, or one reset for retry (no response, no weight
        # version); a --partial-rollout sample aborted before its first token keeps its
        # weight version and resumes on its mirror, as the core resumes the same Sample
        if m is None or (usample.response == "" and not usample.weight_versions):
            root = self.lifecycle.root_of(task)
            if root is not None and root is not usample:  # a sample the generate function added:
                rm = self.mirrors.get(root.index)  # its trajectory's attempt
                retry = rm.retry_count if rm is not None else 0
            else:
                retry = 0 if m is None else m.retry_count + 1
            m = CoreSample(
                prompt=str(usample.prompt),
                prompt_tokens=prompt,
                index=usample.index,
                group_index=usample.group_index,
                retry_count=retry,
            )
            self.mirrors[usample.index] = m
        base = len(m.response_tokens)
        remaining = payload["sampling_params"]["max_new_tokens"]
        await self.engine.generate(m, SamplingParams(max_new_tokens=base + remaining))
        toks, lps = m.response_tokens[base:], m.rollout_log_probs[base:]
        kind = {Status.ABORTED: "abort", Status.TRUNCATED: "length"}.get(m.status, "stop")
        return {
            "text": "t" * len(toks),
            "meta_info": {
                "output_token_logprobs": [[lp, tok] for lp, tok in zip(lps, toks)],
                "finish_reason": {"type": kind},
                "weight_version": m.weight_versions[-1],
                "prompt_tokens": len(prompt),
                "cached_tokens": 0,
            },
        }

    async def serve_abort(self, payload: dict) -> dict:
        self.abort_posts.append(asyncio.get_running_loop().time())
        eng = self.engine
        if payload.get("abort_all") and (eng.running or eng.waiting):
            await eng.pause_generation("abort")
            await eng.continue_generation()
        return {}

    # --- accounting: where upstream holds each live group (GroupAccounting) -------------
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def seen(self, gi: int, where: str) -> None:
        self.accounting.seen(gi, where, self.now())

    def _trajectory_sample(self, sample: Any, root: Any) -> None:
        """A sample a generate function added to ``root``'s trajectory, announced before its request."""
        self._emit(ev.TRAJECTORY_SAMPLE, index=sample.index, group_index=sample.group_index, trajectory=root.index)

    def track_group_task(self, task: asyncio.Task, group: list) -> None:
        """``task`` holds ``group`` from its creation, not from its first step: the drain
        (or the run's end) can come between the two, as in ``fully_async_rollout.py:L133``
        creating a group task right after a put and the drain returning before that task
        first runs."""
        self.accounting.task_created(task, group[0].group_index, self.now())
        self.task_key[task] = group[0].index

    def observe_submit(self, fn: Any) -> None:
        """The fully-async worker's ``_submit_one_group`` (``fully_async_rollout.py:L112-L116``),
        called as is: the group task it returns is recorded at once (``track_group_task``)."""
        submit = fn._submit_one_group

        def observed() -> asyncio.Task:
            task = submit()
            [group] = self._last_taken
            self.track_group_task(task, group)
            return task

        fn._submit_one_group = observed
        if hasattr(fn, "_submit_publish"):
            self.observe_publish(fn)

    def observe_publish(self, fn: Any) -> None:
        """The two-wave worker's ``_submit_publish`` (``fully_async_rollout.py:L173``,
        ``:L209-L210`` of the refactor's tip), called as is: the publish task it returns
        holds the finished group from its creation until its put starts
        (``GroupAccounting.publish_created``)."""
        publish = fn._submit_publish

        def observed(entry: Any) -> asyncio.Task:
            task = publish(entry)
            gi = next(_iter_upstream(entry.prompt_group)).group_index
            self.accounting.publish_created(task, gi, self.now())
            return task

        fn._submit_publish = observed

    def _finished(self) -> set[asyncio.Task]:
        return {t for t in self.accounting.task_group if t.done()}

    def unaccounted(self) -> set[int]:
        """Conservation after a rollout (``GroupAccounting.unaccounted``): a live group
        upstream no longer holds is lost, and left out of ``run_end.pending_groups``."""
        return self.accounting.unaccounted(self._queued(), self._finished(), self.now())

    def _queued(self) -> set[int]:
        """The groups in upstream's data source or buffer, and those the rollout function's
        close ended with the run (``observe_close``)."""
        out = {g[0].group_index for g in getattr(self.data_source, "buffer", ())} | self.closed_groups
        if self.buffer is not None:
            out |= {e.prompt_group[0].group_index for e in self.buffer._buffer}
        return out

    # --- observation ------------------------------------------------------------------
    def _emit(self, kind: str, **fields: Any) -> None:
        if self.sink.enabled:
            self.sink.emit(kind, **fields)

    def observe_data_source(self, ds: Any) -> Any:
        self.data_source = ds
        if self.on_data_source is not None:
            self.on_data_source(ds)
        get_samples, add_samples = ds.get_samples, ds.add_samples
        calls = [0]

        def observed_get_samples(num: int) -> list:
            calls[0] += 1
            recycled_before = {id(g) for g in ds.buffer}
            groups = get_samples(num)
            self._last_taken = groups
            now = asyncio.get_running_loop().time()
            self.get_samples_calls.append((now, num, [g[0].group_index for g in groups]))
            for g in groups:
                gi = g[0].group_index
                self.accounting.taken(gi, now)
                self.taken_this_generate.append(gi)
                self._emit(
                    ev.TAKEN,
                    group_index=gi,
                    indices=[s.index for s in g],
                    recycled=id(g) in recycled_before,
                    call=calls[0],
                )
            return groups

        def observed_add_samples(groups: list) -> None:
            add_samples(groups)
            for g in groups or []:
                gi = g[0].group_index
                self.accounting.recycled(gi, self.now())
                self._emit(ev.RECYCLED, group_index=gi)

        ds.get_samples, ds.add_samples = observed_get_samples, observed_add_samples
        return ds

    def observe_handler(self, fn: Any) -> None:
        handle = fn._handle_unused
        handler = self.scenario.config.async_unused_samples_handler

        def observed(prompt_group: list) -> None:
            gi = prompt_group[0].group_index
            self.seen(gi, "handed to the unused-samples handler")
            # put's abort path calls the handler before its first await, so the flag is only
            # ever set while that call runs; any other call is get's stale filter.
            cause = "aborted" if self._aborting else "stale"
            if cause == "stale":
                self._emit(
                    ev.STALE_REJECTED,
                    group_index=gi,
                    staleness=_staleness(prompt_group, self._get_version),
                    current_version=self._get_version,
                )
            self._emit(ev.HANDLER, group_index=gi, handler=handler, cause=cause)
            handle(prompt_group)
            if handler == "drop":
                self.accounting.dropped(gi)
                self._emit(ev.DROPPED, group_index=gi, reason=f"handler_drop:{cause}")

        fn._handle_unused = observed

    def observe_buffer(self, buf: Any) -> Any:
        put, get = buf.put, buf.get
        self.buffer = buf

        async def observed_put(entry: Any) -> None:
            gi = entry.prompt_group[0].group_index
            self.accounting.put_started(gi, self.now())
            try:
                await _put(entry, gi)
            finally:
                self.accounting.put_ended(gi)

        async def _put(entry: Any, gi: int) -> None:
            aborted = any(_status_name(s) == "ABORTED" for s in _iter_upstream(entry.group))
            if aborted:
                self._emit(ev.PUT_REJECTED, group_index=gi, reason="aborted")
                self._aborting = True
                try:
                    await put(entry)
                finally:
                    self._aborting = False
                return
            drops_before = (
                dict(buf._metric_gatherer._dynamic_filter_drop_reason_count) if hasattr(buf, "_metric_gatherer") else {}
            )
            full = len(buf._buffer) >= buf._capacity
            t_call = asyncio.get_running_loop().time()
            await put(entry)
            if any(e is entry for e in buf._buffer):
                if full:
                    self._emit(ev.PUT_BLOCKED, group_index=gi, queue_size=buf._capacity, _t=t_call)
                self._emit(ev.PUT_ACCEPTED, group_index=gi, queue_size=len(buf._buffer))
            else:
                after = getattr(getattr(buf, "_metric_gatherer", None), "_dynamic_filter_drop_reason_count", {})
                reason = next((r for r, c in after.items() if c != drops_before.get(r, 0)), None)
                self.accounting.dropped(gi)
                self._emit(ev.PUT_REJECTED, group_index=gi, reason=f"dynamic_filter:{reason}")

        async def observed_get(current_version: int | None = None, **context: Any) -> Any:
            self._in_get, self._get_version = True, current_version
            try:
                entry = await get(current_version=current_version, **context)
            finally:
                self._in_get = False
            self.seen(entry.prompt_group[0].group_index, "got from the buffer")
            self._emit(
                ev.GOT,
                group_index=entry.prompt_group[0].group_index,
                staleness=_staleness(entry.group, current_version),
                current_version=current_version,
                queue_size=len(buf._buffer),
            )
            return entry

        buf.put, buf.get = observed_put, observed_get
        return buf

    # --- conversion (the rollout manager's post-processing) ---------------------------
    def to_core(self, usample: Any) -> CoreSample:
        m = self.mirrors.get(usample.index)
        s = CoreSample(
            prompt=str(usample.prompt),
            index=usample.index,
            group_index=usample.group_index,
            label=usample.label,
            reward=usample.reward,
            metadata=dict(usample.metadata or {}),
            weight_versions=_weight_versions(usample.weight_versions),
            remove_sample=usample.remove_sample,
            retry_count=m.retry_count if m else 0,
        )
        s.status = Status[_status_name(usample)]
        if m is not None:
            s.prompt_tokens = m.prompt_tokens
            s.response_tokens = list(m.response_tokens)
            s.rollout_log_probs = list(usample.rollout_log_probs or [])
            s.token_versions = m.token_versions
        return s

    def convert(self, data: list) -> list:
        return [[self.to_core(x) if not isinstance(x, list) else [self.to_core(y) for y in x] for x in g] for g in data]

    # --- upstream's RolloutManager calls the rollout function (leaf rollout_thread) ---------
    def call_rollout_function(self, fn: Any, input: Any) -> Any:
        """``call_rollout_function`` as ``RolloutManager._get_rollout_data`` calls it: a train
        rollout is observed (``_rollout``); the coroutine is awaited by ``OnLoopAsyncio``."""
        from miles.rollout.base_types import RolloutFnTrainInput

        if not isinstance(input, RolloutFnTrainInput):
            return fn(input)
        # what the manager passes it read in its own step (rollout_manager.py:L249-L253),
        # before the rollout thread runs the function (OnLoopAsyncio.to_thread)
        self._emit(ev.GENERATE_START, rollout_id=input.rollout_id, version=getattr(input, "weight_version", None))
        return self._rollout(fn, input)

    def _rollout_returned(self, out: Any, rollout_id: int, *, fully: bool) -> None:
        """What a rollout function's return settles: its groups are trained; a drain ends
        (fully async), or what the one-step rollout took and did not return is dropped."""
        returned = {g[0][0].group_index if isinstance(g[0], list) else g[0].group_index for g in out.samples}
        self.accounting.trained(returned, rollout_id, self.now())
        if fully:
            self._emit(ev.DRAIN_END, rollout_id=rollout_id)
            return
        # what upstream discards by design: failed groups (logged), the pending ones at
        # the abort without --partial-rollout, finished ones beyond B; one whose group
        # task still runs is not discarded but unaccounted (abort awaits them all)
        running = self.accounting.running(self._finished())
        for gi in self.accounting.not_returned(self.taken_this_generate, returned, running):
            self._emit(ev.DROPPED, group_index=gi, reason="not_returned")

    async def _rollout(self, fn: Any, input: Any) -> Any:
        fully = self.scenario.config.fully_async
        rollout_id = input.rollout_id
        version = getattr(input, "weight_version", None)  # what upstream's manager passed
        self.taken_this_generate = []
        if fully:
            self._emit(ev.DRAIN_START, rollout_id=rollout_id, current_version=version)
        out = fn(input)
        if asyncio.iscoroutine(out):
            out = await out
        self._rollout_returned(out, rollout_id, fully=fully)
        self.unaccounted()
        data = self.convert(out.samples)
        for group in data:
            for s in _iter_upstream(group):
                self.sample_group[s.index] = group
        metrics = {**dict(out.metrics or {}), **weight_version_metrics(data)}
        self.rollout_metrics[rollout_id] = metrics
        self._emit(ev.GENERATE_END, rollout_id=rollout_id)
        self._emit(ev.METRICS, rollout_id=rollout_id, metrics=metrics)
        return out

    # --- the train actor leaf (harness.upstream.leaves.SimTrainActor, rank 0) ------------
    async def train_shard(self, rollout_id: int, shard: dict) -> None:
        """Train on the shard upstream's object store handed the actor: its samples, by
        ``sample_indices``, grouped as the rollout function returned them."""
        groups: list = []
        for index in shard.get("sample_indices", ()):
            group = self.sample_group[int(index)]
            if not any(g is group for g in groups):
                groups.append(group)
        await train_step(self.ctx, rollout_id, groups, self.rollout_metrics.pop(rollout_id, {}))

    async def weight_update(self, version: int, engines: list, mode: str) -> None:
        """Megatron's weight updater on the engines upstream passed: pause, load the
        trainer's weights, version, continue (``update_weight_from_tensor.py:L237-L320``)."""
        ctx = self.ctx
        self.weight_update_begins(version)
        await _each([e.pause_generation.remote(mode=mode) for e in engines])
        weights = ctx.trainer.get_weights()
        await _each([e.update_weights_from_tensor.remote(version, weights) for e in engines])
        await _each([e.continue_generation.remote() for e in engines])

    def weight_update_begins(self, version: int) -> None:
        """The train actor starts updating the engines to ``version`` (the weight sync opens)."""
        ctx = self.ctx
        ctx.weight_version = version
        ctx.steps_at_update = ctx.trainer_steps
        ctx.phase("train", "weight_sync", True, version=version)

    def engine_loaded(self, version: int) -> None:
        """An engine holds ``version`` now (the engine leaf calls it as its load returns)."""
        ctx = self.ctx
        if ctx.observer is not None:
            ctx.observer.on_weights_updated(ctx, version)
        self._emit(ev.ENGINE_VERSION, version=version, trainer_steps=ctx.trainer_steps)

    def weight_update_reported(self, version: int) -> None:
        """The trainer told upstream's rollout manager the version (``set_weight_version``)."""
        self._emit(ev.SET_WEIGHT_VERSION, version=version)
        self.ctx.phase("train", "weight_sync", False, version=version)

    def trainer_state(self) -> dict:
        ctx = self.ctx
        return {"optimizer_step": ctx.trainer_steps, "lr_step": ctx.trainer_steps, "version": ctx.weight_version}

    def trainer_saved(self, rollout_id: int, state: dict) -> None:
        """The train actor wrote rollout ``rollout_id``'s checkpoint; ``hooks`` may follow it."""
        if self.on_trainer_saved is not None:
            self.on_trainer_saved(rollout_id, state)

    def trainer_loaded(self, loaded: dict | None) -> None:
        """The train actor loaded ``loaded`` (``None``: no checkpoint); ``hooks`` may follow it."""
        if self.on_trainer_loaded is not None:
            self.on_trainer_loaded(loaded)

    def observe_rollout_fn(self, fn: Any) -> None:
        self.rollout_fn = fn
        if self.scenario.config.fully_async:
            self.observe_handler(fn)
            self.observe_submit(fn)
            if hasattr(fn, "aclose"):
                self.observe_close(fn)

    def observe_close(self, fn: Any) -> None:
        """The fully-async rollout's close (``aclose``, which ``dispose`` runs as the driver
        ends: ``fully_async_rollout.py:L286-L310`` of the refactor's tip, ``train_async.py:L126``):
        the worker is cancelled and cancels its group and publish tasks, so the live groups
        not queued in the data source or the buffer go with the run's end. They are listed
        as pending at ``run_end`` (``closed_groups``), as the groups a driver leaves live when
        it returns on trees without the close: not trained, not dropped by a rule, and lost
        to a resume like any group in flight at a stop. What was already held by nothing
        before the close is declared lost first (``unaccounted``), so the close hides no loss."""
        aclose = fn.aclose

        async def observed() -> None:
            self.unaccounted()
            before = set(self.accounting.pending())
            try:
                await aclose()
            finally:
                self.closed_groups |= before - self._queued()

        fn.aclose = observed

    # --- a run ------------------------------------------------------------------------
    def run(self) -> UpstreamRunResult:
        # SeamMissing, before anything runs
        source.report().require(driver_of(self.scenario.config))
        rebinds = virtual_time_rebinds(self) + orchestration_rebinds(self)
        with orchestration.hosted(), host.installed(self, rebinds):
            return self._run()

    def _run(self) -> UpstreamRunResult:
        raised_before = len(leaf_fakes.RAISED)
        args = upstream_args(
            self.scenario,
            dynamic_filter_path=self.dynamic_filter_path,
            generate_function_path=self.generate_function_path,
        )
        holder: dict[str, Any] = {}
        sc = self.scenario

        async def main() -> None:
            loop = asyncio.get_running_loop()
            self.sink = TraceRecorder(loop.time) if self.trace else NullSink()
            self.engine = self.engine_factory(sc.engine, sink=self.sink)
            install(for_scenario(sc, sink=self.sink, engine=self.engine))  # a hang or runaway: WatchdogTripped
            # upstream's RolloutManager actor plays the core's rollout manager
            ctx = RunContext(
                args=sc.config,
                engine=self.engine,
                trainer=self.trainer_factory(sc.trainer),
                rollout_manager=None,  # type: ignore[arg-type]
                sink=self.sink,
                observer=AgeRecorder(),
            )
            holder["ctx"] = ctx
            me = asyncio.current_task()
            assert me is not None, "run_virtual runs main() as a task"
            # a leaf fake reached past what it fakes inside upstream's code: this run cannot be faithful, so
            # it stops now (RunnerSeamError after it), whatever upstream does with the error
            leaf_fakes.ON_RAISE = lambda exc: loop.call_soon(me.cancel) if not me.done() else None
            name = "train_async" if sc.config.driver == "train_async" else "train"
            mod = driver_services_off(host.load_driver(f"{name}.py", f"miles_harness_upstream_{name}"))
            self.args, self.ctx, self.driver_mod = args, ctx, mod  # for hooks (harness.upstream.lives)
            if self.hooks is not None:
                self.hooks(self)
            try:
                validate_upstream_args(args)  # an error here is the job failing at start-up
                await mod.train(args)
            finally:
                holder["t_end"] = loop.time()
                me = asyncio.current_task()
                # what upstream leaves running when its driver returns or raises (before
                # run_virtual cancels it; tasks already being cancelled are not counted):
                # the fault sweep (harness.upstream.fault_sweep) tells orphans from the worker.
                # A task a Ray actor runs is that actor's process's, not the driver's (vray's
                # task_owner): it ends with the job (no actor of Miles' is detached), so it is
                # listed apart (actor_tasks) and never an orphan of the driver
                live = [t for t in asyncio.all_tasks() if t is not me and not t.done() and not t.cancelling()]
                owners = {t: vray.task_owner(t) for t in live}
                holder["live_tasks"] = sorted(_task_name(t) for t in live if owners[t] is None)
                holder["actor_tasks"] = sorted(f"{owners[t]}: {_task_name(t)}" for t in live if owners[t] is not None)
                self.unaccounted()
                self._emit(ev.RUN_END, pending_groups=self.accounting.pending())
                # the driver is gone: what tasks that outlive it on the one loop do until it
                # closes (a manager's generate, a rollout's recycling) is recorded as the core
                # records it, but no longer accounted (run_end listed what was pending)
                self.final_accounting, self.accounting = (
                    self.accounting,
                    GroupAccounting(fully_async=sc.config.fully_async),
                )
                self.ended = True

        error = None
        try:
            run_virtual(main())
        except (Exception, asyncio.CancelledError) as exc:
            error = exc
        finally:
            leaf_fakes.ON_RAISE = None
            self.lifecycle.task_sample.clear()
            self.lifecycle.task_root.clear()
            self.task_key.clear()
            self.accounting = self.final_accounting or self.accounting
            self.accounting.task_group.clear()
            self.accounting.returned_tasks.clear()
            self.accounting.publishing.clear()
        ctx = holder.get("ctx")
        problems = self.accounting.take_problems()
        # A fully-async worker that died after the last drain: upstream never reads its
        # exception, so the garbage collector would log "Task exception was never
        # retrieved" at a random later point, inside whatever test runs then (on CPython
        # 3.11 possibly inside an ast.parse: harness/checking/py311_guard.py). Read it here
        # and report it with the result instead.
        worker = getattr(self.rollout_fn, "_worker", None)
        worker_error = (
            worker.exception()
            if isinstance(worker, asyncio.Future) and worker.done() and not worker.cancelled()
            else None
        )
        result = UpstreamRunResult(
            scenario=sc,
            history=ctx.history if ctx else [],
            wall_s=holder.get("t_end", 0.0),
            events=self.sink.events if isinstance(self.sink, TraceRecorder) else [],
            error=error,
            get_samples_calls=self.get_samples_calls,
            extra={
                "abort_posts": list(self.abort_posts),
                "live_tasks": holder.get("live_tasks", []),
                "actor_tasks": holder.get("actor_tasks", []),
                "worker_error": worker_error,
            },
        )
        raised = leaf_fakes.RAISED[raised_before:]
        if raised:
            raise RunnerSeamError(raised, result)
        if problems:
            raise RunnerAccountingError(problems, result)
        return result


def _task_name(task: asyncio.Task) -> str:
    return getattr(task.get_coro(), "__qualname__", repr(task.get_coro()))


async def _each(refs: list) -> None:
    """Wait for every ref as the updater's ``ray.get([...])`` does
    (``update_weight_from_tensor.py:L257``, ``:L320``): a call done at ``.remote()`` costs no
    step of the loop, a pending one the crossing of its return (``harness.upstream.vray``);
    ``asyncio.gather`` would add its own callbacks' steps, which ``ray.get`` has not."""
    for ref in refs:
        await ref


def run_upstream(scenario: Scenario, **kwargs: Any) -> UpstreamRunResult:
    """Run ``scenario`` on upstream's code (the tree must be activated first)."""
    return UpstreamRunner(scenario, **kwargs).run()
