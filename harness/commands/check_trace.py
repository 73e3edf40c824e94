"""`miles-harness check-trace TRACE.jsonl [--incomplete] [-- MILES ARGS]`: run every trace
invariant checker on a stored trace. `miles-harness check-trace --merge DIR [--incomplete]
[-- MILES ARGS]`: the same on the merged files of a run recorded with `harness.record`
(`docs/record.md`); its config is `DIR/merged.config.json` or the Miles flags after `--`.

Loads the JSONL trace (``harness.trace.read_jsonl``, as ``miles-harness simulate
--trace`` writes it) and the config it was recorded under: the ``TRACE.config.json``
simulate writes next to it, with Miles flags after ``--`` overriding its fields (as
``simulate`` applies them); without that file the Miles flags are the whole config.
Then runs ``harness.checking.invariants.check_all`` and prints each applicable checker
``PASS``/``FAIL`` with its violations (the slice of trace around each), and the checkers
that do not apply to this config. ``--incomplete`` (or a stored run that failed) checks
only what holds on the prefix of a failed run.

Exit codes: 0 every checker passed, 1 a violation, 2 bad input (a missing or malformed
trace or config file, a bad flag): the message names the file or flag, the value, what
is allowed and the fix.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from miles_async_core.config import AsyncConfig, parse_miles_args
from miles_async_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.checking.invariants.base import Violation


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "trace", nargs="?", default=None, help="a JSONL trace, as `miles-harness simulate --trace PATH` writes"
    )
    p.add_argument(
        "--merge",
        metavar="DIR",
        default=None,
        help="merge the per-process files harness.record wrote in DIR (MILES_HARNESS_RECORD_DIR) into "
        "one trace (DIR/merged.jsonl) and check it; checkers whose event kinds are missing are "
        "listed as not applicable with the kinds they lack",
    )
    p.add_argument(
        "--incomplete",
        action="store_true",
        help="the trace is the prefix of a failed or cancelled run: skip the checkers that need a "
        "complete run (conservation is relaxed to conservation_prefix)",
    )
    p.add_argument("--max-shown", type=int, default=5, help="violations printed per checker")


def load_config(trace: Path, miles_args: list[str]) -> tuple[AsyncConfig, bool, str]:
    """(config, complete, where the config came from)."""
    from harness.commands.simulate import overlay_miles_args
    from harness.trace import config_path

    stored = config_path(trace)
    miles = [a for a in miles_args if a != "--"]
    if not stored.exists():
        if not miles:
            raise ConfigError(
                f"trace {trace}: no config: {stored} does not exist and no Miles flags were given. "
                "Allowed: the config file `miles-harness simulate` writes next to its trace, or the "
                f"run's Miles command line. Fix: `miles-harness check-trace {trace} -- <miles args>`"
            )
        config, notes = parse_miles_args(miles)
        for note in notes:
            print(f"note: {note}")
        return config, True, "the Miles flags given"
    try:
        doc = json.loads(stored.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"config {stored}: cannot read it as JSON ({exc}). Allowed: the file `miles-harness "
            "simulate` writes. Fix: delete it and pass the Miles flags after --, or rerun simulate"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise ConfigError(
            f'config {stored}: {str(doc)[:80]!r} has no "config" object. Allowed: '
            '{"config": {field: value, ...}, "complete": bool}. Fix: rerun simulate'
        )
    try:
        config = AsyncConfig.from_dict(overlay_miles_args(doc["config"], miles))
    except (TypeError, ConfigError) as exc:
        raise ConfigError(f"config {stored}: {exc}") from None
    source = f"{stored}" + (" with the Miles flags given" if miles else "")
    return config, bool(doc.get("complete", True)), source


def main(args: argparse.Namespace) -> int:
    from harness.checking.invariants import applicable, check_all, format_violations
    from harness.trace import read_jsonl

    if args.max_shown < 1:
        raise ConfigError(f"--max-shown {args.max_shown}: must be >= 1. Fix: e.g. --max-shown 5")
    if args.merge is not None:
        if args.trace is not None:
            raise ConfigError(
                f"check-trace {args.trace} --merge {args.merge}: give a trace or --merge DIR, not both. Fix: drop one"
            )
        return main_merge(args)
    if args.trace is None:
        raise ConfigError(
            "check-trace: no trace. Allowed: a JSONL trace path, or --merge DIR. "
            "Fix: miles-harness check-trace TRACE.jsonl"
        )
    trace = Path(args.trace)
    events = read_jsonl(trace)
    if not events:
        raise ConfigError(
            f"trace {trace}: no events. Allowed: a JSONL trace with one event per line. "
            "Fix: pass the trace `miles-harness simulate --trace PATH` wrote"
        )
    config, complete, source = load_config(trace, args.miles_args)
    complete = complete and not args.incomplete
    print(f"trace: {trace} ({len(events)} events)")
    print(f"config: {source}; checked as a {'complete run' if complete else 'prefix of a failed run'}")
    violations = check_all(events, config, complete=complete)
    by_name: dict[str, list[Violation]] = {}
    for v in violations:
        by_name.setdefault(v.invariant, []).append(v)
    checks = applicable(config, complete=complete, events=events)
    width = max(len(c.name) for c in checks)
    for check in checks:
        found = by_name.get(check.name, [])
        status = "PASS" if not found else f"FAIL ({len(found)} violation{'s' if len(found) != 1 else ''})"
        print(f"{check.name:<{width}}  {status}")
    from harness.checking.invariants import ALL_CHECKS

    skipped = [name for name in ALL_CHECKS if name not in {c.name for c in checks}]
    if skipped:
        print(f"not applicable to this config{'' if complete else ' or to a prefix'}: {', '.join(skipped)}")
    if violations:
        print()
        for check in checks:
            if by_name.get(check.name):
                print(format_violations(by_name[check.name], limit=args.max_shown))
                print()
        print(f"FAILED: {len(violations)} violation(s) of {', '.join(sorted(by_name))}")
        return 1
    print(f"OK: {len(checks)} checkers passed")
    return 0


def main_merge(args: argparse.Namespace) -> int:
    """``--merge DIR``: the record directory of a run made with harness.record's flags."""
    from harness.checking.invariants import format_violations
    from harness.record.merge import MERGED_NAME, merge_dir, verdict
    from harness.trace import write_jsonl

    directory = Path(args.merge)
    merged = merge_dir(directory, incomplete=args.incomplete)
    if not merged.events:
        raise ConfigError(
            f"--merge {directory}: the process files hold no events. Fix: check that the recorder's "
            "flags were on the Miles command line"
        )
    config, complete, source = load_config(directory / MERGED_NAME, args.miles_args)
    complete = complete and not args.incomplete
    write_jsonl(merged.events, directory / MERGED_NAME)
    print(f"merged: {len(merged.processes)} process files -> {directory / MERGED_NAME} ({len(merged.events)} events)")
    for p in merged.processes:
        print(
            f"  {p['file']}: role={p['role']} pid={p['pid']} host={p['host']} events={p['events']}"
            + ("  TRUNCATED: last line cut short, dropped" if p["truncated"] else "")
        )
    if merged.join.get("joined") or merged.join.get("server_requests_unjoined"):
        print(f"  server requests joined to Miles samples: {merged.join}")
    print(f"config: {source}; checked as a {'complete run' if complete else 'prefix of a failed run'}")
    result = verdict(merged, config, complete=complete)
    width = max([len(n) for n in [*result["ran"], *result["lacking"]]] or [10])
    if result.get("lives"):
        print(f"lives: {result['lives']} joined (each life's checks on its own events; the resume checkers across)")
    for name, count in result["ran"].items():
        skipped = result.get("not_run_on_lives", {}).get(name)
        print(
            f"{name:<{width}}  {'PASS' if not count else f'FAIL ({count} violations)'}"
            + (f"  (not run on lives {skipped['lives']}: they lack {', '.join(skipped['lacking'])})" if skipped else "")
        )
    for name, kinds in result["lacking"].items():
        print(f"{name:<{width}}  NOT APPLICABLE: the trace has no {', '.join(kinds)} events")
    if result["not_for_config"]:
        print(
            f"not applicable to this config{'' if complete else ' or to a prefix'}: "
            f"{', '.join(result['not_for_config'])}"
        )
    found = {k: v for k, v in result["violations"].items() if v}
    if found:
        print()
        for vs in found.values():
            print(format_violations(vs, limit=args.max_shown))
            print()
        print(f"FAILED: {sum(len(v) for v in found.values())} violation(s) of {', '.join(sorted(found))}")
        return 1
    print(f"OK: {len(result['ran'])} checkers passed, {len(result['lacking'])} not applicable")
    return 0
