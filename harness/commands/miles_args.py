"""The Miles command line of a command (the words after ``--``): parsed once, with one rule
for every command that takes it.

Contract: ``parse(args)`` returns the ``AsyncConfig`` the words after ``--`` give (on top
of ``base``), prints the parser's notes (flags of Miles the harness does not model are
ignored, with a note), and raises ``ConfigError`` for a flag that is no flag of Miles,
Megatron-LM or SGLang (``harness.flags.known``) unless ``--allow-unknown-miles-flags`` was
given. ``refuse(config, profile, ...)`` raises ``ConfigError`` for every error-severity
rule of the profile (the rules ``miles-harness check`` prints) and for what the core's
drivers refuse to run although the profile allows it (colocated ``train_async.py``
without the harness extension ``--allow-async-colocate``): a command that runs anything
calls it before the run starts.
"""

from __future__ import annotations

import argparse

from miles_async_core.config import AsyncConfig, parse_miles_args
from miles_async_core.errors import ConfigError
from miles_async_core.rules import errors, validate

from harness.flags.known import OPT_OUT, nearest, unknown_flags


def add_opt_out(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        OPT_OUT,
        action="store_true",
        help="accept Miles flags the harness does not know (a newer Miles tree's); they are ignored with a note",
    )


def check_known(miles: list[str], *, allow_unknown: bool) -> None:
    unknown = unknown_flags(miles)
    if not unknown or allow_unknown:
        return
    flag = unknown[0]
    near = nearest(flag)
    raise ConfigError(
        f"unknown Miles flag {flag}: not a flag of Miles, Megatron-LM or SGLang (--sglang-*)"
        + (f"; the nearest known flag is {near}" if near else "")
        + (f" (and {len(unknown) - 1} more unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else "")
        + f". Fix: {'use ' + near if near else 'correct or drop it'}, or pass {OPT_OUT} before -- if it is a "
        "flag of a newer Miles tree"
    )


def parse(miles: list[str], *, allow_unknown: bool, base: list[str] | None = None) -> AsyncConfig:
    check_known(miles, allow_unknown=allow_unknown)
    config, notes = parse_miles_args([*(base or []), *miles])
    for note in notes:
        print(f"note: {note}")
    return config


def runnable_errors(config: AsyncConfig) -> list[str]:
    """What the core's drivers refuse at start, or run to no effect, although a profile may
    allow it."""
    found = []
    if config.num_rollout <= config.start_rollout_id:
        found.append(
            f"[harness-no-steps] --num-rollout {config.num_rollout} with --start-rollout-id "
            f"{config.start_rollout_id}: no training step would run. Allowed: --num-rollout above "
            "--start-rollout-id. Fix: e.g. --num-rollout 8"
        )
    if config.colocate and config.driver == "train_async" and not config.allow_async_colocate:
        mode = "fully-async" if config.fully_async else "one-step-ahead"
        found.append(
            f"[harness-async-colocate-is-an-extension] --colocate under train_async.py ({mode}): "
            "upstream's train_async.py refuses it and so do the core's drivers; Miles' manual's colocated "
            "fully-async mode is the harness extension allow_async_colocate, off unless you turn it on. "
            "Fix: add --allow-async-colocate after --, or drop --colocate"
        )
    return found


def refuse(config: AsyncConfig, profile: str, *, what: str) -> None:
    """``ConfigError`` naming every rule ``config`` breaks, before ``what`` starts."""
    found = [f"[{v.rule_id}] {v.message}" for v in errors(validate(config, profile))] + runnable_errors(config)
    if found:
        raise ConfigError(f"{what} refused under rule profile {profile!r}: " + "; ".join(found))
