"""One tree's half of ``miles-harness gate``: the gate's cases on one upstream Miles tree,
each judged on its own trace, written as JSON. Run in its own process (one Miles tree
per process: ``harness.upstream.source.activate``):

    python -m harness.upstream.gate_run --tree PATH --out CASES.json --log TREE.log \
        [--scenario NAME ...] [--fault-seeds N] [--cover FILE ...] [--flag-case JSON ...]

Cases: the differential's matrix (``harness.upstream.diff.matrix``, upstream side only)
and the fault sweep's drawn schedules ``fault-seed-0`` .. ``fault-seed-(N-1)``
(``harness.upstream.fault_sweep.case_from_seed``). Per case (``case_record``): ``status``
``ran`` / ``not_run`` (the tree lacks a seam the case's driver needs) / ``harness_error``
(the harness could not run it faithfully: a seam or leaf fake failed inside upstream's
code, or a member upstream calls is missing on a leaf fake); for a run, the invariant
verdict on its own trace (``harness.upstream.judge``), the fault sweep's other findings
(hangs, unexplained errors, orphaned tasks, silent drops: ``fault_sweep.findings``), and
what the run observably did (``harness.upstream.observables``: the same aspects the differential
compares), which the gate compares between the two trees. Upstream's log is captured per
case into the record and the log file. A run that ended with an error records it with
the innermost line of the tree it was raised at (``error_at``), and whether it started
(``started``: at least one generate call; a run that did not start is no prefix to judge).

``--flag-case JSON``: a matrix case with a flag set (``harness.upstream.flag_cases.specs``,
``set`` already resolved for this tree). ``--cover FILE`` (relative to the tree, repeatable): measure which lines of those files
run, per case (``harness.upstream.diff_coverage.Probe``), into the document's
``coverage``; the gate gives HEAD's process the files the pull request changes.

Before any case: a tree refused outright (no driver can run, ``SeamMissing`` at
activation, or a package it imports is not installed here) writes ``{"refused": why}``
and exits 3; a tree whose own code fails to import (the ``miles`` modules the runner
imports, or a driver the cases need: a NameError at import, say) writes
``{"broken": {"file", "line", "error"}}`` and exits 1, a finding about that tree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from harness.upstream.drivers import Driver
from harness.upstream.exit_codes import Exit
from harness.upstream.gate_record import CaseRecord, CaseRun

LOG_KEPT_LINES = 200  # the end of a case's log kept in the JSON; the log file has all of it


TIME_DIGITS = 6  # virtual seconds kept to the microsecond: float noise below that is no change


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, TIME_DIGITS)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj


def _jsonable(obj: Any) -> Any:
    """Observables as JSON (tuples become lists, floats kept to ``TIME_DIGITS``), so both
    trees' records compare equal exactly when the observables do."""
    return json.loads(json.dumps(_rounded(obj), default=repr))


def raised_at(exc: BaseException, tree: Path) -> tuple[str, int] | None:
    """The innermost line of ``tree`` in ``exc``'s traceback (a SyntaxError: its own file
    and line), relative to the tree; ``None`` when no frame is in the tree."""
    root = str(tree) + "/"
    if isinstance(exc, SyntaxError) and exc.filename and exc.filename.startswith(root):
        return exc.filename[len(root) :], exc.lineno or 0
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        if fr.filename.startswith(root):
            return fr.filename[len(root) :], fr.lineno or 0
    return None


def import_failure(exc: BaseException, tree: Path) -> dict | None:
    """``{"file", "line", "error"}`` when importing the tree failed in the tree's own code
    (a module of the tree missing, a NameError at import), ``None`` when the cause lies
    outside it (a package not installed here)."""
    from harness.upstream.judge import is_leaf_fake

    cause = exc.__cause__ or exc
    if isinstance(cause, ModuleNotFoundError) and not (cause.name or "").startswith("miles"):
        return None
    if isinstance(cause, ImportError) and is_leaf_fake(sys.modules.get(cause.name or "")):
        return None  # a name the harness' import fake lacks: the harness' gap, not the tree's
    at = raised_at(cause, tree)
    if at is None:
        return None
    return {"file": at[0], "line": at[1], "error": f"{type(cause).__name__}: {cause}"}


def _matrix_run(case: Any) -> CaseRun:
    from harness.upstream.diff import upstream_run

    sc = case.scenario()
    res = upstream_run(case, sc)
    return CaseRun(res, sc.config, res.wall_s, refusal=case.refused)


def _fault_run(seed: int) -> CaseRun:
    from harness.upstream import fault_sweep

    case = fault_sweep.case_from_seed(seed)
    out = fault_sweep.runner_run_with_faults(case, seed=seed)
    other = [
        {"kind": f"{f.category}:{f.detail}", "sweep_kind": f.kind, "message": f.message[:500]}
        for f in fault_sweep.findings(out)
        if f.category != "invariant"
    ]
    # ``out.wall_s`` is real time; the run's virtual end is its last event
    end = out.events[-1].t if out.events else 0.0
    return CaseRun(out, case.scenario.config, end, other, mode=fault_sweep.mode(case))


def case_record(name: str, run: Callable[[], CaseRun], tree: Path) -> CaseRecord:
    """Run one case with upstream's log captured, and return its record."""
    from harness.upstream.case_log import captured
    from harness.upstream.observables import observables
    from harness.upstream.harness_errors import HarnessError
    from harness.upstream.judge import check_leaves, judge
    from harness.upstream.seams import SeamMissing

    t0 = time.perf_counter()
    rec: CaseRecord = {"name": name}
    with captured() as out:
        try:
            ran = run()
            result = ran.result
            check_leaves(result, tree)
        except SeamMissing as exc:
            from harness.upstream.seams import BY_NAME

            files = {BY_NAME[s].file for s in exc.seams if s in BY_NAME}
            absent = sorted(f for f in files if not (tree / f).is_file())
            rec.update({"status": "not_run", "seams": list(exc.seams), "absent": absent, "message": str(exc)})
        except HarnessError as exc:
            rec.update({"status": "harness_error", "seams": list(exc.seams), "message": str(exc)})
        except Exception as exc:  # noqa: BLE001 - the harness' own machinery failed: never an upstream finding
            rec.update({"status": "harness_error", "seams": [], "message": f"harness_error: the runner raised {exc!r}"})
        else:
            verdict = judge(result, ran.config, complete=getattr(result, "complete", None))
            obs = observables(result.events, result.history, ran.end_s, result.error)
            if ran.mode:
                rec["mode"] = ran.mode
            if result.error is not None:
                at = raised_at(result.error, tree)
                rec["error_at"] = f"{at[0]}:L{at[1]}" if at else None
                rec["error_message"] = f"{type(result.error).__name__}: {result.error}"[:300]
            rec["started"] = bool(obs.get("generate"))
            if ran.refusal:
                rec["refusal"] = True
            rec.update(
                {
                    "status": "ran",
                    "error": type(result.error).__name__ if result.error is not None else None,
                    "judgement": verdict.to_json(),
                    "findings": ran.findings,
                    "observables": _jsonable(obs),
                }
            )
    rec["seconds"] = round(time.perf_counter() - t0, 4)
    text = out.getvalue()
    rows = text.splitlines()
    rec["log"] = "\n".join(rows[-LOG_KEPT_LINES:])
    rec["log_lines"] = len(rows)
    rec["_full_log"] = text
    return rec


def _flag_run(spec: dict) -> CaseRun:
    """A matrix case with a flag the pull request adds or changes set (when this tree has
    it: ``spec["set"]``), ``harness.upstream.flag_cases``."""
    from harness.upstream.diff import case_named
    from harness.upstream.flag_cases import flag_set

    case = case_named(spec["scenario"])
    if not spec["set"]:
        return _matrix_run(case)
    with flag_set(spec["dest"], spec["value"]):
        return _matrix_run(case)


@dataclass(frozen=True)
class ResumeRun:
    """A resume case's lives as one run for the judge: the joined trace, every life's
    history, the error that ended it."""

    events: list
    history: list
    error: BaseException | None
    complete: bool


# the resume sweep's settings the gate runs (one per driver) and its stops there: right after
# the first save, and between the two saves of a rollout (harness.lives.sweep)
RESUME_SETTINGS = ("sync", "one-step/retract", "fully-async/retract/retry")
RESUME_STOPS = ("after_save@1", "between_saves@5")
RESUME_PREFIX = "resume:"


def resume_cases() -> list[Any]:
    """The resume sweep's cases the gate runs on both trees, judged by the resume checkers."""
    from harness.lives.sweep import cases as sweep_cases

    return [c for c in sweep_cases(only=RESUME_SETTINGS) if c.label in RESUME_STOPS]


def _resume_run(case: Any) -> CaseRun:
    """A crash at ``case``'s stop and the resume through upstream's own save and load
    (``harness.upstream.lives``): the lives' joined trace is the case's run."""
    from harness.lives import run_lives
    from harness.upstream.lives import UpstreamHost

    res = run_lives(case.scenario, case.stops, UpstreamHost())
    history = [h for life in res.runs for h in getattr(life, "history", [])]
    end = res.events[-1].t if res.events else 0.0
    return CaseRun(ResumeRun(res.events, history, res.error, res.error is None), case.scenario.config, end)


def cases(
    scenarios: list[str],
    fault_seeds: int,
    flag_cases: list[dict] | None = None,
    resume: bool = False,
) -> list[tuple[str, Callable[[], CaseRun]]]:
    """(name, run) for every case asked: the named matrix cases (all when none is named
    and ``fault_seeds`` is not the only thing asked), the flag cases, then the fault seeds."""
    from harness.upstream.diff import case_named, matrix

    chosen = [case_named(n) for n in scenarios] if scenarios else matrix()
    out: list[tuple[str, Callable[[], CaseRun]]] = [(c.name, partial(_matrix_run, c)) for c in chosen]
    out += [(spec["name"], partial(_flag_run, spec)) for spec in flag_cases or []]
    out += [(f"fault-seed-{s}", partial(_fault_run, s)) for s in range(fault_seeds)]
    if resume:
        out += [(f"{RESUME_PREFIX}{c.setting}:{c.stops[0].label}", partial(_resume_run, c)) for c in resume_cases()]
    return out


def _load_drivers(names: list[str]) -> None:
    """Import each driver file the cases need, as a run would (``host.load_driver``)."""
    from harness.upstream.host import load_driver

    for name in names:
        load_driver(name, f"miles_harness_gate_import_check_{name[:-3]}")


def drivers_needed(scenarios: list[str], fault_seeds: int) -> list[str]:
    """The driver files (``train.py``, ``train_async.py``) the cases asked run."""
    from harness.upstream import fault_sweep
    from harness.upstream.diff import case_named, matrix

    configs = [c.scenario().config for c in ([case_named(n) for n in scenarios] if scenarios else matrix())]
    configs += [fault_sweep.case_from_seed(s).scenario.config for s in range(fault_seeds)]
    return sorted({Driver.of(c).file for c in configs})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.upstream.gate_run", description=__doc__.split("\n")[0])
    p.add_argument("--tree", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--scenario", action="append", default=[])
    p.add_argument("--fault-seeds", type=int, default=0)
    p.add_argument("--cover", action="append", default=[], metavar="FILE", help="a file of the tree to measure")
    p.add_argument("--flag-case", action="append", default=[], metavar="JSON", help="a flag case (flag_cases.specs)")
    p.add_argument("--resume-cases", action="store_true", help="also the resume cases (RESUME_SETTINGS x RESUME_STOPS)")
    a = p.parse_args(argv)
    from harness.upstream import source
    from harness.upstream.case_log import CaseLogFile, captured

    tree = Path(a.tree).resolve()
    log = CaseLogFile(Path(a.log))
    t0, cpu0 = time.perf_counter(), time.process_time()
    probe = None
    if a.cover:  # started before the tree is imported: module-level lines run then
        from harness.upstream.diff_coverage import Probe

        probe = Probe(tree, a.cover)
        probe.start()
    broken: dict | None = None
    error: BaseException | None = None
    with captured() as import_log:
        try:
            source.activate(tree)
            _load_drivers(drivers_needed(a.scenario, a.fault_seeds))
        except source.SeamMissing as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - the tree's own import failing is a finding, else a refusal
            broken = import_failure(exc, tree)
            error = exc
    log.add("(importing the tree)", import_log.getvalue())
    if probe is not None and (broken is not None or error is not None):
        probe.finish([])
    if broken is not None:
        Path(a.out).write_text(json.dumps({"tree": str(tree), "broken": broken}))
        return Exit.FINDING
    if error is not None:
        Path(a.out).write_text(
            json.dumps({"tree": str(tree), "refused": str(error), "seams": list(getattr(error, "seams", []))})
        )
        return Exit.REFUSED
    records = []
    flags = [json.loads(c) for c in a.flag_case]
    for name, run in cases(a.scenario, a.fault_seeds, flags, a.resume_cases):
        if probe is not None:
            probe.case(name)
        rec = case_record(name, run, tree)
        log.add(name, rec.pop("_full_log"), rec["status"])
        records.append(rec)
    doc = {
        "tree": str(tree),
        "wall_s": round(time.perf_counter() - t0, 3),
        "cpu_s": round(time.process_time() - cpu0, 3),
        "cases": records,
    }
    if probe is not None:
        doc["coverage"] = probe.finish([r["name"] for r in records])
    Path(a.out).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
