"""The main job's pieces on a layout: the model builder, a fresh trainer, the prompts,
and the engine (``split``: ``ProcessEngine``, its ``EngineCore`` in its own process;
``colocate``: ``TorchEngine`` in a thread of this process; ``ray``: ``RayEngineGroup``,
``num_engines`` Ray actors)."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable
from typing import Any

import torch

from harness.backends.tasks import Task
from harness.backends.torch_models import EngineModel
from harness.backends.torch_trainer import TorchTrainer, TrainerConfig
from harness.main_job.spec import RunSpec
from miles_async_core.config import AsyncConfig
from miles_async_core.contracts import EventSink

ModelBuilder = Callable[[], EngineModel]  # picklable: the split layout's engine process calls it too


def build_model_factory(spec: RunSpec, task: Task) -> ModelBuilder:
    """A picklable zero-argument builder (the engine process calls it too)."""
    if spec.model == "tiny":
        from harness.backends.torch_models import TinyLMConfig, build_tiny_lm

        cfg = TinyLMConfig(
            vocab_size=task.tokenizer.vocab_size,
            d_model=spec.tiny_d_model,
            n_layers=spec.tiny_layers,
            d_ff=spec.tiny_d_model * 11 // 4,
            seed=spec.seed,
        )
        return functools.partial(build_tiny_lm, cfg, device=spec.device)
    if spec.model == "smollm2":
        from harness.backends.torch_models import load_smollm2

        return functools.partial(load_smollm2, device=spec.device)
    from harness.backends.torch_models import load_hf_dir

    return functools.partial(load_hf_dir, spec.model, device=spec.device)


def prompt_fn(task: Task, seed: int) -> Callable[[int], tuple[str, list[int], object]]:
    def prompt(k: int) -> tuple[str, list[int], object]:
        s = task.sample_prompts(random.Random(seed * 1_000_003 + k), 1)[0]
        return s.prompt, s.prompt_tokens, s.label

    return prompt


def fresh_trainer(spec: RunSpec, build: ModelBuilder, config: AsyncConfig) -> TorchTrainer:
    """A fresh trainer on a fresh model: the same weights for every mode and for the gap replay."""
    torch.manual_seed(spec.seed)
    torch.set_num_threads(spec.threads)
    return TorchTrainer(
        build(),
        TrainerConfig(
            lr=spec.lr,
            lr_scaling=spec.lr_scaling,
            update_weights_interval=config.update_weights_interval,
            max_weight_staleness=config.max_weight_staleness or 0,
            use_tis=spec.use_tis,
            tis_clip=spec.tis_clip,
        ),
    )


def make_engine(spec: RunSpec, build: ModelBuilder, trainer: TorchTrainer, task: Task, sink: EventSink) -> Any:
    if spec.layout == "ray":
        from harness.backends.ray_engine import RayEngineGroup

        return RayEngineGroup(
            build,
            num_engines=spec.num_engines,
            max_running=spec.max_running,
            eos_token_id=task.eos_token_id,
            seed=spec.seed,
            num_threads=spec.threads,
            sink=sink,
            max_seq_len=trainer.model.max_seq_len,
            broadcast=spec.broadcast,
            address=spec.ray_address,
        )
    if spec.layout == "split":
        from harness.backends.process_engine import ProcessEngine

        return ProcessEngine(
            build,
            trainer.get_weights(),
            max_running=spec.max_running,
            eos_token_id=task.eos_token_id,
            seed=spec.seed,
            num_threads=spec.threads,
            sink=sink,
            max_seq_len=trainer.model.max_seq_len,
        )
    from harness.backends.torch_engine import EngineCore, TorchEngine

    engine_model = build()
    core = EngineCore(engine_model, max_running=spec.max_running, eos_token_id=task.eos_token_id)
    return TorchEngine(core, seed=spec.seed, sink=sink)  # it records its own generating phase and decode steps


def engine_pids(engine: Any) -> list[int]:
    """The Ray layout's engine actors that run on this host (``RayEngineGroup.clock``)."""
    return [c["pid"] for c in getattr(engine, "clock", []) if c.get("shared") and c.get("pid")]


def run_cpu_s(before: dict[str, Any], after: dict[str, Any], *, split: bool) -> float | None:
    """CPU seconds between two ``cpu_use`` snapshots: this process, plus the split layout's
    engine process (None: the engine's unreadable)."""
    own = after["main"] - before["main"]
    if not split:
        return own
    a, b = before["engines"][0], after["engines"][0]
    return None if a is None or b is None else own + b - a


async def close_engine(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if close is not None:
        await asyncio.to_thread(close)
