"""Upstream Miles end to end through the served CPU engine: real HTTP, real asyncio.

``run_upstream_e2e(E2EConfig(...))`` starts upstream's ``MilesRouter`` (its FastAPI app on
uvicorn in a thread, given to Miles by address: ``--sglang-router-ip/--sglang-router-port``,
so ``start_router`` returns it, ``router_manager.py:L24-L25``) and runs upstream's own
``train_async.py`` with upstream's own orchestration (``harness.serve.served_leaves``):
``create_placement_groups``, ``create_rollout_manager`` and ``create_training_models``, the
``RolloutManager`` actor with its data source (``RolloutDataSourceWithBuffer`` over a
generated JSONL of copy-task prompts), rollout function (one-step ``InferenceRolloutFn``,
``FullyAsyncRolloutFn`` with upstream's ``DefaultDataBuffer``) on Miles' own background
loop thread, post-processing and train-data conversion, the engine fleet's start-up with
upstream's ``SGLangEngine`` actors (ports allocated by ``addr_allocator.py``, each server
registered with the router by ``SGLangEngine._init_normal``), every engine control call
made by ``SGLangEngine``'s HTTP client methods, and the train actor group over the tree's
own ``TrainRayActor``. ``args`` is upstream's parser's, validated by ``miles_validate_args``.

The leaves, and only they, are the harness': Ray (``harness.upstream.vray`` in its
real-time mode), the SGLang server process (a CPU server with the tiny model on the host
and port upstream allocated), the trainer (``TorchTrainer``, GRPO on the tiny model,
behind the train actor's ``init``/``train``/``save_model``/``update_weights``; its weight
updates follow Megatron's updaters: ``update_weight_from_distributed/mixin.py:L309-L331``
for tensors, pause(mode) -> flush unless in_place -> begin -> buckets ->
update_weight_version -> end -> continue; ``delta.py:L252-L266`` for disk, pause(mode) ->
flush unless in_place -> update_weights_from_disk(weight_version) -> continue; the disk
path writes the new weights straight into the directory the engine reloads, where
upstream's ``pull_weights`` copies a published delta first, an endpoint of Miles' SGLang
fork), the object-store client and the outside services. Upstream's
trajectory-lifecycle seam (``TrajectoryLifecycle().sink``), a wrapper around
``single_turn.post`` and one around the manager's ``call_rollout_function`` *observe* each
``/generate`` call and each rollout (which sample, the server's per-token versions, the
version the manager passed); they return upstream's values unchanged. All are installed
for the run and restored after it (``host.installed``), as for every hosted run.

Checks (``E2EResult``): ``check_report`` on each server's trace, the update order of
each server's request log (``harness.serve.order``), per-token truth next to Miles'
recorded ``weight_versions`` for every trained sample, and what the engine did at the
pauses (retractions, tokens sampled on older KV). ``python -m harness.serve.upstream_e2e
--out results/serve/upstream_e2e.json`` writes them for the three standard runs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from miles_async_core.errors import ConfigError
from harness.upstream import host
from harness.upstream import leaf_fakes

TRANSFERS = ("tensor", "disk")
N_SYMBOLS = 3  # copy-task symbols a, b, c


@dataclass(frozen=True, kw_only=True)
class E2EConfig:
    """One run: ``steps`` training steps (upstream's ``--num-rollout``) of
    ``rollout_batch_size`` groups of ``n_samples_per_prompt`` samples, at most
    ``max_new_tokens`` each (the servers stop at the tokenizer's EOS unless
    ``stop_at_eos=False``), behind ``servers`` served engines. ``train_extra_s`` is added
    to every training step (the tiny model trains in milliseconds; a real trainer's step
    outlasts several groups' generation, and a run can be made to match)."""

    name: str = "one-step"
    fully_async: bool = False
    pause_mode: str = "retract"
    transfer: str = "tensor"
    servers: int = 2
    steps: int = 5
    rollout_batch_size: int = 4
    n_samples_per_prompt: int = 4
    over_sampling_batch_size: int | None = None
    max_new_tokens: int = 32
    stop_at_eos: bool = True
    max_weight_staleness: int | None = None
    max_concurrent_samples: int | None = None
    unused_samples_handler: str = "drop"
    buckets: int = 2
    lr: float = 1e-2
    seed: int = 0
    train_extra_s: float = 0.0

    def __post_init__(self) -> None:
        if self.transfer not in TRANSFERS:
            raise ConfigError(f"transfer={self.transfer!r}; allowed: {list(TRANSFERS)}.")
        if self.pause_mode not in ("abort", "retract", "in_place"):
            raise ConfigError(f"pause_mode={self.pause_mode!r}; allowed: abort, retract, in_place.")
        if self.fully_async and self.pause_mode == "abort":
            # upstream: arguments.py:L61
            raise ConfigError(
                "fully_async with pause_mode='abort' is refused by upstream (arguments.py). "
                "Fix: pass retract or in_place."
            )
        if not 1 <= self.servers <= 4 or self.steps < 1 or self.buckets < 1:
            raise ConfigError(
                f"servers={self.servers} (1..4), steps={self.steps} (>= 1) and buckets="
                f"{self.buckets} (>= 1) are out of range."
            )
        if self.train_extra_s < 0:
            raise ConfigError(
                f"train_extra_s={self.train_extra_s!r}: must be >= 0 (seconds added to each "
                "training step); fix: use 0 or a positive number."
            )


# The three runs the results file holds (at least 5 steps each: one-step, and fully async with
# retract and with in_place). Fully async keeps 2 groups in flight (8 samples) so generation,
# not training, is the bottleneck: the buffer stays short of full and a request is in flight
# at most updates; stopping at EOS staggers the groups, so the pause meets some of them
# mid-response (with equal lengths they run in lockstep and often all end just before it).
STANDARD_RUNS = (
    E2EConfig(
        name="one-step-retract-disk",
        fully_async=False,
        pause_mode="retract",
        transfer="disk",
        over_sampling_batch_size=6,
    ),
    E2EConfig(
        name="fully-async-retract-tensor",
        fully_async=True,
        pause_mode="retract",
        transfer="tensor",
        max_weight_staleness=1,
        max_concurrent_samples=8,
    ),
    E2EConfig(
        name="fully-async-in_place-tensor",
        fully_async=True,
        pause_mode="in_place",
        transfer="tensor",
        max_weight_staleness=1,
        max_concurrent_samples=8,
    ),
)


# --------------------------------------------------------------------------- local assets


def write_tiny_assets(
    root: Path, *, n_prompts: int = 256, seed: int = 0, n_symbols: int = N_SYMBOLS, length: int = 2
) -> tuple[Path, Path]:
    """A Hugging Face directory for the tiny model (``tokenizer.json`` etc. from the
    harness's ``CharTokenizer`` vocabulary, and a Llama-shaped ``config.json``) and a JSONL
    of copy-task prompts (``text``, ``label``). Nothing is downloaded."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from harness.backends.tasks import TINY_TOKENIZER, CopyTask
    from harness.backends.torch_models import TinyLMConfig

    char = TINY_TOKENIZER
    hf_dir = root / "tiny-hf"
    vocab = {tok: i for i, tok in enumerate(char.itos)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<pad>"
    )
    fast.save_pretrained(hf_dir)
    cfg = TinyLMConfig(vocab_size=char.vocab_size, seed=seed)
    (hf_dir / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": cfg.vocab_size,
                "hidden_size": cfg.d_model,
                "intermediate_size": cfg.d_ff,
                "num_hidden_layers": cfg.n_layers,
                "num_attention_heads": cfg.n_heads,
                "num_key_value_heads": cfg.n_heads,
                "max_position_embeddings": cfg.max_seq_len,
                "rope_theta": cfg.rope_theta,
                "rms_norm_eps": cfg.norm_eps,
                "hidden_act": "silu",
                "tie_word_embeddings": False,
                "torch_dtype": cfg.dtype,
                "pad_token_id": char.pad_token_id,
                "bos_token_id": char.bos_token_id,
                "eos_token_id": char.eos_token_id,
            },
            indent=1,
        )
    )
    task = CopyTask(n_symbols=n_symbols, length=length)
    rows = task.sample_prompts(random.Random(seed), n_prompts)
    prompts = root / "copy_prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": s.prompt, "label": s.label}) + "\n" for s in rows))
    return hf_dir, prompts


async def copy_task_rm(args: Any, sample: Any, **_: Any) -> float:
    """``--custom-rm-path`` target on upstream's sample: the copy task's positional reward
    (label characters reproduced at the start of the response), averaged with a dense
    part (the fraction of response tokens that are task symbols) so that a random tiny
    model's samples differ in reward and every GRPO step changes the weights."""
    from harness.backends.tasks import TINY_TOKENIZER

    response = list(sample.tokens[len(sample.tokens) - sample.response_length :]) if sample.response_length else []
    target = TINY_TOKENIZER.encode(str(sample.label))
    symbols = set(TINY_TOKENIZER.encode("abcdefgh"[:N_SYMBOLS]))
    positional = sum(1 for a, b in zip(response, target) if a == b) / len(target)
    dense = sum(1 for t in response if t in symbols) / len(response) if response else 0.0
    return 0.5 * positional + 0.5 * dense


# --------------------------------------------------------------------------- observing /generate


class _Observer:
    """Which sample a task is generating (the host's lifecycle sink, ``sink``) and a wrapper
    around ``single_turn.post`` recording each ``/generate`` answer for that sample."""

    def __init__(self, real_post: Any) -> None:
        self.real_post = real_post
        self.sink = host.LifecycleSink()
        self.calls: dict[int, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()

    async def post(self, url: str, payload: dict, *args: Any, **kwargs: Any) -> Any:
        sample = self.sink.sample_of(asyncio.current_task())
        out = await self.real_post(url, payload, *args, **kwargs)
        if sample is not None and url.endswith("/generate") and isinstance(out, dict):
            meta = out.get("meta_info", {})
            record = {
                "weight_version": meta.get("weight_version"),
                "spans": meta.get("weight_versions"),
                "runs": meta.get("token_versions"),
                "finish": (meta.get("finish_reason") or {}).get("type"),
                "output_ids": [int(e[1]) for e in meta.get("output_token_logprobs") or []],
                "num_retractions": meta.get("num_retractions", 0),
            }
            with self.lock:
                self.calls.setdefault(sample.index, []).append(record)
        return out

    def calls_for(self, index: int, response: list[int]) -> list[dict[str, Any]] | None:
        """The trailing calls of sample ``index`` whose outputs make up ``response``."""
        calls = self.calls.get(index, [])
        for start in range(len(calls) - 1, -1, -1):
            joined = [t for c in calls[start:] for t in c["output_ids"]]
            if joined == response:
                return calls[start:]
        return None


def e2e_rebinds(observer: _Observer) -> list[host.Rebind]:
    """What a served run rebinds in upstream (``host.installed``): ``single_turn.post``
    wrapped by ``observer`` (upstream's HTTP client still makes the call), the lifecycle
    sink, and the one-step progress bar off. Everything else is upstream's own."""
    return [
        host.Rebind(
            "http_post(single_turn)",
            host.module("miles.rollout.generate_hub.single_turn"),
            "post",
            lambda _: observer.post,
        ),
        host.sink_rebind(observer.sink),
        host.Rebind(
            "tqdm",
            host.module("miles.rollout.inference_rollout.inference_rollout_train"),
            "tqdm",
            lambda tqdm: functools.partial(tqdm, disable=True),
        ),
    ]


# --------------------------------------------------------------------------- the run


@dataclass
class E2EResult:
    config: E2EConfig
    steps_trained: int = 0
    wall_s: float = 0.0
    error: str | None = None
    servers: list[dict[str, Any]] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    trained: list[dict[str, Any]] = field(default_factory=list)
    train_metrics: list[dict[str, float]] = field(default_factory=list)
    ages: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)

    @property
    def violations(self) -> list[dict[str, str]]:
        return [v for s in self.servers for v in s["invariants"]["violations"]]

    @property
    def order_problems(self) -> list[str]:
        return [p for s in self.servers for p in s["update_order"]["problems"]]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["trained"] = len(self.trained)  # per-sample rows are summarised in "ages"
        out["spanning_examples"] = [  # up to 8 trained samples whose tokens span an update
            {k: r[k] for k in ("rollout_id", "index", "recorded", "token_versions", "kv_versions")}
            for r in self.trained
            if r["token_versions"] and len(set(r["token_versions"])) > 1
        ][:8]
        return out


def _args(cfg: E2EConfig, hf_dir: Path, prompts: Path, router_port: int) -> argparse.Namespace:
    """Upstream's parser's ``args`` for the run (``harness.upstream.runner.upstream_args``:
    every flag the tree defines has its default), with the served run's wiring: the local
    model and prompts, the reward, the router given by address (``start_router`` returns it,
    ``router_manager.py:L24-L25``), one engine per server and one trainer GPU."""
    from miles_async_core.config import AsyncConfig
    from harness.sim.scenario import Scenario
    from harness.upstream.runner import upstream_args

    config = AsyncConfig(
        rollout_batch_size=cfg.rollout_batch_size,
        n_samples_per_prompt=cfg.n_samples_per_prompt,
        fully_async=cfg.fully_async,
        pause_generation_mode=cfg.pause_mode,
        num_rollout=cfg.steps,
        max_weight_staleness=cfg.max_weight_staleness,
        seed=cfg.seed,
        async_unused_samples_handler=cfg.unused_samples_handler,
        over_sampling_batch_size=cfg.over_sampling_batch_size,
        async_max_concurrent_samples=cfg.max_concurrent_samples,
    )
    args = upstream_args(Scenario(name=cfg.name, config=config, max_new_tokens=cfg.max_new_tokens))
    vars(args).update(
        hf_checkpoint=str(hf_dir),
        prompt_data=str(prompts),
        input_key="text",
        label_key="label",
        custom_rm_path="harness.serve.upstream_e2e.copy_task_rm",
        custom_async_data_buffer_path=None,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=router_port,
        use_miles_router=True,
        sglang_server_concurrency=64,
        rollout_num_gpus=cfg.servers,
        rollout_num_gpus_per_engine=1,
        update_weight_local_checkpoint_dir=None,
        # Megatron's flags that upstream's engine start-up reads (the trainer's parser is the
        # train actor leaf's): Megatron's defaults
        fp16=False,
    )
    return args


def _core_sample(us: Any) -> Any:
    from miles_async_core.types import Sample

    n = int(us.response_length)
    tokens = list(us.tokens)
    return Sample(
        prompt=str(us.prompt),
        prompt_tokens=tokens[: len(tokens) - n],
        response_tokens=tokens[len(tokens) - n :],
        rollout_log_probs=list(us.rollout_log_probs or []),
        reward=float(us.reward),
        index=us.index,
        group_index=us.group_index,
        label=us.label,
        weight_versions=list(us.weight_versions),
    )


def _ints(xs: Any) -> list[int]:
    return [int(x) for x in (xs.tolist() if hasattr(xs, "tolist") else xs)]


def train_groups(data: dict[str, Any], n_samples_per_prompt: int) -> list[list[Any]]:
    """The shard upstream's object store hands a train actor (``process_rollout_data``) as
    the trainer's groups: each sample's prompt and response tokens, rollout log-probs and
    raw reward (upstream's ``rewards`` are already normalized per group), grouped as upstream
    lays them out (``n_samples_per_prompt`` consecutive samples per prompt)."""
    from miles_async_core.types import Sample

    rewards = data.get("raw_reward") or data["rewards"]
    log_probs = data.get("rollout_log_probs") or [[] for _ in data["tokens"]]
    indices = data.get("sample_indices") or list(range(len(data["tokens"])))
    samples = []
    for tokens, n, reward, lp, index in zip(data["tokens"], data["response_lengths"], rewards, log_probs, indices):
        tokens, n = _ints(tokens), int(n)
        samples.append(
            Sample(
                prompt_tokens=tokens[: len(tokens) - n],
                response_tokens=tokens[len(tokens) - n :],
                rollout_log_probs=[float(x) for x in (lp.tolist() if hasattr(lp, "tolist") else lp)],
                reward=float(reward),
                index=int(index),
            )
        )
    k = max(1, int(n_samples_per_prompt))
    return [samples[i : i + k] for i in range(0, len(samples), k)]


class _Run:
    """One served run: the leaves' state (``harness.serve.served_leaves``: the servers the
    engine actors launch, the trainer) and what the run observes."""

    def __init__(self, cfg: E2EConfig, workdir: Path) -> None:
        self.cfg = cfg
        self.name = cfg.name  # named by HostBusy
        self.workdir = workdir
        self.result = E2EResult(config=cfg)
        self.version_weights: dict[int, dict[str, Any]] = {}  # what each update sent
        self.router_counts: dict[str, int] = {}
        self.served: list[Any] = []  # the CPU servers upstream's engine actors launched
        self.trained_rows: list[dict[str, Any]] = []
        self.trainer: Any = None
        self.lock = threading.Lock()

    # --- leaf sglang_server: what SGLangEngine._init_normal launches ------------------------------
    def launch_engine(self, server_args: Any) -> Any:
        from harness.backends.tasks import TINY_TOKENIZER

        from .served_leaves import ServedProcess
        from .server import serve_in_thread

        eos: dict[str, Any] = {} if self.cfg.stop_at_eos else {"eos_token_id": None}
        server = serve_in_thread(
            "tiny",
            bind=server_args.host.strip("[]"),
            port=int(server_args.port),
            seed=self.cfg.seed,
            tokenizer=TINY_TOKENIZER,
            **eos,
        )
        with self.lock:
            self.served.append(server)
        return ServedProcess(server)

    # --- leaf train_actor: the kernels ServedTrainActor calls ---------------------------------------
    def trainer_init(self, args: Any, *, load: bool) -> int | None:
        """The trainer, and the checkpoint under ``--load`` when Megatron's tracker names one
        (returns that rollout, else ``None``)."""
        from .served_leaves import read_tracker

        folder = Path(args.load) if args.load else None
        loaded = read_tracker(folder)
        if load:
            self.trainer = self.make_trainer()
            if loaded is not None and folder is not None:
                self.load_trainer(folder / f"iter_{loaded:07d}" / "trainer.pt")
        return loaded

    def make_trainer(self) -> Any:
        from harness.backends.tasks import TINY_TOKENIZER
        from harness.backends.torch_models import TinyLMConfig, build_tiny_lm
        from harness.backends.torch_trainer import TorchTrainer, TrainerConfig

        model = build_tiny_lm(TinyLMConfig(vocab_size=TINY_TOKENIZER.vocab_size, seed=self.cfg.seed))
        return TorchTrainer(model, TrainerConfig(lr=self.cfg.lr))

    def load_trainer(self, path: Path) -> None:
        import torch

        state = torch.load(path, weights_only=False)
        self.trainer.model.module.load_state_dict(state["model"])
        self.trainer.optimizer.load_state_dict(state["optimizer"])
        self.trainer.optimizer_steps = state["optimizer_step"]

    def save_trainer(self, folder: Path, rollout_id: int, version: int) -> None:
        """The trainer into ``iter_<N>/trainer.pt``, then Megatron's tracker, last (a crash
        before it leaves the previous checkpoint)."""
        import torch

        from harness.record.writer import emit

        trainer = self.trainer
        steps = trainer.optimizer_steps
        it = folder / f"iter_{rollout_id:07d}"
        it.mkdir(parents=True, exist_ok=True)
        state = {
            "model": trainer.model.module.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "optimizer_step": steps,
            "version": version,
        }
        torch.save(state, it / "trainer.pt")
        (folder / "latest_checkpointed_iteration.txt").write_text(str(rollout_id))
        # the model part of the checkpoint, for a recorded run (a no-op without a record directory)
        emit(
            "checkpoint_saved",
            rollout_id=rollout_id,
            part="model",
            optimizer_step=steps,
            lr_step=steps,
            version=version,
        )

    async def train_shard(self, rollout_id: int, data: dict[str, Any]) -> None:
        groups = train_groups(data, self.args.n_samples_per_prompt)
        metrics = await self.trainer.train(rollout_id, groups)
        if self.cfg.train_extra_s:
            await asyncio.sleep(self.cfg.train_extra_s)
        self.result.train_metrics.append(metrics)
        self.result.steps_trained += 1

    async def weight_update(self, version: int, engines: list[Any], mode: str) -> None:
        """Megatron's updater with the engine handles upstream passed, pausing in ``mode``:
        each call through upstream's ``SGLangEngine`` actor, on every engine at once, in
        the updater's order."""
        from .served_leaves import each_engine

        cfg = self.cfg
        label = str(version)
        engines = [e for e in engines if e is not None]
        weights = await asyncio.to_thread(self.trainer.get_weights)
        previous = self.version_weights.get(version - 1)
        change = max(float((weights[k] - previous[k]).abs().max()) for k in weights) if previous else None
        self.version_weights[version] = weights
        t0 = time.monotonic()
        await each_engine(engines, "pause_generation", mode=mode)
        if mode != "in_place":
            await each_engine(engines, "flush_cache")
        if cfg.transfer == "disk":
            from .weights import save_weights_dir

            target = self.workdir / "weights" / label
            await asyncio.to_thread(save_weights_dir, weights, target)
            results = await each_engine(
                engines, "update_weights_from_disk", model_path=str(target), weight_version=label
            )
        else:
            from .weights import encode_named_tensors

            await each_engine(engines, "begin_weight_update", selector="all")
            names = list(weights)
            size = -(-len(names) // cfg.buckets)
            results = []
            for i in range(0, len(names), size):
                payload = [encode_named_tensors({k: weights[k] for k in names[i : i + size]})]
                results += await each_engine(
                    engines,
                    "update_weights_from_tensor",
                    serialized_named_tensors=payload,
                    load_format=None,
                    flush_cache=False,
                )
            await each_engine(engines, "update_weight_version", weight_version=label)
            await each_engine(engines, "end_weight_update")
        await each_engine(engines, "continue_generation")
        read_back = await each_engine(engines, "get_weight_version")
        if any(not r.get("success", False) for r in results if isinstance(r, dict)):
            raise RuntimeError(f"a weight update was refused: {results}")
        self.result.updates.append(
            {"version": label, "read_back": read_back, "max_abs_weight_change": change, "wall_s": time.monotonic() - t0}
        )

    def weight_update_reported(self, version: int) -> None:
        """The train actor reported ``version`` to the manager (upstream's own
        ``set_weight_version``): the update is recorded in ``weight_update`` already."""

    # --- observation: upstream's call_rollout_function, its input and output recorded ---------------
    def observe_rollout(self, real: Any) -> Any:
        @functools.wraps(real)
        def call(fn: Any, input: Any) -> Any:
            out = real(fn, input)
            if getattr(input, "rollout_id", None) is not None and hasattr(out, "samples"):
                rows = [self._row(input.rollout_id, input.weight_version, s) for g in out.samples for s in g]
                with self.lock:
                    self.trained_rows += rows
            return out

        return call

    def _row(self, rollout_id: int, version: int | None, s: Any) -> dict[str, Any]:
        n = int(s.response_length)
        response = [int(t) for t in s.tokens[len(s.tokens) - n :]] if n else []
        calls = self.observer.calls_for(s.index, response)
        true_versions: list[int] | None = None
        kv_versions: list[int] = []
        if calls is not None:
            true_versions = []
            for c in calls:
                for v, kv, count in c["runs"] or []:
                    true_versions += [int(v)] * int(count)
                    kv_versions += [int(kv)] * int(count)
        kv_older = sum(1 for v, kv in zip(true_versions or [], kv_versions) if kv < v)
        recorded = [int(v) for v in s.weight_versions if str(v).isdigit()]
        return {
            "rollout_id": rollout_id,
            "current_version": version,
            "index": s.index,
            "group_index": s.group_index,
            "recorded": list(s.weight_versions),
            "recorded_oldest": min(recorded) if recorded else None,
            "true_oldest": min(true_versions) if true_versions else None,
            "true_newest": max(true_versions) if true_versions else None,
            "tokens": n,
            "tokens_older_than_recorded": (
                sum(1 for v in true_versions if v < min(recorded)) if true_versions and recorded else 0
            ),
            "kv_older_tokens": kv_older,
            "calls_matched": calls is not None,
            "token_versions": true_versions,
            "kv_versions": kv_versions,
            "prompt_tokens": list(s.tokens[: len(s.tokens) - n]),
            "response_tokens": response,
            "rollout_log_probs": list(s.rollout_log_probs or []),
            "recorded_matches_calls": calls is not None
            and [c["weight_version"] for c in calls] == list(s.weight_versions),
        }

    # --- upstream's train_async.py over the leaves ------------------------------------------------
    def configure_args(self, args: Any) -> None:
        """Flags a subclass sets on upstream's ``args`` before the driver runs (the recorder's,
        a checkpoint folder): what a user would add to the command line."""

    def driver_module(self) -> Any:
        """Upstream's ``train_async.py`` as a fresh module (``host.load_driver``: the tree's
        file, or the text a seeded driver bug put in ``host.DRIVER_SOURCES``), its outside
        services off."""
        from harness.upstream.orchestration import driver_services_off

        return driver_services_off(host.load_driver("train_async.py", "miles_harness_served_train_async"))

    async def _main(self, driver: Any, args: Any) -> None:
        """Miles' start-up validation (``miles_validate_args``, as ``parse_args`` runs it),
        then the driver. A leaf fake reached past what it fakes stops the run at once,
        whatever upstream does with the error (it may catch it and retry)."""
        from harness.upstream.runner import validate_upstream_args

        me, loop = asyncio.current_task(), asyncio.get_running_loop()
        assert me is not None
        leaf_fakes.ON_RAISE = lambda exc: loop.call_soon_threadsafe(me.cancel)
        try:
            validate_upstream_args(args)
            await driver.train(args)
        finally:
            leaf_fakes.ON_RAISE = None

    # --- set-up and tear-down --------------------------------------------------------------------
    def execute(self) -> E2EResult:
        from miles.router.router import MilesRouter
        import miles.utils.http_utils as http_utils

        from harness.upstream import orchestration

        from .served_leaves import ServedTrainActor, served_rebinds
        from .uvicorn_thread import UvicornThread

        cfg = self.cfg
        t0 = time.monotonic()
        hf_dir, prompts = write_tiny_assets(self.workdir, seed=cfg.seed)
        router = None
        try:
            args = _args(cfg, hf_dir, prompts, 0)
            self.configure_args(args)
            self.args = args
            # the router as start_router launches it, on a copy of upstream's args
            # (router_manager.py:L39-L41), in a thread here, not a spawned process
            router_args = copy.copy(args)
            miles_router = MilesRouter(router_args)
            router = UvicornThread(miles_router.app, name="miles-router").start()
            assert router.port is not None, "the router thread binds its port on start()"
            args.sglang_router_port = router_args.sglang_router_port = router.port
            self.observer = _Observer(http_utils.post)
            driver = self.driver_module()
            rebinds = [*e2e_rebinds(self.observer), *served_rebinds(self)]
            raised = len(leaf_fakes.RAISED)
            with orchestration.hosted(ServedTrainActor, real_time=True), host.installed(self, rebinds):
                try:
                    asyncio.run(self._main(driver, args))
                except (Exception, asyncio.CancelledError) as exc:  # reported, and the servers are still checked
                    self.result.error = f"{type(exc).__name__}: {exc}"
                finally:
                    _cancel_rollout_tasks()
            # a fake upstream reached beyond what it has, wherever upstream caught it (an actor's
            # constructor, a task): the harness' error, not upstream's
            if leaked := leaf_fakes.RAISED[raised:]:
                self.result.error = f"harness_error: {type(leaked[0]).__name__}: {leaked[0]}"
        finally:
            if router is not None:  # first, gracefully: what it still forwards finishes (nothing is paused)
                router.stop()
                # MilesRouter.do_proxy counts a request before reading its body, outside its
                # try/finally (router.py:L142-L162): a client gone mid-body leaks one count
                self.router_counts = {u.rsplit(":", 1)[-1]: c for u, c in miles_router.worker_request_counts.items()}
            self.served.sort(key=lambda s: s.port)  # by engine rank: upstream allocates ports in rank order
            for s in self.served:
                s.stop()
        self.result.wall_s = time.monotonic() - t0
        self._check()
        return self.result

    def _check(self) -> None:
        from miles_async_core import events as ev
        from miles_async_core.config import AsyncConfig
        from harness.checking.invariants import check_report

        from .order import check_update_order, update_episodes

        cfg, res = self.cfg, self.result
        config = AsyncConfig(pause_generation_mode=cfg.pause_mode, fully_async=cfg.fully_async)
        retractions = paused_in_place = finished = 0
        for n, s in enumerate(self.served):
            events = list(s.trace.events)
            report = check_report(events, config, complete=False)
            report.pop("_violations", None)
            log = list(s.request_log)
            episodes = update_episodes(log)
            counts: dict[str, int] = {}
            for e in log:
                counts[e["path"]] = counts.get(e["path"], 0) + 1
            res.servers.append(
                {
                    "server": n,
                    "events": len(events),
                    "invariants": report,
                    "update_order": {
                        "problems": check_update_order(log),
                        "episodes": len(episodes),
                        "modes": sorted({str(ep["mode"]) for ep in episodes}),
                        "calls_first_episode": episodes[0]["calls"] if episodes else [],
                    },
                    "requests": counts,
                }
            )
            retractions += sum(1 for e in events if e.kind == ev.RETRACTED)
            paused_in_place += sum(1 for e in events if e.kind == ev.PAUSED_REQ)
            finished += sum(1 for e in events if e.kind == ev.FINISHED)
        res.engine = {
            "retracted": retractions,
            "paused_in_place": paused_in_place,
            "finished": finished,
            "router_outstanding_after_stop": self.router_counts,
        }
        res.trained = self.trained_rows
        res.ages = age_summary(self.trained_rows, max_weight_staleness=cfg.max_weight_staleness)
        res.engine["log_probs"] = logprob_check(self.trained_rows, self.version_weights, seed=cfg.seed)


def age_summary(rows: list[dict[str, Any]], *, max_weight_staleness: int | None) -> dict[str, Any]:
    """Miles' recorded ``weight_versions`` next to the server's per-token versions, over
    the trained samples of a run."""
    matched = [
        r for r in rows if r["calls_matched"] and r["true_oldest"] is not None and r["recorded_oldest"] is not None
    ]
    younger = [r for r in matched if r["recorded_oldest"] > r["true_oldest"]]
    spanning = [r for r in matched if r["true_newest"] != r["true_oldest"]]
    out: dict[str, Any] = {
        "samples_trained": len(rows),
        "samples_matched": len(matched),
        "recorded_equals_calls": sum(1 for r in rows if r["recorded_matches_calls"]),
        "samples_spanning_an_update": len(spanning),
        "samples_recorded_younger_than_oldest_token": len(younger),
        "samples_recorded_older_than_oldest_token": sum(1 for r in matched if r["recorded_oldest"] < r["true_oldest"]),
        "tokens_trained": sum(r["tokens"] for r in matched),
        "tokens_older_than_recorded": sum(r["tokens_older_than_recorded"] for r in matched),
        "tokens_on_older_kv": sum(r["kv_older_tokens"] for r in matched),
        "max_understatement": max((r["recorded_oldest"] - r["true_oldest"] for r in matched), default=0),
    }
    if max_weight_staleness is not None:
        # the buffer's staleness filter reads the recorded oldest version (fully_async_data_buffer.py)
        groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for r in matched:
            if r["current_version"] is not None:
                groups.setdefault((r["rollout_id"], r["group_index"]), []).append(r)
        over = [
            g
            for g in groups.values()
            if g[0]["current_version"] - min(r["true_oldest"] for r in g) > max_weight_staleness
        ]
        out["groups_trained"] = len(groups)
        out["groups_truly_staler_than_limit"] = len(over)
        out["max_weight_staleness"] = max_weight_staleness
    return out


def logprob_check(
    rows: list[dict[str, Any]], version_weights: dict[int, dict[str, Any]], *, seed: int = 0, tol: float = 1e-3
) -> dict[str, Any]:
    """Each trained token's rollout log-prob next to a fresh forward pass (prompt +
    response, no KV cache) under the weights of the version the server says sampled it.
    A token sampled on KV of its own version must match (retract re-prefills under the
    new weights); one sampled on older KV (in_place) need not."""
    import torch

    from harness.backends.tasks import TINY_TOKENIZER
    from harness.backends.torch_models import TinyLMConfig, build_tiny_lm
    from harness.backends.torch_trainer import response_log_probs
    from miles_async_core.types import Sample

    model = build_tiny_lm(TinyLMConfig(vocab_size=TINY_TOKENIZER.vocab_size, seed=seed))
    model.module.eval()
    same = {"tokens": 0, "match": 0, "max_abs_diff": 0.0}
    older = {"tokens": 0, "match": 0, "max_abs_diff": 0.0}
    by_version: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        for v in sorted(set(r["token_versions"] or [])):
            by_version.setdefault(v, []).append(r)
    for v, members in sorted(by_version.items()):
        if v not in version_weights:
            continue
        model.module.load_state_dict(version_weights[v])
        samples = [Sample(prompt_tokens=r["prompt_tokens"], response_tokens=r["response_tokens"]) for r in members]
        with torch.no_grad():
            fresh = response_log_probs(model, samples, 1.0)
        for r, lp in zip(members, fresh):
            for j, (tv, kv) in enumerate(zip(r["token_versions"], r["kv_versions"])):
                if tv != v:
                    continue
                diff = abs(float(lp[j]) - float(r["rollout_log_probs"][j]))
                bucket = same if kv == tv else older
                bucket["tokens"] += 1
                bucket["match"] += int(diff <= tol)
                bucket["max_abs_diff"] = max(bucket["max_abs_diff"], diff)
    return {"tolerance": tol, "kv_of_own_version": same, "kv_of_older_version": older}


def _cancel_rollout_tasks(timeout_s: float = 30.0) -> None:
    """End what upstream's rollout left on Miles' background loop (the fully-async worker
    and its in-flight groups never return on their own) before the servers stop."""
    from miles.utils.async_utils import get_async_loop

    loop = get_async_loop().loop

    async def sweep() -> int:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    asyncio.run_coroutine_threadsafe(sweep(), loop).result(timeout_s)


SERVED_SEAMS = ("engine_launch", "rollout_manager", "train_actor", "object_store")


def require_served_seams() -> None:
    """``SeamMissing`` naming each seam the served run rebinds (``served_leaves``) that the
    active tree lacks: without it the run would not be upstream's orchestration over the
    leaves, and its result would be the harness' blind spot read as upstream's."""
    from harness.upstream import seams, source

    report = source.report()
    missing = [p.seam for p in report.probes if p.seam.name in SERVED_SEAMS and not p.found]
    if missing:
        raise seams.SeamMissing(
            "the served run cannot host this tree: "
            + "; ".join(f"seam {s.name} missing in {report.tree / s.file} (looked for {s.looks_for})" for s in missing)
            + ". Fix: run the virtual-time commands (diff-upstream, gate) on it, or a tree that has them",
            [s.name for s in missing],
        )


def run_upstream_e2e(cfg: E2EConfig, *, miles_src: str | None = None) -> E2EResult:
    """One run (activates the upstream tree first; raises ``UpstreamUnavailable`` without one)."""
    from harness.upstream import source

    path, how = source.find_miles_src(miles_src)
    if path is None:
        raise source.UpstreamUnavailable(how)
    source.activate(path)
    require_served_seams()
    workdir = Path(tempfile.mkdtemp(prefix="miles-harness-served-"))
    try:
        return _Run(cfg, workdir).execute()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.serve.upstream_e2e", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write the JSON report here (e.g. results/serve/upstream_e2e.json)")
    p.add_argument("--miles-src", default=None)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    ns = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    runs = []
    for base in STANDARD_RUNS:
        cfg = E2EConfig(**{**asdict(base), "steps": ns.steps, "servers": ns.servers, "seed": ns.seed})
        res = run_upstream_e2e(cfg, miles_src=ns.miles_src)
        runs.append(res.to_json())
        print(
            f"{cfg.name}: steps={res.steps_trained} error={res.error} violations={len(res.violations)} "
            f"order_problems={len(res.order_problems)} ages={res.ages} engine={res.engine} wall={res.wall_s:.1f}s",
            flush=True,
        )
    from harness.results.schema import git_info, machine_info

    report = {
        "command": "python -m harness.serve.upstream_e2e " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git": git_info(),
        "machine": machine_info(),
        "python": platform.python_version(),
        "runs": runs,
    }
    if ns.out:
        os.makedirs(os.path.dirname(ns.out) or ".", exist_ok=True)
        Path(ns.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    ok = all(not r["error"] and r["steps_trained"] == ns.steps for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
