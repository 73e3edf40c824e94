"""`miles-harness resume-sweep`: stop and resume every setting, count what a resume loses.

    miles-harness resume-sweep [--host core|upstream] [--miles-src PATH] [--exactly-once] [--fast]
                               [--setting NAME ...] [--json PATH]

Runs ``harness.sim.resume_sweep``: each setting (driver, pause mode, unused-samples
handler, over-sampling, ``--partial-rollout``) crashed right after each save and at the
seeded points between saves, then resumed from its checkpoint, one case per stop, each
under the watchdog. ``--host core`` runs the core's drivers in virtual time (with
``--exactly-once``, the harness extension ``exactly_once_resume``); ``--host upstream`` runs
upstream Miles' own drivers from the tree ``--miles-src`` (or ``$MILES_SRC``) names, with
upstream's own save and load code on a checkpoint folder (``harness.upstream.lives``). Prints one line per
setting: resumes, groups lost and duplicated (total and per resume), the mechanism of each
loss, the response-length bias of lost against trained groups, and the checkers that
failed; then one line per driver and stop point. ``--json`` writes both summaries and
every case's row. The first line names the host (and the Miles tree it reads); a
``--miles-src`` without ``--host upstream`` is an error, not a tree silently ignored.
Exit 0 when every case ran
and every stop was reached (losses are findings, not errors), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from miles_async_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.sim.resume_sweep import Host

HOSTS = ("core", "upstream")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="core", help=f"who runs each case: {', '.join(HOSTS)}")
    p.add_argument("--miles-src", default=None, help="--host upstream: the Miles tree (default: $MILES_SRC)")
    p.add_argument(
        "--exactly-once", action="store_true", help="switch on the harness extension exactly_once_resume (core host)"
    )
    p.add_argument("--fast", action="store_true", help="only the fast subset of settings (one per driver)")
    p.add_argument("--setting", action="append", default=None, help="only this setting (repeatable)")
    p.add_argument("--json", default=None, help="write the summary and every case's row to this file")
    p.add_argument(
        "--orchestration",
        choices=("upstream", "stand-ins"),
        default="upstream",
        help="--host upstream: upstream's rollout manager, placement groups and train actors as upstream wrote "
        "them over faked leaves, with upstream's own save and load (default), or the harness' stand-ins",
    )


def host_of(
    name: str, miles_src: str | None = None, exactly_once: bool = False, orchestration: str = "upstream"
) -> Host:
    from harness.sim.resume_sweep import core_host

    if name == "core":
        if miles_src is not None:
            raise ConfigError(
                f"--miles-src {miles_src} with --host core: the core host runs this project's drivers and reads "
                "no Miles tree, so the tree would be ignored. Fix: add --host upstream to run that tree's "
                "drivers, or drop --miles-src"
            )
        return core_host
    if name == "upstream":
        if exactly_once:
            raise ConfigError(
                "--exactly-once with --host upstream: exactly_once_resume is a harness extension of the "
                "core; upstream Miles has none. Fix: drop --exactly-once or pass --host core"
            )
        from harness.upstream.lives import upstream_host
        from harness.upstream.source import UpstreamUnavailable

        try:
            return upstream_host(miles_src, orchestration=orchestration)
        except UpstreamUnavailable as exc:
            fix = "" if "Fix:" in str(exc) else ". Fix: pass --miles-src PATH (a Miles checkout) or set MILES_SRC"
            raise ConfigError(f"--host upstream: {exc}{fix}") from None
    raise ConfigError(f"--host {name!r} is not one of {', '.join(HOSTS)}. Fix: pass --host core or --host upstream")


def main(args: argparse.Namespace) -> int:
    from harness.sim.resume_sweep import (
        FAST,
        cases,
        format_by_stop,
        format_table,
        summarize,
        summarize_by_stop,
        sweep,
    )

    host = host_of(args.host, args.miles_src, args.exactly_once, getattr(args, "orchestration", "upstream"))
    only = args.setting if args.setting else (FAST if args.fast else None)
    todo = cases(args.exactly_once, only=only)
    if not todo:
        raise ConfigError(
            f"--setting {args.setting}: no such setting. Fix: pass a name the sweep lists "
            "(harness.sim.resume_sweep.settings), e.g. one-step/retract"
        )
    refuses = getattr(host, "refuses", None)  # the upstream host: settings upstream refuses to start
    refused = {c.setting: why for c in todo if refuses is not None and (why := refuses(c))}
    todo = [c for c in todo if c.setting not in refused]
    tree = getattr(host, "miles_tree", None)
    print(
        f"host: {args.host} ("
        + (
            f"upstream Miles' drivers and save/load code from {tree}, orchestration: {getattr(args, 'orchestration', 'upstream')}"
            if args.host == "upstream"
            else "the core's drivers"
        )
        + (", with the harness extension exactly_once_resume" if args.exactly_once else "")
        + ")"
    )
    rows = sweep(todo, host)
    summary, by_stop = summarize(rows), summarize_by_stop(rows)
    print(format_table(summary))
    print()
    print(format_by_stop(by_stop))
    for setting, why in refused.items():
        print(f"{setting}: not run, {why}")
    failed = [r for r in rows if r.error or not r.reached]
    if args.json:
        doc = {
            "host": args.host,
            "exactly_once_resume": args.exactly_once,
            "summary": summary,
            "by_stop": by_stop,
            **(
                {"miles_tree": getattr(host, "miles_tree", None), "refused": refused} if args.host == "upstream" else {}
            ),
            "cases": [r.to_dict() for r in rows],
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    for r in failed:
        print(f"case {r.case.name}: {'error ' + r.error if r.error else 'stop never reached'}")
    return 1 if failed else 0
