"""Validation of an ``AsyncConfig`` as named rule profiles.

Contract: ``validate(config, profile)`` runs every rule of the profile, in order, and
returns one ``Violation`` per rule whose check returns a message. It never raises for a
bad config (only for an unknown profile name, ``ConfigError``). A rule of severity
``"error"`` means the run must not start; ``"note"`` means the flag is accepted but
has no effect. Every message names the flags, the values given, what is allowed and the
fix.

Profiles (two, because Miles' manual and upstream's code disagree on colocation):

* ``manual`` (default): Miles' manual page on async training (radixark/miles
  ``docs/user-guide/fully-async.md``, "Fully Async RL", with its colocation section) as
  this project reads it. Colocation is
  allowed with ``--fully-async`` (Megatron only, not with ``in_place``) and with the
  synchronous ``train.py``, but not in one-step-ahead ``train_async.py``.
* ``miles-<pin>`` (``MILES_PROFILE``): what upstream radixark/miles enforces at the pinned
  commit ``PINNED_MILES_COMMIT``.
  ``train_async.py:L23`` rejects ``--colocate`` in both async modes and
  ``arguments.py:L50-L70`` rejects it again under ``--fully-async``; there is no
  ``in_place`` rule and no backend rule for colocation. Deliberate departures from
  upstream, each reported as an error although upstream does not check it:

  - ``--update-weights-interval`` < 1: upstream does not validate it; 0 crashes with
    ``ZeroDivisionError`` at ``train_async.py:L107`` and a negative k follows Python's
    modulo. Reporting it up front is strictly more useful than the crash.
  - ``--max-weight-staleness`` < 0: upstream accepts it; every versioned group is then
    filtered as stale, the drain starves, and with ``retry`` it recycles forever.
  - the harness-only ``--async-max-retries`` < 0 (no upstream counterpart).

  Upstream checks the buffer capacity (factor > 0, ``int(factor*B)`` >= 1) lazily, when
  the fully-async buffer is built, so this profile checks it only under
  ``--fully-async``; it does not check B >= 1 or n >= 1, which upstream never checks.
  The ``fully_async`` + ``partial_rollout`` rule quotes upstream's assertion
  (``miles/utils/arguments.py:L60``).

Rules shared by both profiles: ``--fully-async`` needs ``train_async.py``; not with
``abort``; not with ``--partial-rollout``; ``--async-max-concurrent-samples`` >= n;
``--over-sampling-batch-size`` >= B; ``--use-rollout-logprobs`` xor ``--use-tis``;
async PPO needs a behaviour-policy correction; PPO (``--use-critic``) needs Megatron
(``arguments.py:L3205-L3208``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError

# The upstream Miles commit this core is modelled on and checked against (radixark/miles).
PINNED_MILES_COMMIT = "31f1ca9"
MILES_PROFILE = f"miles-{PINNED_MILES_COMMIT}"

SEVERITIES = ("error", "note")


@dataclass(frozen=True, kw_only=True)
class Rule:
    id: str
    flags: tuple[str, ...]
    severity: str
    check: Callable[[AsyncConfig], str | None]

    def __post_init__(self) -> None:
        assert self.severity in SEVERITIES, self.severity


@dataclass(frozen=True, kw_only=True)
class Violation:
    rule_id: str
    flags: tuple[str, ...]
    severity: str
    message: str

    def to_dict(self) -> dict[str, object]:
        return {
            "rule_id": self.rule_id,
            "flags": list(self.flags),
            "severity": self.severity,
            "message": self.message,
        }


def _rule(
    rule_id: str, flags: tuple[str, ...], severity: str = "error"
) -> Callable[[Callable[[AsyncConfig], str | None]], Rule]:
    def wrap(check: Callable[[AsyncConfig], str | None]) -> Rule:
        return Rule(id=rule_id, flags=flags, severity=severity, check=check)

    return wrap


# ---- colocation and mode rules --------------------------------------------------------


@_rule("manual-colocate-needs-fully-async", ("--colocate", "--fully-async"))
def manual_colocate_needs_fully_async(c: AsyncConfig) -> str | None:
    if c.colocate and c.driver == "train_async" and not c.fully_async:
        return (
            "--colocate under train_async.py without --fully-async: the one-step-ahead mode "
            "overlaps generate(N+1) with train(N), which needs separate rollout GPUs. "
            "Allowed: --colocate with --fully-async, or --colocate with train.py. "
            "Fix: add --fully-async, drop --colocate, or run train.py."
        )
    return None


@_rule("manual-fully-async-colocate-no-in-place", ("--fully-async", "--colocate", "--pause-generation-mode"))
def manual_fully_async_colocate_no_in_place(c: AsyncConfig) -> str | None:
    if c.fully_async and c.colocate and c.pause_generation_mode == "in_place":
        # upstream: update_weight_from_tensor.py:L255-L258
        return (
            "--fully-async --colocate with --pause-generation-mode in_place: in_place keeps "
            "requests running on the engine, but the colocated updater always flushes the "
            "engine's cache (update_weight_from_tensor.py), which SGLang refuses "
            "while requests are in flight. "
            "Allowed with --colocate: retract. "
            "Fix: pass --pause-generation-mode retract (the default), or drop --colocate."
        )
    return None


@_rule("manual-colocated-fully-async-needs-megatron", ("--fully-async", "--colocate", "--train-backend"))
def manual_colocated_fully_async_needs_megatron(c: AsyncConfig) -> str | None:
    if c.fully_async and c.colocate and c.train_backend != "megatron":
        return (
            f"--fully-async --colocate with --train-backend {c.train_backend}: Miles' manual "
            "allows colocated fully-async training only with the Megatron trainer. "
            "Allowed: --train-backend megatron. "
            "Fix: pass --train-backend megatron, or drop --colocate and use separate GPUs."
        )
    return None


@_rule("manual-fully-async-over-sampling-no-effect", ("--fully-async", "--over-sampling-batch-size"), "note")
def manual_fully_async_over_sampling_no_effect(c: AsyncConfig) -> str | None:
    if c.fully_async and c.over_sampling_batch_size is not None:
        # upstream: fully_async_rollout.py:L113
        return (
            f"--fully-async with --over-sampling-batch-size {c.over_sampling_batch_size}: "
            "accepted but has no effect; the fully-async worker always pulls one prompt "
            "group per submission (fully_async_rollout.py). Allowed: any value >= "
            "--rollout-batch-size (it is ignored). "
            "Fix: drop --over-sampling-batch-size, or bound concurrency with "
            "--async-max-concurrent-samples instead."
        )
    return None


@_rule("manual-fully-async-no-abort", ("--fully-async", "--pause-generation-mode"))
def manual_fully_async_no_abort(c: AsyncConfig) -> str | None:
    if c.fully_async and c.pause_generation_mode == "abort":
        return (
            "--fully-async with --pause-generation-mode abort: generation is always in flight "
            "under --fully-async, so every weight update would kill it and force a full "
            "regeneration. Allowed: retract or in_place. "
            "Fix: pass --pause-generation-mode retract (the default) or in_place."
        )
    return None


@_rule("miles-fully-async-no-abort", ("--fully-async", "--pause-generation-mode"))
def miles_fully_async_no_abort(c: AsyncConfig) -> str | None:
    if c.fully_async and c.pause_generation_mode == "abort":
        # upstream: arguments.py:L61-L64
        return (
            "--fully-async with --pause-generation-mode abort; upstream (arguments.py): "
            '"--fully-async cannot use --pause-generation-mode abort: generation is always in '
            'flight, so every weight update would kill it and force a full regeneration". '
            "Allowed: retract or in_place. "
            "Fix: pass --pause-generation-mode retract (the default) or in_place."
        )
    return None


@_rule("miles-colocate-not-async", ("--colocate",))
def miles_colocate_not_async(c: AsyncConfig) -> str | None:
    if c.colocate and c.driver == "train_async":
        mode = "--fully-async" if c.fully_async else "one-step-ahead"
        # upstream: train_async.py:L23
        return (
            f"--colocate under train_async.py ({mode}); upstream (train_async.py): "
            '"Colocation is not supported for async training." '
            "Allowed: --colocate only with the synchronous train.py. "
            "Fix: drop --colocate and give rollout its own GPUs, or run train.py."
        )
    return None


@_rule("miles-fully-async-no-colocate", ("--fully-async", "--colocate"))
def miles_fully_async_no_colocate(c: AsyncConfig) -> str | None:
    if c.fully_async and c.colocate:
        # upstream: arguments.py:L59
        return (
            "--fully-async with --colocate; upstream (arguments.py): "
            '"--fully-async cannot colocate: rollout must keep generating while training runs". '
            "Allowed: --fully-async without --colocate. "
            "Fix: drop --colocate, or drop --fully-async and run train.py."
        )
    return None


@_rule("fully-async-needs-async-driver", ("--fully-async",))
def fully_async_needs_async_driver(c: AsyncConfig) -> str | None:
    if c.fully_async and c.driver == "train":
        # upstream: train.py:L23
        return (
            "--fully-async with driver train.py; upstream (train.py): "
            '"--fully-async requires the async driver: run train_async.py". '
            "Allowed: --fully-async only with train_async.py. "
            "Fix: run train_async.py, or drop --fully-async."
        )
    return None


@_rule("fully-async-no-partial-rollout", ("--fully-async", "--partial-rollout"))
def fully_async_no_partial_rollout(c: AsyncConfig) -> str | None:
    if c.fully_async and c.partial_rollout:
        # upstream: miles/utils/arguments.py:L60
        return (
            "--fully-async with --partial-rollout: upstream asserts against it "
            '(arguments.py: "--fully-async does not support --partial-rollout"); '
            "the fully-async worker never aborts a drain, so there "
            "are no partial groups to resume. Allowed: one of the two. "
            "Fix: drop --partial-rollout."
        )
    return None


# ---- numeric rules --------------------------------------------------------------------


@_rule("update-weights-interval-positive", ("--update-weights-interval",))
def update_weights_interval_positive(c: AsyncConfig) -> str | None:
    k = c.update_weights_interval
    if k < 1:
        # upstream: train_async.py:L107
        return (
            f"--update-weights-interval {k}: upstream does not validate it; train_async.py "
            "computes (rollout_id + 1) % k, so 0 crashes with ZeroDivisionError and a negative "
            "value follows Python's modulo. Allowed: an integer >= 1. "
            "Fix: pass --update-weights-interval 1 (the default) or more."
        )
    return None


@_rule("max-weight-staleness-non-negative", ("--max-weight-staleness",))
def max_weight_staleness_non_negative(c: AsyncConfig) -> str | None:
    s = c.max_weight_staleness
    if s is not None and s < 0:
        return (
            f"--max-weight-staleness {s}: upstream accepts it, but then every versioned group "
            "is filtered as stale, the drain starves, and with --async-unused-samples-handler "
            "retry it recycles forever. Allowed: an integer >= 0, or unset (no limit). "
            "Fix: pass --max-weight-staleness 0 or more, or leave it out."
        )
    return None


@_rule("async-max-concurrent-samples-at-least-n", ("--async-max-concurrent-samples", "--n-samples-per-prompt"))
def async_max_concurrent_samples_at_least_n(c: AsyncConfig) -> str | None:
    x, n = c.async_max_concurrent_samples, c.n_samples_per_prompt
    if x is not None and x < n:
        # upstream: arguments.py:L3400-L3405
        return (
            f"--async-max-concurrent-samples {x} with --n-samples-per-prompt {n}; upstream "
            f'(arguments.py): "--async-max-concurrent-samples ({x}) must be at least '
            f"--n-samples-per-prompt ({n}): the worker submits whole groups, so one group already "
            f'puts n_samples_per_prompt trajectories in flight". Allowed: >= {n}. '
            f"Fix: pass --async-max-concurrent-samples {max(n, 1)} or more, or leave it out."
        )
    return None


@_rule("over-sampling-at-least-batch", ("--over-sampling-batch-size", "--rollout-batch-size"))
def over_sampling_at_least_batch(c: AsyncConfig) -> str | None:
    o, b = c.over_sampling_batch_size, c.rollout_batch_size
    if o is not None and o < b:
        # upstream: arguments.py:L3450-L3453
        return (
            f"--over-sampling-batch-size {o} with --rollout-batch-size {b}; upstream "
            f'(arguments.py): "over_sampling_batch_size {o} should be greater than or '
            f'equal to rollout_batch_size {b}". Allowed: >= {b}, or unset (means {b}). '
            f"Fix: pass --over-sampling-batch-size {b} or more, or leave it out."
        )
    return None


@_rule("rollout-batch-size-positive", ("--rollout-batch-size",))
def rollout_batch_size_positive(c: AsyncConfig) -> str | None:
    if c.rollout_batch_size < 1:
        return (
            f"--rollout-batch-size {c.rollout_batch_size}: a training step needs at least one "
            "prompt group. Allowed: an integer >= 1. Fix: pass --rollout-batch-size 1 or more."
        )
    return None


@_rule("n-samples-per-prompt-positive", ("--n-samples-per-prompt",))
def n_samples_per_prompt_positive(c: AsyncConfig) -> str | None:
    if c.n_samples_per_prompt < 1:
        return (
            f"--n-samples-per-prompt {c.n_samples_per_prompt}: a group needs at least one "
            "trajectory. Allowed: an integer >= 1. Fix: pass --n-samples-per-prompt 1 or more."
        )
    return None


def _capacity_factor_message(c: AsyncConfig) -> str | None:
    f = c.async_data_buffer_capacity_factor
    if f <= 0:
        return (
            f"--async-data-buffer-capacity-factor {f}: the fully-async buffer holds "
            "int(factor * B) groups and asserts factor > 0 (fully_async_data_buffer.py). "
            "Allowed: a number > 0. Fix: pass --async-data-buffer-capacity-factor 2.0 (the default)."
        )
    return None


def _capacity_message(c: AsyncConfig) -> str | None:
    f, b = c.async_data_buffer_capacity_factor, c.rollout_batch_size
    if f > 0 and c.capacity < 1:
        return (
            f"--async-data-buffer-capacity-factor {f} with --rollout-batch-size {b}: capacity "
            f"int({f} * {b}) = {c.capacity} groups; the buffer asserts capacity >= 1 "
            "(fully_async_data_buffer.py). Allowed: factor * B >= 1. "
            + (
                f"Fix: raise --async-data-buffer-capacity-factor to at least {1 / b:.6g} or raise --rollout-batch-size."
                if b > 0
                else "Fix: pass --rollout-batch-size 1 or more."
            )
        )
    return None


_CAPACITY_FLAGS = ("--async-data-buffer-capacity-factor", "--rollout-batch-size")
capacity_factor_positive = Rule(
    id="capacity-factor-positive",
    flags=_CAPACITY_FLAGS[:1],
    severity="error",
    check=_capacity_factor_message,
)
capacity_at_least_one = Rule(
    id="capacity-at-least-one", flags=_CAPACITY_FLAGS, severity="error", check=_capacity_message
)


def _under_fully_async(check: Callable[[AsyncConfig], str | None]) -> Callable[[AsyncConfig], str | None]:
    def gated(c: AsyncConfig) -> str | None:
        msg = check(c) if c.fully_async else None
        return (
            None
            if msg is None
            else msg + " Upstream checks this only under --fully-async, lazily, at the first train call."
        )

    return gated


miles_capacity_factor_positive = Rule(
    id="capacity-factor-positive",
    flags=("--fully-async", *_CAPACITY_FLAGS[:1]),
    severity="error",
    check=_under_fully_async(_capacity_factor_message),
)
miles_capacity_at_least_one = Rule(
    id="capacity-at-least-one",
    flags=("--fully-async", *_CAPACITY_FLAGS),
    severity="error",
    check=_under_fully_async(_capacity_message),
)


@_rule("async-max-retries-non-negative", ("--async-max-retries",))
def async_max_retries_non_negative(c: AsyncConfig) -> str | None:
    r = c.async_max_retries
    if r is not None and r < 0:
        return (
            f"--async-max-retries {r} (harness-only): the number of times one prompt may be "
            "recycled cannot be negative. Allowed: an integer >= 0, or unset (unlimited, as "
            "upstream). Fix: pass --async-max-retries 0 or more, or leave it out."
        )
    return None


# ---- off-policy correction and backend ------------------------------------------------


@_rule("rollout-logprobs-tis-exclusive", ("--use-rollout-logprobs", "--use-tis"))
def rollout_logprobs_tis_exclusive(c: AsyncConfig) -> str | None:
    if c.use_rollout_logprobs and c.use_tis:
        # upstream: arguments.py:L3142-L3143
        return (
            "--use-rollout-logprobs with --use-tis; upstream (arguments.py): "
            '"use_rollout_logprobs and use_tis cannot be set at the same time." '
            "Allowed: at most one of them. Fix: drop one of the two flags."
        )
    return None


@_rule("async-ppo-needs-correction", ("--use-critic", "--use-rollout-logprobs", "--use-tis", "--keep-old-actor"))
def async_ppo_needs_correction(c: AsyncConfig) -> str | None:
    if c.driver == "train_async" and c.use_critic and not (c.use_rollout_logprobs or c.use_tis or c.keep_old_actor):
        # upstream: arguments.py:L3591-L3609
        return (
            "--use-critic under train_async.py without --use-rollout-logprobs, --use-tis or "
            '--keep-old-actor; upstream (arguments.py): "Async PPO training requires '
            'an explicit behavior-policy correction, ..." Allowed: --use-critic with one of '
            "those three. Fix: add --use-tis (or --use-rollout-logprobs, or --keep-old-actor)."
        )
    return None


@_rule("critic-needs-megatron", ("--use-critic", "--train-backend"))
def critic_needs_megatron(c: AsyncConfig) -> str | None:
    if c.use_critic and c.train_backend != "megatron":
        # upstream: arguments.py:L3205-L3208
        return (
            f"--use-critic with --train-backend {c.train_backend}; upstream "
            '(arguments.py): "Shared Actor/Critic PPO requires the Megatron backend". '
            "Allowed: --train-backend megatron. Fix: pass --train-backend megatron or drop --use-critic."
        )
    return None


# ---- profiles -------------------------------------------------------------------------

_SHARED_TAIL: tuple[Rule, ...] = (
    fully_async_needs_async_driver,
    fully_async_no_partial_rollout,
    update_weights_interval_positive,
    max_weight_staleness_non_negative,
    async_max_concurrent_samples_at_least_n,
    over_sampling_at_least_batch,
)
_CORRECTION: tuple[Rule, ...] = (
    async_max_retries_non_negative,
    rollout_logprobs_tis_exclusive,
    async_ppo_needs_correction,
    critic_needs_megatron,
)

PROFILES: dict[str, tuple[Rule, ...]] = {
    "manual": (
        manual_colocate_needs_fully_async,
        manual_fully_async_no_abort,
        manual_fully_async_colocate_no_in_place,
        manual_colocated_fully_async_needs_megatron,
        manual_fully_async_over_sampling_no_effect,
        *_SHARED_TAIL,
        rollout_batch_size_positive,
        n_samples_per_prompt_positive,
        capacity_factor_positive,
        capacity_at_least_one,
        *_CORRECTION,
    ),
    MILES_PROFILE: (
        miles_colocate_not_async,
        miles_fully_async_no_colocate,
        miles_fully_async_no_abort,
        *_SHARED_TAIL,
        miles_capacity_factor_positive,
        miles_capacity_at_least_one,
        *_CORRECTION,
    ),
}
DEFAULT_PROFILE = "manual"


def get_profile(name: str) -> tuple[Rule, ...]:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"--profile {name!r} is unknown. Allowed: {', '.join(PROFILES)}. "
            f"Fix: pass --profile {DEFAULT_PROFILE} (Miles' manual) or --profile {MILES_PROFILE}."
        ) from None


def validate(config: AsyncConfig, profile: str = DEFAULT_PROFILE) -> list[Violation]:
    """Every violated rule of ``profile``, in the profile's order."""
    out: list[Violation] = []
    for rule in get_profile(profile):
        message = rule.check(config)
        if message is not None:
            out.append(Violation(rule_id=rule.id, flags=rule.flags, severity=rule.severity, message=message))
    return out


def errors(violations: list[Violation]) -> list[Violation]:
    return [v for v in violations if v.severity == "error"]
