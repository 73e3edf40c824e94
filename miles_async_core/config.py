"""`AsyncConfig`: every async-training flag, with Miles' names and defaults, and a parser
for a Miles command line.

Contract:

* ``AsyncConfig`` is a frozen keyword-only dataclass. Construction checks **types and
  choices** only (an int where Miles' argparse wants an int, a value among Miles'
  ``choices``) and raises ``ConfigError`` otherwise. **Ranges and flag combinations**
  (``--update-weights-interval 0``, ``--fully-async`` with ``abort`` ...) are not
  checked here: they are rules in ``miles_async_core.rules``, so ``miles-harness check``
  can report every violation at once and profiles can disagree about them.
* Defaults are Miles' (``miles/utils/arguments.py`` at ``rules.PINNED_MILES_COMMIT``) with three
  documented exceptions: ``rollout_batch_size`` is required by Miles and defaults to 8
  here; ``seed`` defaults to 0 here (Miles: 1234); ``driver`` stands for the script
  (``train.py`` or ``train_async.py``) and is not a flag.
* Harness-only fields (not Miles flags): ``async_max_retries`` (upstream has no retry
  cap; ``None`` keeps that behaviour), ``allow_async_colocate`` (the seed
  manual's colocated fully-async mode, which upstream's ``train_async.py:L23`` refuses;
  ``False`` keeps that refusal), ``cancel_orphaned_tasks`` (cancel the group tasks a dead
  fully-async worker leaves behind, which upstream leaves running; ``False`` leaves them
  running too), ``exactly_once_resume`` (a resume settles every source group exactly
  once, ``miles_async_core.checkpoint``; ``False`` saves and loads what upstream does)
  and ``driver``.
* ``save_interval`` and ``debug_exit_after_rollout`` are Miles' ``--save-interval`` and
  ``--debug-exit-after-rollout``; they act only in a run given a checkpoint folder
  (``RunContext.checkpoint``), as Miles saves only with ``--save``.
* ``to_dict()`` / ``from_dict()`` round-trip exactly; ``from_dict`` rejects unknown keys.
  ``resolved_dict()`` adds the derived values (capacity, G, resolved over-sampling and
  submission granularity) for results files.
* ``parse_miles_args(argv)`` never raises anything but ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from miles_async_core.errors import ConfigError

PAUSE_GENERATION_MODES = ("abort", "retract", "in_place")
UNUSED_SAMPLES_HANDLERS = ("drop", "retry")
SUBMISSION_GRANULARITIES = ("group", "sample")
TRAIN_BACKENDS = ("megatron", "fsdp")
DRIVERS = ("train", "train_async")
DRIVER_SCRIPTS = {"train.py": "train", "train_async.py": "train_async"}
# Fields that are harness extensions, not Miles flags; ``miles-harness check`` lists them apart.
HARNESS_EXTENSIONS = ("async_max_retries", "allow_async_colocate", "cancel_orphaned_tasks", "exactly_once_resume")


@dataclass(frozen=True, kw_only=True)
class AsyncConfig:
    """Resolved async-training settings. Field names are Miles' ``args`` attribute names."""

    # B. Miles makes --rollout-batch-size required; a harness needs a usable default.
    rollout_batch_size: int = 8
    n_samples_per_prompt: int = 1
    update_weights_interval: int = 1
    max_weight_staleness: int | None = None
    async_unused_samples_handler: str = "drop"
    async_max_concurrent_samples: int | None = None
    pause_generation_mode: str = "retract"
    over_sampling_batch_size: int | None = None
    async_data_buffer_capacity_factor: float = 2.0
    rollout_submission_granularity: str | None = None
    colocate: bool = False
    fully_async: bool = False
    train_backend: str = "megatron"
    driver: str = "train_async"
    num_rollout: int = 10
    start_rollout_id: int = 0
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    partial_rollout: bool = False
    use_rollout_logprobs: bool = False
    keep_old_actor: bool = False
    use_critic: bool = False
    seed: int = 0
    # --save-interval (None: no periodic save) and --debug-exit-after-rollout (None: run on)
    save_interval: int | None = None
    debug_exit_after_rollout: int | None = None
    # ---- harness extensions: not Miles flags, off (None) by default = upstream behaviour ----
    # How often one prompt may be recycled by the retry handler (upstream: unbounded).
    async_max_retries: int | None = None
    # Run --colocate under train_async.py (Miles' manual's colocated fully-async mode).
    # Upstream refuses it (train_async.py:L23); off = the drivers refuse it too.
    allow_async_colocate: bool = False
    # When the fully-async worker dies, cancel its sibling group tasks (and collect them).
    # Upstream leaves them running (fully_async_rollout.py:L128-L136); off = the core too.
    cancel_orphaned_tasks: bool = False
    # Resume exactly once: the data source's saved state is the consumption frontier (every
    # group taken and not yet trained is re-queued: in flight, buffered, recycled, taken by
    # the look-ahead generate), a checkpoint counts only once both parts are written, and
    # the resumed engines serve the checkpoint's weight version. Upstream saves the cursor
    # as it is at the save and loses the rest (miles_async_core.checkpoint); off = the core too.
    exactly_once_resume: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name))

    # ---- resolved values -------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Buffer capacity in groups: ``int(factor * B)`` (``fully_async_data_buffer.py``)."""
        return int(self.async_data_buffer_capacity_factor * self.rollout_batch_size)

    @property
    def group_budget(self) -> int:
        """G: groups in flight, ``max(1, x // n)`` if ``--async-max-concurrent-samples`` is
        set, else B (``fully_async_rollout.py:L106-L110``)."""
        x = self.async_max_concurrent_samples
        if x is None:
            return self.rollout_batch_size
        if self.n_samples_per_prompt < 1:
            raise ConfigError(
                f"group budget G is undefined: --n-samples-per-prompt {self.n_samples_per_prompt} "
                "divides --async-max-concurrent-samples. Allowed: n >= 1. "
                "Fix: pass --n-samples-per-prompt 1 or more."
            )
        return max(1, x // self.n_samples_per_prompt)

    @property
    def resolved_over_sampling_batch_size(self) -> int:
        """Unset means B (``arguments.py:L3447-L3448``)."""
        o = self.over_sampling_batch_size
        return self.rollout_batch_size if o is None else o

    @property
    def resolved_rollout_submission_granularity(self) -> str:
        """Unset means ``sample`` under ``--fully-async``, ``group`` otherwise."""
        g = self.rollout_submission_granularity
        if g is not None:
            return g
        return "sample" if self.fully_async else "group"

    # ---- serialisation ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Every field as given (unresolved); ``from_dict(to_dict())`` is the identity."""
        return dataclasses.asdict(self)

    def resolved_dict(self) -> dict[str, Any]:
        """Fields with their resolved values, plus ``capacity`` and ``group_budget``.

        A derived value that is undefined for this config (e.g. G with n = 0) is ``None``.
        """
        out = self.to_dict()
        out["over_sampling_batch_size"] = self.resolved_over_sampling_batch_size
        out["rollout_submission_granularity"] = self.resolved_rollout_submission_granularity
        out["capacity"] = self.capacity
        try:
            out["group_budget"] = self.group_budget
        except ConfigError:
            out["group_budget"] = None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AsyncConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(
                    f"unknown config key {key!r} (value {data[key]!r}). "
                    f"Allowed keys: {', '.join(sorted(known))}. Fix: remove or rename it."
                )
        return cls(**data)


# ---- field types ----------------------------------------------------------------------

# field -> (kind, choices). Kinds: int, opt_int, float, bool, choice, opt_choice.
_FIELD_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rollout_batch_size": ("int", ()),
    "n_samples_per_prompt": ("int", ()),
    "update_weights_interval": ("int", ()),
    "max_weight_staleness": ("opt_int", ()),
    "async_unused_samples_handler": ("choice", UNUSED_SAMPLES_HANDLERS),
    "async_max_concurrent_samples": ("opt_int", ()),
    "pause_generation_mode": ("choice", PAUSE_GENERATION_MODES),
    "over_sampling_batch_size": ("opt_int", ()),
    "async_data_buffer_capacity_factor": ("float", ()),
    "rollout_submission_granularity": ("opt_choice", SUBMISSION_GRANULARITIES),
    "colocate": ("bool", ()),
    "fully_async": ("bool", ()),
    "train_backend": ("choice", TRAIN_BACKENDS),
    "driver": ("choice", DRIVERS),
    "num_rollout": ("int", ()),
    "start_rollout_id": ("int", ()),
    "use_tis": ("bool", ()),
    "tis_clip": ("float", ()),
    "tis_clip_low": ("float", ()),
    "partial_rollout": ("bool", ()),
    "use_rollout_logprobs": ("bool", ()),
    "keep_old_actor": ("bool", ()),
    "use_critic": ("bool", ()),
    "seed": ("int", ()),
    "save_interval": ("opt_int", ()),
    "debug_exit_after_rollout": ("opt_int", ()),
    "async_max_retries": ("opt_int", ()),
    "allow_async_colocate": ("bool", ()),
    "cancel_orphaned_tasks": ("bool", ()),
    "exactly_once_resume": ("bool", ()),
}


def flag_of(field_name: str) -> str:
    """The command-line flag for a field: Miles' spelling, ``rollout_batch_size`` ->
    ``--rollout-batch-size``. ``driver`` is the script name, not a flag."""
    if field_name == "driver":
        return "train.py|train_async.py"
    return "--" + field_name.replace("_", "-")


def _describe_allowed(kind: str, choices: tuple[str, ...]) -> str:
    return {
        "int": "an integer",
        "opt_int": "an integer or unset (None)",
        "float": "a finite number",
        "bool": "true or false",
        "choice": "one of " + ", ".join(choices),
        "opt_choice": "one of " + ", ".join(choices) + " or unset (None)",
    }[kind]


def _check_type(name: str, value: Any) -> None:
    kind, choices = _FIELD_KINDS[name]
    if kind.startswith("opt_") and value is None:
        return
    base = kind.removeprefix("opt_")
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        "bool": isinstance(value, bool),
        "choice": value in choices,
    }[base]
    if not ok:
        raise ConfigError(
            f"{name} ({flag_of(name)}) = {value!r} is not allowed: expected "
            f"{_describe_allowed(kind, choices)}. Fix: pass {_describe_allowed(kind, choices)}."
        )


# ---- Miles command-line parsing -------------------------------------------------------

_FLAG_TO_FIELD = {flag_of(n): n for n in _FIELD_KINDS if n != "driver"}


def _convert(flag: str, raw: str, kind: str, choices: tuple[str, ...]) -> Any:
    """Convert one flag value the way Miles' argparse ``type=`` / ``choices=`` would."""
    base = kind.removeprefix("opt_")
    converters: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "choice": str}
    try:
        value = converters[base](raw)
    except ValueError:
        value = None
    if value is None or (base == "float" and not math.isfinite(value)) or (base == "choice" and value not in choices):
        allowed = _describe_allowed(base, choices)
        raise ConfigError(f"{flag} {raw!r}: expected {allowed}. Fix: pass {flag} with {allowed}.")
    return value


def _driver_of(token: str) -> str | None:
    return DRIVER_SCRIPTS.get(os.path.basename(token))


def _is_python(token: str) -> bool:
    return os.path.basename(token) in ("python", "python3") or os.path.basename(token).startswith("python3.")


def parse_miles_args(argv: list[str]) -> tuple[AsyncConfig, list[str]]:
    """Parse a Miles command line into an ``AsyncConfig`` plus human-readable notes.

    Accepts ``--flag value`` and ``--flag=value``; boolean flags are presence flags
    (``store_true`` in Miles). A leading ``python`` and a ``train.py`` /
    ``train_async.py`` token (or a path ending in one) select the driver. Flags this config
    does not model (Miles', Megatron's, SGLang's, or misspelled: the command line rejects
    those, ``harness.flags.known``) and the values that follow them are ignored and reported
    as notes; a later flag of the
    same name wins, as with argparse.
    """
    values: dict[str, Any] = {}
    notes: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":  # argparse's end-of-options marker; Miles takes no positionals
            continue
        if not token.startswith("--"):
            driver = _driver_of(token)
            if driver is not None:
                values["driver"] = driver
            elif _is_python(token) and not values and i == 1:
                pass
            elif token.endswith(".py"):
                raise ConfigError(
                    f"driver script {token!r} is not modelled. Allowed: train.py or "
                    "train_async.py (a path ending in one). Fix: pass one of them."
                )
            else:
                notes.append(f"ignored stray argument {token}")
            continue
        flag, has_eq, inline = token.partition("=")
        name = _FLAG_TO_FIELD.get(flag)
        if name is None:
            # Unknown flag: swallow the values that follow it (up to the next flag or script).
            taken = [inline] if has_eq else []
            while not has_eq and i < len(argv) and not argv[i].startswith("--") and (_driver_of(argv[i]) is None):
                taken.append(argv[i])
                i += 1
            notes.append(" ".join(["ignored, not modelled by the harness:", flag, *taken]))
            continue
        kind, choices = _FIELD_KINDS[name]
        if kind == "bool":
            if has_eq:
                raise ConfigError(
                    f"{flag}={inline!r}: {flag} is a presence flag and takes no value. "
                    f"Fix: pass {flag} alone to enable it, or leave it out."
                )
            values[name] = True
            continue
        if has_eq:
            raw = inline
        elif i < len(argv) and not argv[i].startswith("--"):
            raw = argv[i]
            i += 1
        else:
            raise ConfigError(
                f"{flag} needs a value: expected {_describe_allowed(kind.removeprefix('opt_'), choices)}. "
                f"Fix: pass {flag} VALUE or {flag}=VALUE."
            )
        values[name] = _convert(flag, raw, kind, choices)
    return AsyncConfig(**values), notes
