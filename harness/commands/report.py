"""`miles-harness report RESULTS... --out DIR`: PNG plots from results files.

Draws, per file, the phase timeline, sample-age histogram, speedup/overlap summary and
gap decomposition found in its ``extra`` section, and across files the metric history
(the ``extra`` keys are documented in ``harness/results/plots.py``). A plot whose data are
absent is skipped with a ``report: no ... skipped ...`` line. Files may be results files
or pytest-benchmark JSON. Exit 0 (even if every plot was skipped), 2 on an unreadable
or invalid file.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS", help="results files (or pytest-benchmark JSON)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the PNG files (created)")


def main(args: argparse.Namespace) -> int:
    from harness.results.plots import make_report  # matplotlib loads only for this command
    from harness.results.schema import load_any

    loaded = [(path, load_any(path)) for path in args.results]
    written = make_report(loaded, args.out)
    for path in written:
        print(f"report: wrote {path}")
    print(f"report: {len(written)} plot(s) in {args.out}")
    return 0
