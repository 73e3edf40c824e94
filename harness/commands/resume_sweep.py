"""`miles-harness resume-sweep`: stop and resume every setting, count what a resume loses.

    miles-harness resume-sweep [--host core|upstream|core,upstream] [--miles-src PATH] [--exactly-once]
                               [--fast] [--setting NAME ...] [--json PATH]

Runs ``harness.lives.sweep``: each setting (driver, pause mode, unused-samples handler,
over-sampling, ``--partial-rollout``) stopped right after each save, three times in one
run, and at the seeded points between saves, then resumed from its checkpoint, each run
under the watchdog, on each host asked: ``core`` runs the core's drivers in virtual time
(with ``--exactly-once``, the harness extension ``exactly_once_resume``); ``upstream`` runs
upstream Miles' own drivers from the tree ``--miles-src`` (or ``$MILES_SRC``, else the
pinned tree) names, with upstream's own start-up, save and load code on a checkpoint
folder (``harness.upstream.lives``). The same cases run on every host, so the table's
rows (one per setting and host) compare cell by cell: resumes, groups lost and
duplicated (total and per resume), per stop the groups lost and duplicated per resume, the
mechanism of each loss, the response-length bias of lost against trained groups, and the
checkers that failed. Below the table: what a host did not run and why, and resumes that
failed. The first line names the hosts (and the Miles tree). ``--json`` writes the
summary and every case's row. A ``--miles-src`` without the upstream host is an error,
not a tree silently ignored. Exit 0 when every case a host ran ran and reached its stops
(losses and failed resumes are findings, not errors), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from miles_async_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.lives.run import LifeHost

HOSTS = ("core", "upstream")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host",
        default="core",
        help=f"who runs each case: {', '.join(HOSTS)}, or both as a comma list (core,upstream)",
    )
    p.add_argument("--miles-src", default=None, help="the upstream host's Miles tree (default: $MILES_SRC)")
    p.add_argument(
        "--exactly-once", action="store_true", help="switch on the harness extension exactly_once_resume (core host)"
    )
    p.add_argument("--fast", action="store_true", help="only the fast subset of settings (one per driver)")
    p.add_argument("--setting", action="append", default=None, help="only this setting (repeatable)")
    p.add_argument("--json", default=None, help="write the summary and every case's row to this file")
    from harness.upstream import source

    source.add_orchestration_flag(p)


def hosts_of(names: str, miles_src: str | None = None, exactly_once: bool = False) -> list[LifeHost]:
    """The hosts ``--host`` names (a comma list), in that order."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    bad = [n for n in wanted if n not in HOSTS]
    if not wanted or bad or len(set(wanted)) != len(wanted):
        raise ConfigError(
            f"--host {names!r}: allowed {', '.join(HOSTS)}, each once, as a comma list. "
            "Fix: pass --host core, --host upstream or --host core,upstream"
        )
    if miles_src is not None and "upstream" not in wanted:
        raise ConfigError(
            f"--miles-src {miles_src} with --host {names}: the core host runs this project's drivers and reads "
            "no Miles tree, so the tree would be ignored. Fix: pass --host upstream (or --host core,upstream) "
            "to run that tree's drivers, or drop --miles-src"
        )
    if exactly_once and "upstream" in wanted:
        raise ConfigError(
            "--exactly-once with the upstream host: exactly_once_resume is a harness extension of the "
            "core; upstream Miles has none. Fix: drop --exactly-once or pass --host core"
        )
    return [_host(n, miles_src) for n in wanted]


def _host(name: str, miles_src: str | None) -> LifeHost:
    if name == "core":
        from harness.lives.core import CoreHost

        return CoreHost()
    from harness.upstream.lives import upstream_host
    from harness.upstream.source import UpstreamUnavailable

    try:
        return upstream_host(miles_src)
    except UpstreamUnavailable as exc:
        fix = "" if "Fix:" in str(exc) else ". Fix: pass --miles-src PATH (a Miles checkout) or set MILES_SRC"
        raise ConfigError(f"--host upstream: {exc}{fix}") from None


def _describe(host: LifeHost, exactly_once: bool) -> str:
    if host.name == "upstream":
        tree = getattr(host, "miles_tree", None)
        return f"upstream (upstream Miles' drivers and save/load code from {tree}, its own orchestration over the harness' leaves)"
    return "core (the core's drivers" + (", with the harness extension exactly_once_resume)" if exactly_once else ")")


def main(args: argparse.Namespace) -> int:
    from harness.lives.sweep import FAST, cases, format_notes, format_table, summarize, sweep

    hosts = hosts_of(args.host, args.miles_src, args.exactly_once)
    only = args.setting if args.setting else (FAST if args.fast else None)
    todo = cases(args.exactly_once, only=only)
    if not todo:
        raise ConfigError(
            f"--setting {args.setting}: no such setting. Fix: pass a name the sweep lists "
            "(harness.lives.sweep.settings), e.g. one-step/retract"
        )
    print("hosts: " + "; ".join(_describe(h, args.exactly_once) for h in hosts))
    by_host = {h.name: sweep(todo, h) for h in hosts}
    # one row per setting and host, the hosts of a setting next to each other
    rows = [r for i in range(len(todo)) for h in hosts for r in by_host[h.name][i : i + 1]]
    summary = summarize(rows)
    print(format_table(summary))
    notes = format_notes(summary)
    if notes:
        print()
        print(notes)
    failed = [r for r in rows if r.refused is None and (r.error or not r.reached)]
    if args.json:
        doc = {
            "hosts": [h.name for h in hosts],
            "miles_tree": next((getattr(h, "miles_tree", None) for h in hosts if h.name == "upstream"), None),
            "orchestration": "upstream" if any(h.name == "upstream" for h in hosts) else None,
            "exactly_once_resume": args.exactly_once,
            "summary": summary,
            "cases": [r.to_dict() for r in rows],
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    for r in failed:
        print(f"case {r.case.name} ({r.host}): {'error ' + r.error if r.error else 'stop never reached'}")
    return 1 if failed else 0
