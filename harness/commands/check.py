"""`miles-harness check [--profile P] [--json] -- <miles args>`: validate a Miles command line.

The Miles command line is every word after ``--`` (``harness.cli``'s parsing rule), e.g.
``-- train_async.py --fully-async --rollout-batch-size 32``.

Prints the resolved config (one ``name = value`` per line, derived values included), the
notes about ignored flags, then every violated rule as ``[rule-id] message``. Exit codes:
0 when no error-severity rule is violated (notes never fail), 2 when one is or when the
command line cannot be parsed (the message, never a traceback). With ``--json`` the same
content is printed as one JSON document.
"""

from __future__ import annotations

import argparse
import json

from miles_async_core.config import HARNESS_EXTENSIONS, parse_miles_args
from harness.commands.miles_args import runnable_errors
from miles_async_core.rules import DEFAULT_PROFILE, PROFILES, errors, get_profile, validate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"rule profile: {', '.join(PROFILES)} (default {DEFAULT_PROFILE}: Miles' manual page on async training)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def main(args: argparse.Namespace) -> int:
    get_profile(args.profile)  # unknown profile: ConfigError before anything is printed
    config, notes = parse_miles_args(list(args.miles_args))
    violations = validate(config, args.profile)
    failed = bool(errors(violations))
    resolved = config.resolved_dict()
    if args.json:
        print(
            json.dumps(
                {
                    "profile": args.profile,
                    "ok": not failed,
                    "config": config.to_dict(),
                    "resolved": resolved,
                    "notes": notes,
                    "violations": [v.to_dict() for v in violations],
                },
                indent=2,
                sort_keys=True,
            )
        )
        return 2 if failed else 0
    print(f"# profile = {args.profile}")
    for name, value in resolved.items():
        if name not in HARNESS_EXTENSIONS:
            print(f"{name} = {'undefined' if value is None and name == 'group_budget' else value}")
    print("# harness extensions (not Miles flags; unset = upstream behaviour)")
    for name in HARNESS_EXTENSIONS:
        print(f"{name} = {resolved.get(name)}")
    for note in notes:
        print(f"note: {note}")
    for message in runnable_errors(config):  # the profile allows it; the harness's runs need more
        print(f"note: to run this in the harness (simulate, run): {message}")
    for v in violations:
        print(f"[{v.rule_id}] {v.severity}: {v.message}")
    n_errors = sum(v.severity == "error" for v in violations)
    n_notes = len(violations) - n_errors
    print(f"# {'FAIL' if failed else 'OK'}: {n_errors} error(s), {n_notes} note(s) under {args.profile}")
    return 2 if failed else 0
