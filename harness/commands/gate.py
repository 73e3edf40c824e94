"""`miles-harness gate`: did this pull request break async training? The same cases on the
pull request's Miles tree and on its base, each judged by the invariants on its own
trace, then compared case by case.

    miles-harness gate [--miles-src HEAD_TREE] --base BASE [--out DIR] [--strict] [-v]
                       [--scenario NAME ...] [--fault-seeds N] [--jobs N]

``--miles-src``: the pull request's tree (default: ``$MILES_SRC``, else the pinned tree).
``--base``: a second tree (a directory), or a git ref of the checkout ``--miles-src`` is
in (``origin/main``, a commit): that ref's files are exported with ``git archive`` to a
temporary tree, removed afterwards. The cases (``harness.upstream.gate_run``): the
differential's matrix and ``--fault-seeds`` drawn fault schedules, each run on both
trees, in one process per tree (``--jobs 2``: both at once). Each case gets a verdict
(``harness.upstream.gate``): unchanged, changed (every invariant holding), new violation,
violation fixed, harness error, or not run (missing seam).

Written to ``--out DIR`` (default: a new directory in the system's temp dir, printed):
``summary.md`` (a pull-request comment), ``gate.json`` (every case's verdict),
``head.log`` and ``base.log`` (upstream's log, per case; the terminal shows verdicts, and
a failing case's log, all of them with ``-v``).

Exit 0 when nothing new is violated; 1 on a new violation (with ``--strict`` also on a
behaviour change); 2 on a harness error (a new violation wins); 3 refused (a tree no
driver can run faithfully, ``miles-harness doctor``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from miles_async_core.errors import ConfigError

REFUSED = 3
DEFAULT_FAULT_SEEDS = 300
PROJECT_ROOT = Path(__file__).resolve().parents[2]


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
    p.add_argument("--jobs", type=int, default=2, choices=(1, 2), help="run the two trees at once (2) or in turn (1)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every case and its upstream log")


# --------------------------------------------------------------------------- the trees


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ConfigError(f"git {' '.join(args)} in {cwd}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def export_ref(checkout: Path, ref: str, dest: Path) -> str:
    """Write ``ref``'s version of ``checkout`` (a folder inside a git work tree) to ``dest``
    with ``git archive``; returns the commit."""
    probe = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        raise ConfigError(
            f"--base {ref}: not a directory, and --miles-src {checkout} is not in a git checkout, so "
            "it cannot be a git ref either. Allowed: a Miles tree, or a ref of the checkout --miles-src "
            "is in. Fix: pass the base tree's path, or point --miles-src at a git checkout"
        )
    top = Path(probe.stdout.strip())
    prefix = _git(checkout, "rev-parse", "--show-prefix")
    found = subprocess.run(
        ["git", "-C", str(top), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise ConfigError(
            f"--base {ref}: no such directory and no such git ref in {top}. Allowed: a Miles tree or "
            "a ref (branch, tag, commit) of that checkout. Fix: `git fetch` the base branch, or pass "
            "its tree's path"
        )
    commit = found.stdout.strip()
    spec = f"{commit}:{prefix.rstrip('/')}" if prefix else commit
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["git", "-C", str(top), "archive", "--format=tar", spec], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.wait() != 0:
        raise ConfigError(f"--base {ref}: git archive {spec} failed: {err.strip()}")
    return commit


def resolve_trees(miles_src: str | None, base: str, stack: ExitStack) -> tuple[Path, str, Path, str]:
    """(HEAD tree, how it was found, BASE tree, what it is); a git ref is exported into a
    temporary directory that ``stack`` removes."""
    from harness.upstream import source

    head, how = source.find_miles_src(miles_src)
    if head is None:
        raise ConfigError(how)
    if not (head / source.MARKER).is_file():
        raise ConfigError(
            f"--miles-src {head}: not a Miles checkout ({source.MARKER} is missing). Fix: point it at "
            "the root of a Miles checkout (the folder holding miles/ and train_async.py)"
        )
    if Path(base).is_dir():
        base_tree = Path(base).resolve()
        if not (base_tree / source.MARKER).is_file():
            raise ConfigError(
                f"--base {base}: not a Miles checkout ({source.MARKER} is missing). Allowed: a Miles "
                "tree or a git ref of the checkout --miles-src is in. Fix: point it at the base tree's root"
            )
        return head, how, base_tree, str(base_tree)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="miles-gate-base-")))
    commit = export_ref(head, base, tmp / "miles")
    if not (tmp / "miles" / source.MARKER).is_file():
        raise ConfigError(
            f"--base {base}: commit {commit[:12]} has no {source.MARKER} under the same folder as "
            "--miles-src. Fix: pass a ref whose tree is a Miles checkout"
        )
    return head, how, tmp / "miles", f"{base} ({commit[:12]})"


# --------------------------------------------------------------------------- running


def _worker(tree: Path, out: Path, log: Path, scenarios: list[str], seeds: int) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "harness.upstream.gate_run",
        "--tree",
        str(tree),
        "--out",
        str(out),
        "--log",
        str(log),
        "--fault-seeds",
        str(seeds),
    ]
    for s in scenarios:
        cmd += ["--scenario", s]
    return cmd


def run_trees(head: Path, base: Path, out: Path, scenarios: list[str], seeds: int, jobs: int) -> dict[str, dict]:
    """Both trees' case records (``gate_run``), one process per tree."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("MILES_SRC", None)
    procs: dict[str, subprocess.Popen] = {}
    errs: dict[str, Path] = {}
    docs: dict[str, dict] = {}
    for side, tree in (("head", head), ("base", base)):
        errs[side] = out / f"{side}.stderr"
        with errs[side].open("w") as err:
            procs[side] = subprocess.Popen(
                _worker(tree, out / f"{side}.cases.json", out / f"{side}.log", scenarios, seeds),
                cwd=str(PROJECT_ROOT),
                env=env,
                stdout=err,
                stderr=err,
            )
        if jobs == 1:
            procs[side].wait()
    for side, proc in procs.items():
        rc = proc.wait()
        path = out / f"{side}.cases.json"
        if rc not in (0, REFUSED) or not path.is_file():
            tail = errs[side].read_text()[-2000:]
            raise RuntimeError(f"the gate's {side} run (python -m harness.upstream.gate_run) exited {rc}: {tail}")
        docs[side] = json.loads(path.read_text())
    return docs


def _print_verdicts(verdicts: list, *, verbose: bool) -> None:
    """One line per case that is not unchanged (every case with ``verbose``); a harness
    error or a missing seam repeated over many cases once, with the cases it hit; HEAD's
    log under a failing case (once per message), every log with ``verbose``."""
    from harness.upstream.case_log import indent, tail

    grouped: dict[tuple[str, str], list] = {}
    for v in verdicts:
        if v.verdict in ("harness_error", "not_run") and not verbose:
            grouped.setdefault((v.verdict, v.message), []).append(v)
            continue
        if v.verdict != "unchanged" or verbose:
            print(v.line())
        if v.log.strip() and (verbose or v.verdict == "new_violation"):
            print(indent(v.log if verbose else tail(v.log)))
    for (kind, message), vs in grouped.items():
        names = [v.name for v in vs]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        print(
            f"{'HARNESS ERROR' if kind == 'harness_error' else 'NOT RUN'} in {len(names)} case(s) ({shown}): {message}"
        )
        if kind == "harness_error" and vs[0].log.strip():
            print(indent(tail(vs[0].log, 15)))


def _cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main(args: argparse.Namespace) -> int:
    from harness.upstream import gate
    from harness.upstream.diff import case_named

    for name in args.scenario:
        try:
            case_named(name)
        except KeyError as exc:
            raise ConfigError(exc.args[0]) from None
    seeds = args.fault_seeds if args.fault_seeds is not None else (0 if args.scenario else DEFAULT_FAULT_SEEDS)
    if seeds < 0:
        raise ConfigError(f"--fault-seeds {seeds}: must be >= 0. Fix: e.g. --fault-seeds {DEFAULT_FAULT_SEEDS}")
    t0, cpu0 = time.perf_counter(), _cpu_s()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="miles-gate-"))
    out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        head, how, base, base_name = resolve_trees(args.miles_src, args.base, stack)
        print(f"HEAD: {how}\nBASE: {base_name}")
        docs = run_trees(head, base, out, list(args.scenario), seeds, args.jobs)
    for side, flag in (("head", "--miles-src"), ("base", "--base")):
        if "refused" in docs[side]:
            print(f"REFUSED: {flag}: {docs[side]['refused']}\n(see `miles-harness doctor`)")
            (out / "summary.md").write_text(f"## Miles async gate: refused\n\n{flag}: {docs[side]['refused']}\n")
            return REFUSED
    verdicts = gate.classify_all(docs["head"]["cases"], docs["base"]["cases"])
    if verdicts and all(v.verdict == "not_run" for v in verdicts):
        print("REFUSED: HEAD can run none of the cases asked (missing seams; see `miles-harness doctor`)")
        return REFUSED
    code = gate.exit_code(verdicts, strict=args.strict)
    _print_verdicts(verdicts, verbose=args.verbose)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    head_name = str(args.miles_src or head)
    md = gate.summary_markdown(
        verdicts, head=head_name, base=args.base, code=code, wall_s=wall, cpu_s=cpu, strict=args.strict
    )
    doc = gate.summary_json(
        verdicts,
        head=head_name,
        base=args.base,
        code=code,
        wall_s=wall,
        cpu_s=cpu,
        strict=args.strict,
        trees={s: {k: docs[s].get(k) for k in ("tree", "wall_s", "cpu_s")} for s in docs},
    )
    (out / "summary.md").write_text(md)
    (out / "gate.json").write_text(json.dumps(doc, indent=1))
    for side in ("head", "base"):
        (out / f"{side}.cases.json").unlink(missing_ok=True)
        if (out / f"{side}.stderr").is_file() and not (out / f"{side}.stderr").read_text().strip():
            (out / f"{side}.stderr").unlink()
    print(
        f"\n{gate.counts_line(verdicts)}\n{gate.headline(verdicts, code, args.strict)} "
        f"({wall:.1f} s wall, {cpu:.1f} s CPU)\nsummary: {out / 'summary.md'}  json: {out / 'gate.json'}  "
        f"upstream's logs: {out / 'head.log'}, {out / 'base.log'}"
    )
    return code
