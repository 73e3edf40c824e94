"""The main job's settings (``RunSpec``, one field per ``miles-harness run`` flag) and each
mode's Miles config (``mode_config``): ``sync`` = upstream ``train.py``, ``one-step`` =
``train_async.py``, ``fully-async`` = ``train_async.py --fully-async``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from typing import Any

import torch

from harness.backends.ray_engine import BROADCASTS
from harness.backends.torch_trainer import LR_SCALINGS
from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError

# each mode's upstream driver: sync = train.py, one-step = train_async.py, fully-async = train_async.py --fully-async
MODES: dict[str, tuple[str, bool]] = {  # mode -> (driver, fully_async)
    "sync": ("train", False),
    "one-step": ("train_async", False),
    "fully-async": ("train_async", True),
}
LAYOUTS = ("split", "colocate", "ray")


def _flag(
    default: Any,
    help_text: str,
    *,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    value_type: Callable[[str], Any] | None = None,
) -> Any:
    """A ``RunSpec`` field and its ``miles-harness run`` flag: ``flag`` (default: the field's
    name as ``--name-with-dashes``), ``help_text``, ``choices`` (checked by ``RunSpec``
    itself, so a bad value is a ``ConfigError`` naming the flag) and ``value_type`` (default:
    the default's type; a bool field is a switch that turns its default over)."""
    if value_type is None and default is not None:
        value_type = type(default)
    return field(default=default, metadata={"flag": flag, "help": help_text, "choices": choices, "type": value_type})


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """The main job's settings, and the one definition of ``miles-harness run``'s flags
    (``harness.commands.run`` builds its parser from these fields' metadata), so ``make
    run`` with no arguments runs ``RunSpec()``."""

    layout: str = _flag(
        "split",
        "split (engine in its own process), colocate, or ray (--num-engines engines as Ray actors)",
        choices=LAYOUTS,
    )
    model: str = _flag(
        "tiny", "tiny (built from a config), smollm2 (needs the model extra), or a local Hugging Face model directory"
    )
    task: str = _flag("copy", "copy (tiny model learns it) or arithmetic (for SmolLM2)")
    steps: int = _flag(40, "training steps per mode")
    # 3e-3 collapsed the copy policy to a prompt-blind constant (reward at chance)
    lr: float = _flag(1e-3, "learning rate")
    lr_scaling: str = _flag("none", "the seed's LR rule", choices=LR_SCALINGS)
    use_tis: bool = _flag(False, "truncated importance sampling on the rollout log-probs")
    tis_clip: float = _flag(2.0, "TIS weight clip")
    seed: int = _flag(0, "seed of the model, the prompts and the sampling")
    threads: int = _flag(1, "torch threads per process")
    max_running: int = _flag(16, "engine's continuous-batching width (requests)")
    tiny_d_model: int = _flag(256, "tiny model width", flag="--d-model")
    tiny_layers: int = _flag(4, "tiny model depth", flag="--layers")
    profile: str = _flag(
        "manual",
        "rule profile: manual (Miles' manual page on async training) or the pinned upstream Miles "
        "profile (miles-<pinned commit>; miles_async_core.rules.PROFILES)",
    )
    device: str = _flag(
        "cpu",
        "where the engine and trainer models live (cuda needs a CUDA build of torch and a GPU)",
        choices=("cpu", "cuda"),
    )
    # copy task only (None: the task's own); longer -> more decode steps; chance level 1 / task_symbols
    task_length: int | None = _flag(2, "copy task: symbols to copy", value_type=int)
    task_symbols: int | None = _flag(4, "copy task: alphabet size (1-8); chance level is 1 / this", value_type=int)
    repeats: int = _flag(
        2,
        "interleaved repeats of the modes (sync, one-step, fully-async, sync, ...); the "
        "table reports medians and min-max",
    )
    gap_decomposition: bool = _flag(
        True, "skip the per-step kernel / staleness gap decomposition (computed after the timed run)", flag="--no-gap"
    )
    num_engines: int = _flag(2, "ray layout: rollout engines (Ray actors)")
    ray_address: str | None = _flag(
        None, "ray layout: join this Ray cluster (default: start a local one sized to the machine)", value_type=str
    )
    broadcast: str = _flag(
        "put_once",
        "ray layout: weights to the engines by one ray.put (put_once) or one argument per engine",
        choices=BROADCASTS,
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            allowed = f.metadata["choices"]
            if allowed and getattr(self, f.name) not in allowed:
                raise ConfigError(
                    f"{flag_of(f)} {getattr(self, f.name)!r}: allowed {', '.join(allowed)}; fix: pick one of them"
                )
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"--device {self.device!r}: allowed cpu, cuda (cuda needs a CUDA build of torch and a "
                "GPU); fix: --device cpu"
            )
        if self.steps < 2:
            raise ConfigError(f"--steps {self.steps}: must be >= 2 to compare start and end; fix: e.g. --steps 40")
        if self.repeats < 1:
            raise ConfigError(f"--repeats {self.repeats}: must be >= 1; fix: e.g. --repeats 3")
        if self.num_engines < 1 or (self.num_engines != 2 and self.layout != "ray"):
            raise ConfigError(
                f"--num-engines {self.num_engines}: must be >= 1, and only the ray layout runs more "
                "than one engine; fix: --layout ray --num-engines N"
            )

    def task_kwargs(self) -> dict[str, Any]:
        """``get_task`` arguments: length and alphabet apply to the copy task only."""
        if self.task != "copy":
            return {}
        return {k: v for k, v in (("length", self.task_length), ("n_symbols", self.task_symbols)) if v}


def flag_of(f: Field[Any]) -> str:
    """The ``miles-harness run`` flag of a ``RunSpec`` field."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def mode_config(mode: str, base: AsyncConfig, spec: RunSpec) -> AsyncConfig:
    """``mode``'s Miles config on ``spec``'s layout; a mode the rule profile refuses is a
    ``ConfigError`` naming the rule."""
    if mode not in MODES:
        raise ConfigError(f"--modes: unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    driver, fully_async = MODES[mode]
    config = dataclasses.replace(base, driver=driver, fully_async=fully_async, num_rollout=spec.steps, seed=spec.seed)
    if base.colocate and spec.layout != "colocate":
        raise ConfigError(
            f"--colocate after -- with --layout {spec.layout}: the layout decides where the engine runs. "
            "Fix: pass --layout colocate instead of the Miles flag --colocate"
        )
    # upstream's train_async.py refuses --colocate; Miles' manual's colocated fully-async
    # mode is the harness extension allow_async_colocate, which only the user turns on
    # (-- --allow-async-colocate): harness.commands.miles_args.refuse names it otherwise
    config = dataclasses.replace(config, colocate=spec.layout == "colocate")
    from harness.commands.miles_args import refuse

    refuse(config, spec.profile, what=f"mode {mode} on the {spec.layout} layout")
    return config
