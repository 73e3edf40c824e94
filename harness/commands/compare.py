"""`miles-harness compare BASE NEW [NEW2 ...]`: compare results files benchmark by benchmark.

Each NEW file is compared with BASE (or, with ``--history DIR``, with the run means of
the last ``--last`` runs of the same kind on the same machine found under DIR). The test
is on block means of each run's per-step samples (``--blocks``, default 5) or on run
means, after dropping the first ``--warmup-steps`` (default 1) steps: per-step samples
of one run are autocorrelated, so testing them directly would overstate significance. Files may be
miles-harness results files or pytest-benchmark ``--benchmark-json`` output. The
statistics and the threshold rule are documented in ``harness/results/rank_test.py``.

Each comparison says when a file ran on a busy host (its ``host`` record,
``harness.measure.host_load``): a busy run against a clean one, or two busy runs, gets a
"host: NOT COMPARABLE" line naming which file and why, and the other side as clean or as
not recorded (older files, pytest-benchmark output). The line is a warning: the exit code
is the thresholds' alone.

Exit codes: 0 no threshold failed; 1 a threshold failed; 2 bad input (unreadable or
damaged file, future schema, unknown threshold metric, changed benchmark definition).
"""

from __future__ import annotations

import argparse

from harness.measure.host_load import comparison_note
from harness.results.rank_test import (
    BLOCKS,
    HISTORY_LIMIT,
    WARMUP_STEPS,
    check_settings,
    compare_results,
    format_markdown,
    format_table,
    history_base,
    load_history,
    parse_threshold,
)
from harness.results.schema import Results, load_any
from miles_async_core.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="BASE NEW [NEW2 ...]; with --history only NEW [NEW2 ...]"
    )
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME:-P%",
        help="fail (exit 1) if NAME got significantly worse by more than P percent; repeatable",
    )
    parser.add_argument("--markdown", action="store_true", help="print GitHub-flavoured markdown tables")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level of the U test (default 0.05)")
    parser.add_argument(
        "--history",
        metavar="DIR",
        default=None,
        help="compare against earlier results files under DIR (same kind and machine)",
    )
    parser.add_argument(
        "--last",
        type=int,
        default=None,
        metavar="N",
        help=f"with --history: use the last N runs (default {HISTORY_LIMIT}, as Miles' history_limit)",
    )
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=WARMUP_STEPS,
        metavar="W",
        help=f"drop each run's first W per-step samples as warm-up (default {WARMUP_STEPS})",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        default=BLOCKS,
        metavar="K",
        help=f"split each run's remaining steps into K contiguous blocks and test the block means "
        f"(default {BLOCKS}); with --history the base side uses one mean per run",
    )


def main(args: argparse.Namespace) -> int:
    thresholds = [parse_threshold(t) for t in args.threshold]
    if not 0.0 < args.alpha < 1.0:
        raise ConfigError(f"--alpha {args.alpha}: must be between 0 and 1 (exclusive), e.g. 0.05.")
    check_settings(args.warmup_steps, args.blocks)
    if args.last is not None and args.history is None:
        raise ConfigError(f"--last {args.last} needs --history DIR: it selects how many earlier runs to use.")
    if args.history is None and len(args.files) < 2:
        raise ConfigError(
            f"compare got {len(args.files)} file ({args.files[0]}); it needs BASE and at least one NEW file, "
            "or --history DIR with the NEW file(s)."
        )
    fmt = format_markdown if args.markdown else format_table
    status = 0
    pairs: list[tuple[Results, str, tuple[str, ...], str]] = []  # (base, its label, notes, NEW file)
    if args.history is None:
        base = load_any(args.files[0])
        pairs = [(base, args.files[0], (), path) for path in args.files[1:]]
    else:
        last = HISTORY_LIMIT if args.last is None else args.last
        for path in args.files:
            new = load_any(path)
            runs = load_history(args.history, new)
            if not runs:
                # Miles' gate: a coordinate without trusted history is INACTIVE (cold start).
                print(
                    f"compare: no earlier '{new.kind}' runs for this machine under {args.history}: "
                    f"nothing to compare {path} with (cold start), passed"
                )
                continue
            base, notes = history_base(runs, new, last=last, warmup_steps=args.warmup_steps)
            label = f"{args.history} (means of last {min(last, len(runs))} of {len(runs)} runs)"
            pairs.append((base, label, notes, path))
    outputs = []
    for base, base_label, notes, path in pairs:
        new = load_any(path)
        host = comparison_note(base.host, new.host, base_label, path)
        comparison = compare_results(
            base,
            new,
            thresholds=thresholds,
            alpha=args.alpha,
            base_label=base_label,
            new_label=path,
            notes=notes + ((host,) if host else ()),
            warmup_steps=args.warmup_steps,
            blocks=args.blocks,
        )
        outputs.append(fmt(comparison))
        if comparison.failed:
            status = 1
    print("\n\n".join(outputs))
    return status
