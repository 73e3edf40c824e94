"""The gate's two trees and their processes: the upstream side of ``miles-harness gate``.

``resolve_trees(miles_src, base, stack)``: the pull request's tree (HEAD) and its base
(BASE), both checked to be Miles trees; a base given as a git ref of HEAD's checkout is
exported with ``git archive`` (``export_ref``) into a temporary directory that ``stack``
removes. ``run_trees(...)``: one process per tree (``python -m harness.upstream.gate_run``,
``worker_command``) runs the cases and writes the tree's document; the command reads the
two documents and turns them into verdicts (``harness.upstream.gate``), so a case's data
travels one way: command, host, worker, record, verdict. A worker that crashes is
``WorkerFailed``, a harness error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness.upstream.exit_codes import Exit
from miles_async_core.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the workers import the harness from here


def export_ref(checkout: Path, ref: str, dest: Path) -> str:
    """Write ``ref``'s version of ``checkout`` (the root of a git work tree) to ``dest``
    with ``git archive``; returns the commit. ``ref`` is resolved in ``checkout``'s own
    repository only: a tree that is a folder of another repository (or of none) has no
    refs of its own, so a ref there would name another project's commit."""
    probe = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False
    )
    top = Path(probe.stdout.strip()).resolve() if probe.returncode == 0 else None
    if top != checkout.resolve():
        where = "is in no git checkout" if top is None else f"is not the root of a git checkout (it is inside {top})"
        raise ConfigError(
            f"--base {ref}: not a directory, and --miles-src {checkout} {where}, so {ref!r} cannot be "
            "resolved as a ref of the Miles checkout.\nAllowed: a Miles tree (a directory), or a ref of the "
            "git checkout whose root is --miles-src.\nFix: pass the base tree's path as --base, or point "
            "--miles-src at the root of a git checkout of Miles"
        )
    found = subprocess.run(
        ["git", "-C", str(top), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise ConfigError(
            f"--base {ref}: no such directory and no such git ref in {top}.\nAllowed: a Miles tree or a ref "
            "(branch, tag, commit) of that checkout.\nFix: `git fetch` the base branch, or pass its tree's path"
        )
    commit = found.stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["git", "-C", str(top), "archive", "--format=tar", commit], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.wait() != 0:
        raise ConfigError(f"--base {ref}: git archive {commit} failed: {err.strip()}")
    return commit


def resolve_trees(miles_src: str | None, base: str, stack: ExitStack) -> tuple[Path, str, Path, str]:
    """(HEAD tree, how it was found, BASE tree, what it is), both absolute; a git ref is
    exported into a temporary directory that ``stack`` removes."""
    from harness.upstream import source

    head, how = source.find_miles_src(miles_src)
    if head is None:
        raise ConfigError(how)
    why = source.not_miles("--miles-src", str(miles_src or head), head)
    if why:
        raise ConfigError(why)
    if Path(base).is_dir():
        base_tree = Path(base).resolve()
        why = source.not_miles("--base", base, base_tree)
        if why:
            raise ConfigError(why)
        return head, how, base_tree, str(base_tree)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="miles-gate-base-")))
    commit = export_ref(head, base, tmp / "miles")
    why = source.not_miles("--base", f"{base} (commit {commit[:12]})", tmp / "miles")
    if why:
        raise ConfigError(why)
    return head, how, tmp / "miles", f"{base} ({commit[:12]})"


# --------------------------------------------------------------------------- the trees' processes


def worker_command(
    tree: Path,
    out: Path,
    log: Path,
    scenarios: list[str],
    seeds: int,
    cover: list[str],
    flag_cases: list[dict],
    resume: bool = False,
) -> list[str]:
    """The command line of one tree's process (``harness.upstream.gate_run``)."""
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
        *(["--resume-cases"] if resume else []),
    ]
    for s in scenarios:
        cmd += ["--scenario", s]
    for f in cover:
        cmd += ["--cover", f]
    for spec in flag_cases:
        cmd += ["--flag-case", json.dumps(spec)]
    return cmd


class WorkerFailed(Exception):
    """A tree's process (``gate_run``) crashed: a harness error, never a finding."""


def run_trees(
    head: Path,
    base: Path,
    out: Path,
    scenarios: list[str],
    seeds: int,
    jobs: int,
    cover: list[str] | None = None,
    flag_cases: list[dict] | None = None,
    resume: bool = False,
) -> dict[str, dict]:
    """Both trees' documents (``gate_run``), one process per tree, each running upstream's
    own orchestration over the harness' leaves; HEAD's measures which
    lines of ``cover`` (its changed files) run in each case; ``flag_cases``
    (``flag_cases.specs``) run on both, each tree setting the flag where it has it. A tree
    that is refused or does not import stops the other tree's process at once: nothing is
    compared then."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("MILES_SRC", None)
    errs = {side: out / f"{side}.stderr" for side in ("head", "base")}
    pending = [("head", head), ("base", base)]
    procs: dict[str, subprocess.Popen] = {}
    docs: dict[str, dict] = {}

    def start(side: str, tree: Path) -> None:
        with errs[side].open("w") as err:
            procs[side] = subprocess.Popen(
                worker_command(
                    tree,
                    out / f"{side}.cases.json",
                    out / f"{side}.log",
                    scenarios,
                    seeds,
                    list(cover or []) if side == "head" else [],
                    [{**spec, "set": spec["set"][side]} for spec in flag_cases or []],
                    resume,
                ),
                cwd=str(PROJECT_ROOT),
                env=env,
                stdout=err,
                stderr=err,
            )

    while pending or procs:
        while pending and len(procs) < jobs:
            start(*pending.pop(0))
        for side, proc in list(procs.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del procs[side]
            path = out / f"{side}.cases.json"
            if rc not in (Exit.OK, Exit.FINDING, Exit.REFUSED) or not path.is_file():
                for other in procs.values():
                    other.kill()
                tail = errs[side].read_text()[-2000:]
                raise WorkerFailed(f"the gate's {side} run (python -m harness.upstream.gate_run) exited {rc}:\n{tail}")
            docs[side] = json.loads(path.read_text())
            if rc != Exit.OK:  # refused or broken: the other tree's cases would be compared with nothing
                for other in procs.values():
                    other.kill()
                    other.wait()
                return docs
        time.sleep(0.05)
    return docs


__all__ = ["PROJECT_ROOT", "WorkerFailed", "export_ref", "resolve_trees", "run_trees", "worker_command"]
