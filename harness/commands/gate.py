"""`miles-harness gate`: did this pull request break async training? The same cases on the
pull request's Miles tree and on its base, each judged by the invariants on its own
trace, then compared case by case.

    miles-harness gate [--miles-src HEAD_TREE] --base BASE [--out DIR] [--strict] [-v]
                       [--scenario NAME ...] [--fault-seeds N] [--jobs N] [--accept-unrun]

``--miles-src``: the pull request's tree (default: ``$MILES_SRC``, else the pinned tree).
``--base``: a second tree (a directory), or a git ref of the checkout ``--miles-src`` is
in (``origin/main``, a commit): that ref's files are exported with ``git archive`` to a
temporary tree, removed afterwards. The cases (``harness.upstream.gate_run``): the
differential's matrix and ``--fault-seeds`` drawn fault schedules, each run on both
trees, in one process per tree (``--jobs 2``: both at once). Each case gets a verdict
(``harness.upstream.gate``): unchanged, changed (every invariant holding), new violation,
did not start (on HEAD only), neither started (nothing checked), violation fixed, harness
error, no base, or not run (missing seam).

Written to ``--out DIR`` (default: a new directory in the system's temp dir, printed):
``summary.md`` (a pull-request comment), ``gate.json`` (every case's verdict),
``head.log`` and ``base.log`` (upstream's log, per case; the terminal shows verdicts, and
a failing case's log, all of them with ``-v``).

HEAD's process measures which of the pull request's changed lines run in its cases
(``harness.upstream.diff_coverage``); the terminal and the summary lead with it. Each flag
the pull request adds or gives another default gets cases with it set
(``harness.upstream.flag_cases``).

Exit 0 when nothing new is violated; 1 on a new violation (with ``--strict`` also on a
behaviour change); 2 on a harness error (a new violation wins); 3 refused (a tree no
driver can run faithfully, ``miles-harness doctor``; or no case compared); 4 where it
would be 0 but changed lines of the async code never ran in any case, or a case started
on neither tree (``--accept-unrun``: 0).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness.upstream.exit_codes import Exit
from miles_async_core.errors import ConfigError

DEFAULT_FAULT_SEEDS = 300


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--miles-src",
        help="the pull request's Miles checkout (default: $MILES_SRC, else the pinned tree beside the repository)",
    )
    p.add_argument(
        "--base",
        required=True,
        help="the base to compare with: a Miles tree (a directory) or a git ref of the checkout "
        "--miles-src is in (exported to a temporary tree)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="where summary.md, gate.json, head.log and base.log go (default: a new temp dir)",
    )
    p.add_argument("--strict", action="store_true", help="also fail (exit 1) on a behaviour change")
    p.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="NAME",
        help="a matrix case to run (repeatable); default: the whole matrix",
    )
    p.add_argument(
        "--fault-seeds",
        type=int,
        default=None,
        metavar="N",
        help=f"drawn fault schedules fault-seed-0..N-1 (default {DEFAULT_FAULT_SEEDS}; 0 with --scenario)",
    )
    p.add_argument(
        "--resume-cases",
        choices=("on", "off"),
        default=None,
        help="the resume cases: a crash right after a save and between the two saves of a rollout, one setting "
        "per driver, resumed through each tree's own save and load and judged by the resume checkers "
        "(default on; off with --scenario)",
    )
    p.add_argument(
        "--git-bisect",
        action="store_true",
        help="exit as `git bisect run` reads it: 0 good (nothing new violated), 1 bad (a finding), 125 skip "
        "(a harness error, a refused tree, an input it cannot use); see docs/gate.md, Bisecting a stack",
    )
    p.add_argument(
        "--accept-unrun",
        action="store_true",
        help="pass (exit 0) although changed lines of the async code never ran in any case, or a case started on "
        "neither tree (default: exit 4)",
    )
    p.add_argument("--jobs", type=int, default=2, choices=(1, 2), help="run the two trees at once (2) or in turn (1)")
    from harness.upstream import source

    source.add_orchestration_flag(p)
    p.add_argument("-v", "--verbose", action="store_true", help="print every case and its upstream log")


def _print_verdicts(verdicts: list, *, verbose: bool) -> None:
    """The first screen: one line per case that is not unchanged (every case with
    ``verbose``): its verdict, for a finding the invariant, its message with its slice of
    the trace and the command that reproduces it; cases neither tree started, harness
    errors, cases without a base and cases not run that share a message once, with the
    cases. Upstream's log is in the log
    files; ``verbose`` prints it under each case."""
    from harness.upstream.case_log import indent

    grouped: dict[tuple[str, str], list] = {}
    for v in verdicts:
        if v.verdict in LABEL_CAPS and not verbose:
            grouped.setdefault((v.verdict, v.message), []).append(v)
            continue
        if v.verdict != "unchanged" or verbose:
            print(v.line())
        if verbose and v.log.strip():
            print(indent(v.log))
    for (kind, message), vs in grouped.items():
        names = [v.name for v in vs]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        print(f"{LABEL_CAPS[kind]} in {len(names)} case(s) ({shown}): {message}")


LABEL_CAPS = {
    "neither_started": "NEITHER STARTED",
    "harness_error": "HARNESS ERROR",
    "not_run": "NOT RUN",
    "no_base": "NO BASE",
}


def _cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _refused(lines: list[str], out: Path | None) -> Exit:
    print("REFUSED (exit 3): " + "\n".join(lines))
    _leave_summary(out, "## Miles async gate: refused\n\n" + "\n".join(lines) + "\n")
    return Exit.REFUSED


def _leave_summary(out: Path | None, text: str) -> None:
    """A gate that ran no case leaves ``summary.md`` in ``--out`` when one was given, and
    nothing else."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(text)


def _plan(head: Path, base: Path, names: list[str], seeds: int, out: Path | None) -> Exit | None:
    """What is decided before any case runs, from the trees' files: identical trees (exit
    0), a pull request that does not compile (1), a tree that can run none of the cases'
    drivers (3). ``None``: run the cases."""
    from harness.upstream import gate_preflight as pre
    from harness.upstream import seams

    n = pre.identical(head, base)
    if n is not None:
        print(f"HEAD and BASE are identical ({n} files under miles/ and the drivers): no case run.\nexit 0")
        _leave_summary(out, f"## Miles async gate: identical trees\n\nHEAD and BASE have the same {n} files.\n")
        return Exit.OK
    errors = pre.new_compile_errors(head, base)
    if errors:
        lines = [f"HEAD does not compile: {e.where()}: {e.error}" for e in errors]
        print("\n".join(lines) + "\nexit 1: the pull request's code does not compile (BASE's does)")
        _leave_summary(out, "## Miles async gate: FAILED\n\n" + "\n".join(f"- {x}" for x in lines) + "\n")
        return Exit.FINDING
    drivers = _drivers(names, seeds)
    for flag, tree in (("--miles-src", head), ("--base", base)):
        report = seams.probe(tree)
        if not [d for d in drivers if not report.missing_for(d)]:
            return _refused(pre.refusal(report, drivers, flag), out)
    return None


def _flag_cases(head: Path, base: Path, drivers: list[str]) -> tuple[list, list[dict]]:
    """The flags HEAD's ``miles/utils/arguments.py`` adds or gives another default, and
    their cases on the first matrix case of each driver the gate runs
    (``harness.upstream.flag_cases``)."""
    from harness.upstream import flag_cases

    path, old = head / flag_cases.ARGUMENTS, base / flag_cases.ARGUMENTS
    if not path.is_file() or (old.is_file() and old.read_bytes() == path.read_bytes()):
        return [], []
    found = flag_cases.changes(path.read_text(), old.read_text() if old.is_file() else "")
    return found, flag_cases.specs(found, flag_cases.first_case_per_driver(drivers))


def flag_lines(flags: list) -> list[str]:
    """The first screen's lines for the flags the pull request adds or changes."""
    if not flags:
        return []
    return ["flags the pull request adds or gives another default:"] + [f"  {f.text()}" for f in flags]


def _flag_reproduce(head: Path, spec: dict) -> str:
    return (
        f"python -m harness.upstream.gate_run --tree {head} --out case.json --log case.log "
        f"--flag-case '{json.dumps(spec)}'"
    )


def _drivers(names: list[str], seeds: int) -> list[str]:
    """The drivers (``seams.DRIVERS`` order) the cases asked run."""
    from harness.upstream import fault_sweep, seams
    from harness.upstream.diff import case_named, matrix

    configs = [c.scenario().config for c in ([case_named(n) for n in names] if names else matrix())]
    configs += [fault_sweep.case_from_seed(s).scenario.config for s in range(seeds)]
    used = {seams.driver_of(c) for c in configs}
    return [d for d in seams.DRIVERS if d in used]


def _tree_stopped(docs: dict[str, dict], out: Path, given: bool) -> Exit | None:
    """A tree refused or broken at import (``gate_run``): the finding or the refusal, with
    the case files removed (only ``summary.md`` is left, in a given ``--out``)."""
    if not any("refused" in d or "broken" in d for d in docs.values()):
        return None
    for side in ("head", "base"):
        for suffix in (".log", ".stderr", ".cases.json"):
            (out / f"{side}{suffix}").unlink(missing_ok=True)
    if not given:
        shutil.rmtree(out, ignore_errors=True)
    keep = out if given else None
    broken = docs.get("head", {}).get("broken")
    if broken:
        line = f"HEAD does not import: {broken['file']}:L{broken['line']}: {broken['error']}"
        print(f"{line}\nexit 1: the pull request's code does not import")
        _leave_summary(keep, f"## Miles async gate: FAILED\n\n{line}\n")
        return Exit.FINDING
    for side, flag in (("head", "--miles-src"), ("base", "--base")):
        doc = docs.get(side, {})
        if "refused" in doc or "broken" in doc:
            why = doc.get("refused") or "{file}:L{line}: {error}".format(**doc["broken"])
            return _refused([f"{flag} {doc['tree']}: {why}"], keep)
    raise AssertionError("unreachable: a stopped tree is refused or broken")


# ``git bisect run``'s convention: 0 good, 1 bad, 125 skip (this commit cannot be judged)
GIT_BISECT = {Exit.OK: 0, Exit.UNCHECKED: 0, Exit.FINDING: 1}
GIT_SKIP = 125


def main(args: argparse.Namespace) -> int:
    """The gate; with ``--git-bisect`` its exit code in ``git bisect run``'s convention: a
    finding is bad (1), nothing new violated is good (0, unchecked lines included), a
    harness error, a refused tree or an input the gate cannot use is skipped (125)."""
    if not getattr(args, "git_bisect", False):
        return _main(args)
    try:
        code = _main(args)
    except ConfigError as exc:
        print(f"miles-harness gate: error: {exc}\ngit bisect: skip (125): this commit cannot be judged")
        return GIT_SKIP
    mapped = GIT_BISECT.get(Exit(code), GIT_SKIP) if code in set(Exit) else GIT_SKIP
    meaning = {0: "good", 1: "bad"}.get(mapped, "skip")
    print(f"git bisect: {meaning} ({mapped}): the gate exited {int(code)}")
    return mapped


def _main(args: argparse.Namespace) -> int:
    from harness.upstream import gate, gate_trees
    from harness.upstream.diff import case_named
    from harness.upstream.diff_coverage import report
    from harness.upstream.diff_lines import changed_files

    for name in args.scenario:
        try:
            case_named(name)
        except KeyError as exc:
            raise ConfigError(exc.args[0]) from None
    seeds = args.fault_seeds if args.fault_seeds is not None else (0 if args.scenario else DEFAULT_FAULT_SEEDS)
    given_resume = getattr(args, "resume_cases", None)
    resume = given_resume == "on" if given_resume is not None else not args.scenario
    if seeds < 0:
        raise ConfigError(f"--fault-seeds {seeds}: must be >= 0. Fix: e.g. --fault-seeds {DEFAULT_FAULT_SEEDS}")
    t0, cpu0 = time.perf_counter(), _cpu_s()
    given = Path(args.out).resolve() if args.out else None
    with ExitStack() as stack:
        head, how, base, base_name = gate_trees.resolve_trees(args.miles_src, args.base, stack)
        print(f"HEAD: {how}\nBASE: {base_name}")
        decided = _plan(head, base, list(args.scenario), seeds, given)
        if decided is not None:
            return decided
        changed = changed_files(head, base)
        if changed and importlib.util.find_spec("coverage") is None:
            raise ConfigError(
                "miles-harness gate measures which changed lines run with coverage.py, which is not installed."
                "\nFix: pip install 'coverage>=7' (part of the harness' upstream extra: pip install -e '.[upstream]')"
            )
        flags, specs = _flag_cases(head, base, _drivers(list(args.scenario), seeds))
        out = given or Path(tempfile.mkdtemp(prefix="miles-gate-"))
        out.mkdir(parents=True, exist_ok=True)
        try:
            docs = gate_trees.run_trees(head, base, out, list(args.scenario), seeds, args.jobs, changed, specs, resume)
        except gate_trees.WorkerFailed as exc:
            print(f"HARNESS ERROR (exit 2): {exc}")
            return Exit.HARNESS_ERROR
        # read now: an exported base is removed when the stack closes
        head_doc = docs.get("head", {})
        cov = report(head, base, changed, head_doc.get("coverage", {}), len(head_doc.get("cases", [])))
    stopped = _tree_stopped(docs, out, given is not None)
    if stopped is not None:
        return stopped
    verdicts = gate.classify_all(docs["head"]["cases"], docs["base"]["cases"])
    by_name = {spec["name"]: spec for spec in specs}
    for v in verdicts:
        if v.verdict in gate.FINDINGS:
            spec = by_name.get(v.name)
            v.reproduce = (
                gate.reproduce(v.name, str(head)) if spec is None else _flag_reproduce(head, {**spec, "set": True})
            )
    code = gate.exit_code(verdicts, strict=args.strict, accept_unrun=args.accept_unrun)
    lines_unrun = bool(cov.unchecked) and not args.accept_unrun
    if code == Exit.OK and lines_unrun:
        code = Exit.UNCHECKED
    accepted = bool(cov.unchecked) and args.accept_unrun
    neither = sum(v.verdict in gate.UNCHECKED for v in verdicts)
    lead = (
        cov.lines()
        + (["  accepted with --accept-unrun"] if accepted else [])
        + (
            [f"{neither} case(s) started on neither tree: accepted with --accept-unrun"]
            if neither and args.accept_unrun
            else []
        )
        + flag_lines(flags)
    )
    print("\n".join(lead))
    _print_verdicts(verdicts, verbose=args.verbose)
    aspects = gate.aspect_counts(verdicts)
    if aspects:
        print("what differs, by aspect (cases): " + ", ".join(f"{k} {n}" for k, n in aspects))
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    head_name = str(args.miles_src or head)
    run = dict(head=head_name, base=args.base, code=code, wall_s=wall, cpu_s=cpu, strict=args.strict)
    md = gate.summary_markdown(verdicts, **run, lead=lead, lines_unrun=lines_unrun)
    doc = gate.summary_json(
        verdicts,
        **run,
        trees={s: {k: docs[s].get(k) for k in ("tree", "wall_s", "cpu_s")} for s in docs},
    )
    doc["coverage"] = {**cov.to_json(), "accepted": accepted}
    doc["flags"] = [{"flag": f.flag.option, "text": f.text(), "value": f.value, "skip": f.skip} for f in flags]
    (out / "summary.md").write_text(md)
    (out / "gate.json").write_text(json.dumps(doc, indent=1))
    for side in ("head", "base"):
        (out / f"{side}.cases.json").unlink(missing_ok=True)
        if (out / f"{side}.stderr").is_file() and not (out / f"{side}.stderr").read_text().strip():
            (out / f"{side}.stderr").unlink()
    print(
        f"\n{gate.counts_line(verdicts)}\n{gate.headline(verdicts, code, args.strict, lines_unrun=lines_unrun)} "
        f"({wall:.1f} s wall, {cpu:.1f} s CPU)\nsummary: {out / 'summary.md'}  json: {out / 'gate.json'}  "
        f"upstream's logs: {out / 'head.log'}, {out / 'base.log'}"
    )
    return code
