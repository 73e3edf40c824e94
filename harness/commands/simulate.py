"""`miles-harness simulate`: run a scenario on virtual time, print a summary, write the trace.

    miles-harness simulate [--scenario FILE] [--trace PATH] [--num-rollout N] [-- MILES ARGS]

With no scenario the built-in default runs (fully-async, B=16, n=4). Miles arguments
after ``--`` override the scenario's config. Before anything runs, the resulting config is
checked with the rules ``miles-harness check`` applies (``--profile``) and with what the
core's drivers refuse to start (``harness.commands.miles_args.refuse``): a broken rule or a
``--num-rollout`` below 1 is exit 2 with the rule's message, never a zero-step summary.
Next to the trace it writes the config the run used (``trace.config.json`` for
``trace.jsonl``), which ``miles-harness check-trace`` reads back.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from miles_async_core.config import AsyncConfig, parse_miles_args
from miles_async_core.errors import ConfigError
from miles_async_core.rules import PROFILES
from harness.commands.miles_args import refuse
from harness.sim.scenario import DEFAULT_SCENARIO, load_scenario
from harness.sim.run_scenario import format_summary, simulate, summarize
from harness.sim.watchdog import WatchdogTripped


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", help="scenario file (.toml or .json); default: the built-in scenario")
    p.add_argument("--trace", default="results/sim/trace.jsonl", help="where to write the JSONL trace")
    p.add_argument("--num-rollout", type=int, help="override the number of training steps (at least 1)")
    p.add_argument("--profile", default="manual", help=f"rule profile for validation: {', '.join(PROFILES)}")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON document")


def overlay_miles_args(cfg: dict, miles_args: list[str]) -> dict:
    """``cfg`` with the fields a Miles command line sets (those it moves off the
    ``AsyncConfig`` defaults) replaced; prints the parser's notes."""
    extra = [a for a in miles_args if a != "--"]
    cfg = dict(cfg)
    if extra:
        parsed, notes = parse_miles_args(extra)
        cfg.update({k: v for k, v in parsed.to_dict().items() if v != getattr(AsyncConfig(), k)})
        for note in notes:
            print(f"note: {note}")
    return cfg


def main(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario) if args.scenario else DEFAULT_SCENARIO
    cfg = overlay_miles_args(scenario.config.to_dict(), args.miles_args)
    if args.num_rollout is not None:
        if args.num_rollout < 1:
            raise ConfigError(
                f"--num-rollout {args.num_rollout}: the number of training steps must be at least 1. "
                "Fix: e.g. --num-rollout 8, or leave it out for the scenario's own"
            )
        cfg["num_rollout"] = args.num_rollout
    config = AsyncConfig.from_dict(cfg)
    refuse(config, args.profile, what=f"simulate of scenario {scenario.name!r}")
    scenario = dataclasses.replace(scenario, config=config)
    result = simulate(scenario)
    summary = summarize(result)
    if args.trace:
        from harness.trace import config_path, write_jsonl

        write_jsonl(result.events, args.trace)
        config_path(args.trace).write_text(
            json.dumps(
                {"scenario": scenario.name, "config": config.to_dict(), "complete": result.error is None},
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
    if args.json:
        print(json.dumps(summary, default=str, sort_keys=True))
    else:
        print(f"scenario: {scenario.name}")
        print(format_summary(summary))
        if args.trace:
            print(f"trace: {Path(args.trace)} ({len(result.events)} events; its config: {config_path(args.trace)})")
    if isinstance(result.error, WatchdogTripped):  # a hang or runaway: what ran last and where each task waits
        print(result.error.report)
    return 1 if result.error else 0
