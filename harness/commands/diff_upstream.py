"""`miles-harness diff-upstream`: the same scenario on the core and on upstream Miles' own
code, and the first place they part.

    miles-harness diff-upstream [--miles-src PATH] [--scenario NAME ...] [--list]

With no ``--scenario`` every case of the matrix (``harness.upstream.diff.matrix``) runs.
Each case prints ``identical`` or its first divergence with the items around it on both
sides (``docs/upstream.md`` explains how to read it). The tree's seams are probed before
any case runs (``harness.upstream.seams``); a case whose driver the tree lacks a seam for
is not run, and says which seam; a stand-in or seam of the harness that fails inside
upstream's code is a harness error naming the seam, never a divergence.

Exit 0 when every case is identical or shows exactly its known divergence; 1 when
upstream differs (an unexpected result); 2 when the harness could not run faithfully (no
usable Miles tree, a missing seam, a harness error), which wins over 1.
"""

from __future__ import annotations

import argparse
import time

from miles_async_core.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--miles-src", help="upstream Miles checkout (default: $MILES_SRC, else the pinned tree "
                                       "beside the repository, ../shared/third_party/miles-<pinned commit>)")
    p.add_argument("--scenario", action="append", default=[], metavar="NAME",
                   help="a matrix case to run (repeatable); default: all")
    p.add_argument("--list", action="store_true", help="list the matrix cases and exit")


def main(args: argparse.Namespace) -> int:
    from harness.upstream import source

    path, how = source.find_miles_src(args.miles_src)
    if path is None:
        raise ConfigError(how)
    try:
        source.activate(path)
    except (source.UpstreamUnavailable, source.SeamMissing) as exc:
        raise ConfigError(str(exc)) from None
    from harness.upstream.diff import case_named, matrix, run_case

    if args.list:
        for c in matrix():
            print(f"{c.name:<36} {c.known.split(':')[0] if c.known else 'identical expected'}")
        return 0
    try:
        cases = [case_named(n) for n in args.scenario] if args.scenario else matrix()
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    print(f"upstream Miles: {how}")
    return _run_cases(cases, run_case)


def _run_cases(cases: list, run_case) -> int:
    from harness.upstream.harness_errors import HarnessError
    from harness.upstream.seams import SeamMissing

    bad, refused, broken = 0, [], []
    told: set[tuple[str, ...]] = set()  # each refusal's whole text once
    t0 = time.perf_counter()
    for case in cases:
        try:
            report = run_case(case)
        except SeamMissing as exc:
            refused.append(case.name)
            key = tuple(exc.seams)
            print(f"{case.name}: NOT RUN: missing seam {', '.join(key)}" + ("" if key in told else f"\n  {exc}"))
            told.add(key)
            continue
        except HarnessError as exc:
            broken.append(case.name)
            print(f"{case.name}: HARNESS ERROR (not an upstream finding): {exc}")
            continue
        print(report.format())
        if report.identical != (case.known is None):
            bad += 1
            print(f"  ^ UNEXPECTED: {'identical, but listed as ' + case.known.split(':')[0] if report.identical else 'a divergence no known name explains'}")
    ran = len(cases) - len(refused) - len(broken)
    identical = sum(1 for c in cases if c.known is None and c.name not in refused + broken)
    print(f"\n{len(cases)} cases in {time.perf_counter() - t0:.1f} s: {ran - bad} as expected "
          f"({identical} identical expected), {bad} unexpected, {len(refused)} not run (missing seam), "
          f"{len(broken)} harness errors")
    if refused or broken:
        print(f"exit 2: the harness could not run {len(refused) + len(broken)} case(s) faithfully on this tree "
              "(see `miles-harness doctor --miles-src PATH`)")
        return 2
    return 1 if bad else 0
