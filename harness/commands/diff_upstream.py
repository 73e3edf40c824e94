"""`miles-harness diff-upstream`: the same scenario on the core and on upstream Miles' own
code, and the first place they part.

    miles-harness diff-upstream [--miles-src PATH] [--scenario NAME ...] [--list]

With no ``--scenario`` every case of the matrix (``harness.upstream.diff.matrix``) runs.
Each case prints ``identical`` or its first divergence with the items around it on both
sides (``docs/upstream.md`` explains how to read it). Exit 0 when every case is identical
or shows exactly its known divergence, 1 otherwise, 2 without a usable Miles tree.
"""

from __future__ import annotations

import argparse
import time

from miles_async_core.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--miles-src", help="upstream Miles checkout (default: $MILES_SRC, else the pinned tree "
                                       "../shared/third_party/miles-31f1ca9)")
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
    except source.UpstreamUnavailable as exc:
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
    bad = 0
    t0 = time.perf_counter()
    for case in cases:
        report = run_case(case)
        print(report.format())
        expected = report.identical == (case.known is None)
        if not expected:
            bad += 1
            print(f"  ^ UNEXPECTED: {'identical, but listed as ' + case.known.split(':')[0] if report.identical else 'a divergence no known id explains'}")
    identical = sum(1 for c in cases if c.known is None)
    print(f"\n{len(cases)} cases in {time.perf_counter() - t0:.1f} s: {len(cases) - bad} as expected "
          f"({identical} identical expected), {bad} unexpected")
    return 1 if bad else 0
