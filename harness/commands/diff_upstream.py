"""`miles-harness diff-upstream`: the same scenario on the core and on upstream Miles' own
code, and the first place they part.

    miles-harness diff-upstream [--miles-src PATH] [--scenario NAME ...] [--list]

With no ``--scenario`` every case of the matrix (``harness.upstream.diff.matrix``) runs.
Each case prints ``identical`` or its first divergence with the items around it on both
sides (``docs/upstream.md`` explains how to read it). The tree's seams are probed before
any case runs (``harness.upstream.seams``); a case whose driver the tree lacks a seam for
is not run, and says which seam; a leaf fake or seam of the harness that fails inside
upstream's code is a harness error naming the seam, never a divergence. Upstream runs its
own orchestration (rollout manager, placement groups, train actor group) over the
harness' leaves (``harness.upstream.leaves``).

Every upstream run is also judged on its own trace by every applicable invariant checker
(``harness.upstream.judge``): a case that differs from the core says "every invariant
holds" or which invariant it breaks, and a case that breaks one fails even when it is
identical (the core would then break it too). Upstream's own log (and the harness'
warnings) is captured per case (``harness.upstream.case_log``): printed under a failing
case, under every case with ``-v``, and kept in ``--log PATH``.

Exit 0 when every case is identical or shows exactly its known divergence and every
invariant holds; 1 when upstream differs (an unexpected result) or breaks an invariant;
2 when the harness could not run faithfully (no usable Miles tree, a missing seam, a
harness error, such as upstream calling a member a leaf fake of the harness lacks), which
wins over 1. ``miles-harness gate`` judges a pull request by the invariants against its
own base instead (``docs/gate.md``).
"""

from __future__ import annotations

import argparse
import time

from harness.upstream.exit_codes import Exit
from miles_async_core.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--miles-src",
        help="upstream Miles checkout (default: $MILES_SRC, else the pinned tree "
        "beside the repository, ../shared/third_party/miles-<pinned commit>)",
    )
    p.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="NAME",
        help="a matrix case to run (repeatable); default: all",
    )
    p.add_argument("--list", action="store_true", help="list the matrix cases and exit")
    from harness.upstream import source

    source.add_orchestration_flag(p)
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print upstream's captured log under every case (default: only under a failing one)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="also write each case's outcome and the totals as one JSON document (schema, tree, machine, commit)",
    )
    p.add_argument(
        "--log",
        metavar="PATH",
        default=None,
        help="where to keep upstream's log, per case (default: a new file in the system's temp dir)",
    )


def main(args: argparse.Namespace) -> int:
    from harness.upstream import source
    from harness.upstream.case_log import captured

    from harness.upstream.diff import case_named, matrix

    if args.list:  # the matrix is the harness's own: listing it reads no tree
        for c in matrix():
            print(f"{c.name:<36} {c.known.split(':')[0] if c.known else 'identical expected'}")
        return Exit.OK
    try:
        cases = [case_named(n) for n in args.scenario] if args.scenario else matrix()
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    path, how = source.find_miles_src(args.miles_src)
    if path is None:
        raise ConfigError(how)
    with captured() as import_log:
        try:
            source.activate(path)
        except (source.UpstreamUnavailable, source.SeamMissing) as exc:
            raise ConfigError(str(exc)) from None
    from harness.upstream.diff import run_case

    from harness.results.schema import portable

    # the tree as relative to the checkout: this line heads the committed differential files
    print(f"upstream Miles: {portable(how)}; host: upstream Miles' drivers in virtual time, beside the core")
    log = _log_file(args.log)
    log.add("(importing the tree)", import_log.getvalue())
    rows: list[dict] = []
    code = _run_cases(cases, run_case, log=log, verbose=bool(getattr(args, "verbose", False)), rows=rows)
    if getattr(args, "json", None):
        _write_json(args.json, rows, tree=how, exit_code=int(code))
    return code


def _write_json(where: str, rows: list[dict], *, tree: str, exit_code: int) -> None:
    """One document per run: every case's outcome (``identical``, ``differs`` with its first
    divergence, ``not_run``, ``harness_error``), whether upstream's own trace breaks an
    invariant, and the totals, with the tree, the machine and the harness' commit."""
    import collections
    import json
    from pathlib import Path

    from harness.results.schema import git_info, machine_info, portable, utc_now

    totals = collections.Counter(r["outcome"] for r in rows)
    totals["breaks_invariant"] = sum(1 for r in rows if r.get("broken"))
    doc = {
        "schema": "miles-harness/diff-upstream/1",
        "created_utc": utc_now(),
        "tree": tree,
        "orchestration": "upstream",
        "exit": exit_code,
        "totals": dict(sorted(totals.items())),
        "cases": rows,
        "git": git_info(),
        "machine": machine_info(),
    }
    path = Path(where)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(portable(json.dumps(doc, indent=1)) + "\n")
    print(f"wrote {path}")


def _log_file(where: str | None):
    import tempfile
    from pathlib import Path

    from harness.upstream.case_log import CaseLogFile

    if where is None:
        fd, name = tempfile.mkstemp(prefix="miles-harness-diff-upstream-", suffix=".log")
        import os

        os.close(fd)
        where = name
    return CaseLogFile(Path(where))


def _run_cases(cases: list, run_case, *, log=None, verbose: bool = False, rows: list[dict] | None = None) -> int:
    from harness.upstream import source
    from harness.upstream.case_log import captured, indent, tail
    from harness.upstream.harness_errors import HarnessError
    from harness.upstream.judge import check_leaves, judge
    from harness.upstream.seams import SeamMissing

    bad, broken_inv, refused, broken = 0, 0, [], []
    changed_holding = 0
    told: set[tuple[str, ...]] = set()  # each refusal's whole text once
    t0 = time.perf_counter()
    for case in cases:
        failing = False
        with captured() as out:
            try:
                report = run_case(case)
                check_leaves(report.upstream_result, source.active())
            except SeamMissing as exc:
                report = exc
            except HarnessError as exc:
                report = exc
        text = out.getvalue()
        if isinstance(report, SeamMissing):
            refused.append(case.name)
            key = tuple(report.seams)
            line = f"{case.name}: NOT RUN: missing seam {', '.join(key)}"
            print(line + ("" if key in told else f"\n  {report}"))
            told.add(key)
            row = {"case": case.name, "outcome": "not_run", "why": f"missing seam {', '.join(key)}"}
        elif isinstance(report, HarnessError):
            broken.append(case.name)
            line = f"{case.name}: HARNESS ERROR (not an upstream finding): {report}"
            print(line)
            row = {"case": case.name, "outcome": "harness_error", "why": str(report)}
            failing = True
        else:
            line = report.format()
            print(line)
            verdict = judge(report.upstream_result, case.scenario().config)
            row = {
                "case": case.name,
                "outcome": "identical" if report.identical else "differs",
                "first_divergence": None if report.first is None else list(report.first),
                "known": case.known,
                "broken": verdict.broken,
            }
            if not verdict.holds or not report.identical:
                print(f"  upstream on its own trace: {verdict.verdict()}")
            if not verdict.holds:
                broken_inv += 1
                failing = True
                from harness.checking.invariants import format_violations

                print(indent(format_violations(verdict.shown, limit=2), "  "))
            if report.identical != (case.known is None):
                bad += 1
                failing = True
                print(
                    f"  ^ UNEXPECTED: {'identical, but listed as ' + case.known.split(':')[0] if report.identical else 'a divergence no known name explains'}"
                )
                if not report.identical and verdict.holds:
                    changed_holding += 1
            line = line.splitlines()[0]
        if rows is not None:
            rows.append(row)
        if log is not None:
            log.add(case.name, text, line)
        if text.strip() and (verbose or failing):
            print(f"  upstream's log for {case.name}:")
            print(indent(text if verbose else tail(text)))
    ran = len(cases) - len(refused) - len(broken)
    identical = sum(1 for c in cases if c.known is None and c.name not in refused + broken)
    print(
        f"\n{len(cases)} cases in {time.perf_counter() - t0:.1f} s: {ran - bad} as expected "
        f"({identical} identical expected), {bad} unexpected"
        + (
            f" ({changed_holding} of them differ from the core with every invariant holding on upstream's trace)"
            if changed_holding
            else ""
        )
        + f", {broken_inv} breaking an invariant on upstream's trace, "
        f"{len(refused)} not run (missing seam), {len(broken)} harness errors"
    )
    if log is not None:
        print(f"upstream's log, per case: {log.path}")
    if refused or broken:
        print(
            f"exit 2: the harness could not run {len(refused) + len(broken)} case(s) faithfully on this tree "
            "(see `miles-harness doctor --miles-src PATH`)"
        )
        return Exit.HARNESS_ERROR
    return Exit.FINDING if bad or broken_inv else Exit.OK
