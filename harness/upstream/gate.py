"""The gate's verdicts: the same case on a pull request's tree (HEAD) and on its base
(BASE), each judged by the invariants on its own trace, then compared.

``classify(head, base)`` is a pure function of the two case records
(``harness.upstream.gate_record.CaseRecord``, written by ``gate_run.case_record``) and returns a
``CaseVerdict``:

* ``harness_error``: the harness could not run the case faithfully on HEAD, or it cannot
  host HEAD where it ran BASE (e.g. a member upstream now calls on a leaf fake of the
  harness): never a finding about upstream;
* ``not_run``: neither tree has a seam the case's driver needs (``miles-harness doctor``);
* ``no_base``: BASE could not run the case (a missing seam, a harness error, a run that
  ended before its first generate call): HEAD is judged on its own trace and the line
  says so, but nothing can be new or fixed, so it is never a finding;
* ``not_started``: HEAD's run ended with an error before its first generate call where
  BASE's started: a finding about the pull request, naming the error and its line (a run
  that did not start is no prefix to judge);
* ``neither_started``: both runs ended with an error before their first generate call
  (the same error or not): nothing of the case ran on either tree, so nothing was
  checked. Never a pass: the gate exits 4, "unchecked", where it would exit 0. A case
  that checks a start-up refusal (``refusal``: the matrix's ``DiffCase.refused``) is the
  exception: both trees refusing it is the behaviour it checks, unchanged (or changed
  when the refusals differ);
* ``new_violation``: HEAD breaks an invariant (or shows a fault-sweep finding: a hang, an
  unexplained error, an orphaned task, a silent drop; or, outside the drawn fault
  schedules, its run ends with an error where BASE's ran to its end, ``run_error:TYPE``)
  that BASE does not break in the same case. A bug both trees have is old, not new: a matrix case's invariants are
  compared case by case; in a drawn fault schedule (``fault-seed-N``) an invariant or a
  fault-sweep finding kind that BASE breaks under any drawn schedule of the same driver
  is old too, since a behaviour change moves a drawn schedule's faults and timing onto
  other groups and steps (``base_kinds``);
* ``fixed``: BASE breaks one that HEAD does not (in a drawn fault schedule: under no
  schedule of that driver), and HEAD adds none;
* ``unchanged``: both trees did observably the same (``harness.upstream.observables``, every aspect);
* ``changed``: the runs differ, and HEAD breaks nothing BASE does not (the sentence says
  whether every invariant holds or which old ones remain).

``exit_code(verdicts, strict, accept_unrun)`` (``harness.upstream.exit_codes.Exit``): 1
on a new violation or a run that did not start (and, with ``strict``, on a behaviour
change), else 2 on a harness error, else 3 when no case was compared (a case neither
tree started is not compared), else 4 when a case neither tree started (unless
``accept_unrun``), else 0. A finding about the pull request wins over a harness error in
another case.
``summary_markdown`` / ``summary_json`` are the pull-request comment and the JSON file.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.upstream.exit_codes import Exit
from harness.upstream.gate_record import CaseRecord

ARGUMENTS_FILE = "miles/utils/arguments.py"  # Miles' argument checks (miles_validate_args)
VERDICTS = (
    "new_violation",
    "not_started",
    "neither_started",
    "harness_error",
    "changed",
    "fixed",
    "no_base",
    "not_run",
    "unchanged",
)
FINDINGS = frozenset({"new_violation", "not_started"})  # about the pull request: exit 1
UNCHECKED = frozenset({"neither_started"})  # nothing of the case ran on either tree: exit 4, never 0
NOT_COMPARED = frozenset({"not_run", "no_base", "neither_started"})  # every case one of these: exit 3
LABELS = {
    "new_violation": "new violation",
    "not_started": "did not start",
    "neither_started": "neither started",
    "harness_error": "harness error",
    "changed": "changed",
    "fixed": "violation fixed",
    "no_base": "no base",
    "not_run": "not run",
    "unchanged": "unchanged",
}


# the pull-request comment's title per exit code
TITLES = {
    Exit.OK: "passed",
    Exit.FINDING: "FAILED",
    Exit.HARNESS_ERROR: "harness error",
    Exit.REFUSED: "nothing compared",
    Exit.UNCHECKED: "UNCHECKED",
}


@dataclass
class CaseVerdict:
    name: str
    verdict: str  # one of VERDICTS
    message: str
    new: list[str] = field(default_factory=list)  # checks HEAD breaks and BASE does not
    elsewhere: list[str] = field(default_factory=list)  # findings BASE shows in another case only
    fixed: list[str] = field(default_factory=list)  # checks BASE breaks and HEAD does not
    old: list[str] = field(default_factory=list)  # checks both break
    first_change: str | None = None  # the first aspect where the two runs differ
    aspects: list[str] = field(default_factory=list)  # every observable aspect in which the two runs differ
    details: list[str] = field(default_factory=list)  # HEAD's violation messages for the new ones
    log: str = ""  # HEAD's captured log (its end), for a failing case

    reproduce: str = ""  # the command that runs this case again on HEAD, showing the violation's slice

    def line(self) -> str:
        """The case on one line: verdict, and for a finding the first new invariant with
        its message and slice, then the command that reproduces it."""
        if self.verdict == "new_violation" and self.new:
            more = f" (+{len(self.new) - 1} more: {', '.join(self.new[1:])})" if len(self.new) > 1 else ""
            head = f"{self.name}: new violation: {self.new[0]}: {self.details[0] if self.details else ''}{more}"
        else:
            head = f"{self.name}: {LABELS[self.verdict]}: {self.message}"
        return head + (f"; reproduce: {self.reproduce}" if self.reproduce else "")


def broken(rec: CaseRecord) -> dict[str, str]:
    """What a ran case breaks: each violated invariant and each fault-sweep finding kind,
    with its first message (and the slice of the trace it is in)."""
    out: dict[str, str] = {}
    judgement = rec.get("judgement") or {}
    for v in judgement.get("violations", []):
        out.setdefault(v["invariant"], v["message"] + (f" [{v['slice']}]" if v.get("slice") else ""))
    for name in judgement.get("broken", []):
        out.setdefault(name, "")
    for f in rec.get("findings", []):
        out.setdefault(f["kind"], f.get("message", ""))
    return out


def _pair(a: Any, b: Any, limit: int = 160) -> tuple[str, str]:
    """Base's and head's item as text, each at most ``limit`` characters; a long pair is
    cut the same way on both sides, from the element where they first differ (a metric
    name is never cut so that base and head read the same)."""
    ta, tb = str(a), str(b)
    if len(ta) <= limit and len(tb) <= limit:
        return ta, tb
    k = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    start = max(ta.rfind("[", 0, k), ta.rfind("(", 0, k), 0)
    lead = "..." if start else ""

    def cut(text: str) -> str:
        part = text[start : start + limit]
        return lead + part + ("..." if start + limit < len(text) else "")

    return cut(ta), cut(tb)


def changed_aspects(head: CaseRecord, base: CaseRecord) -> list[str]:
    """Every observable aspect (``observables.ASPECTS``: generate calls, weight updates,
    trained batches, ages, weight versions, data-source takes, recycles, pauses, metrics,
    the end) in which HEAD's run differs from BASE's, in that order."""
    from harness.upstream.observables import ASPECTS

    a, b = base.get("observables") or {}, head.get("observables") or {}
    return [k for k in ASPECTS if a.get(k) != b.get(k)]


def aspect_counts(verdicts: list[CaseVerdict]) -> list[tuple[str, int]]:
    """How many cases differ in each aspect: what a change of behaviour reads as, a list
    rather than a diff of traces (the aspects' order)."""
    from harness.upstream.observables import ASPECTS

    counts = Counter(k for v in verdicts for k in v.aspects)
    return [(k, counts[k]) for k in ASPECTS if counts[k]]


def first_change(head: CaseRecord, base: CaseRecord) -> str | None:
    """The first item where the runs differ (the differential's order: by time over every
    aspect, ``observables.first_divergence``), said as ``aspect[item]: base ..., head ...``; when
    every item is the same but happens at another time, the first such item. ``None``
    when the runs did observably the same."""
    from harness.upstream.observables import ASPECTS, first_divergence

    a, b = base.get("observables") or {}, head.get("observables") or {}
    if a == b:
        return None

    def items(xs: list, ys: list, i: int) -> str:
        if i < len(xs) and i < len(ys):
            x, y = _pair(xs[i][1], ys[i][1])
            return f"base t={xs[i][0]:.3f} {x}, head t={ys[i][0]:.3f} {y}"

        def one(zs: list) -> str:
            return f"t={zs[i][0]:.3f} {_pair(zs[i][1], '')[0]}" if i < len(zs) else f"(none: {len(zs)} items)"

        return f"base {one(xs)}, head {one(ys)}"

    where = first_divergence(a, b) if set(a) == set(b) == set(ASPECTS) else None
    if where is not None:
        aspect, i = where
        return f"{aspect}[{i}]: {items(a[aspect], b[aspect], i)}"
    for aspect in sorted(set(a) | set(b)):
        xs, ys = a.get(aspect, []), b.get(aspect, [])
        for i in range(max(len(xs), len(ys))):
            if i >= len(xs) or i >= len(ys) or xs[i] != ys[i]:
                return f"{aspect}[{i}] at another time: {items(xs, ys, i)}"
    return "the observed aspects differ"


def _holds(rec: CaseRecord) -> str:
    j = rec.get("judgement") or {}
    n = len(j.get("checkers", {}))
    return f"every invariant holds ({n} checkers)" + ("" if j.get("complete", True) else ", checked as a prefix")


def _drawn_kinds(rec: CaseRecord) -> dict[str, str]:
    """What a drawn fault schedule's run breaks, each keyed with its driver: fault-sweep
    findings by their kind (``category:detail@mode``), invariants as
    ``invariant:NAME@mode``. Empty for a matrix case (no ``mode``)."""
    out = {f["kind"]: f["sweep_kind"] for f in rec.get("findings", []) if f.get("sweep_kind")}
    if rec.get("mode"):
        for name in (rec.get("judgement") or {}).get("broken", []):
            out[name] = f"invariant:{name}@{rec['mode']}"
    return out


def base_kinds(base: list[CaseRecord]) -> dict[str, str]:
    """Every kind BASE breaks under a drawn fault schedule (``_drawn_kinds``), with the
    first case that shows it."""
    out: dict[str, str] = {}
    for rec in base:
        for kind in _drawn_kinds(rec).values():
            out.setdefault(kind, rec["name"])
    return out


def _seam_text(rec: CaseRecord) -> str:
    """The seams a not-run record names, each said once: a seam whose file the tree does
    not have (``absent``: an older tree) as that file."""
    from harness.upstream.gate_preflight import describe
    from harness.upstream.seams import BY_NAME

    out: list[str] = []
    absent = set(rec.get("absent", []))
    for seam in rec.get("seams", []):
        if seam in BY_NAME and BY_NAME[seam].file in absent:
            text = f"{BY_NAME[seam].file} does not exist in this tree"
        else:
            text = describe(BY_NAME[seam]) if seam in BY_NAME else seam
        if text not in out:
            out.append(text)
    return "; ".join(out)


def _absent_only(rec: CaseRecord) -> bool:
    """Every seam a not-run record lacks is in a file the tree does not have: the driver is
    not in the tree (an older Miles), nothing the harness lacks."""
    from harness.upstream.seams import BY_NAME

    absent = set(rec.get("absent", []))
    return bool(absent) and all(s in BY_NAME and BY_NAME[s].file in absent for s in rec.get("seams", []))


def _not_started(rec: CaseRecord) -> bool:
    """The run ended with an error before its first generate call: nothing to judge."""
    return rec.get("error") is not None and not rec.get("started", True)


def _cut(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error(rec: CaseRecord) -> str:
    at = rec.get("error_at")
    return f"{rec.get('error_message') or rec.get('error')}" + (f" at {at}" if at else "")


def _new_error(head: CaseRecord, base: CaseRecord) -> dict[str, str]:
    """HEAD's run ended with an error where BASE's ran to its end (or ended with an error of
    another type: an injected fault's, which HEAD's error came before), in a case that is not a
    drawn fault schedule (there the fault sweep says which errors no injected fault
    explains, ``run_error``): ``run_error:TYPE`` with the error and its line. Judged as a
    prefix, such a run holds every invariant up to the error; without this the case would
    read "changed, every invariant holds" on a run that stopped early."""
    if head.get("mode") or head.get("error") is None or base.get("error") == head.get("error"):
        return {}
    other = f"BASE's ended with {_error(base)}" if base.get("error") else "BASE's ran to its end"
    return {f"run_error:{head['error']}": f"HEAD's run ended with {_error(head)}; {other}"}


def _alone(rec: CaseRecord) -> str:
    """HEAD judged on its own trace, for a case with nothing to compare with."""
    if _not_started(rec):
        return f"HEAD's run did not start either ({_error(rec)})"
    h = broken(rec)
    return f"HEAD breaks {', '.join(h)} on its own trace" if h else f"on HEAD {_holds(rec)}"


def classify(
    head: CaseRecord, base: CaseRecord, known: dict[str, str] | None = None, head_known: dict[str, str] | None = None
) -> CaseVerdict:
    """The verdict on one case from its HEAD and BASE records (pure). ``known`` /
    ``head_known``: what BASE / HEAD breaks under any drawn fault schedule, per driver
    (``base_kinds``): a bug a drawn case shows on one tree only, which the other tree shows
    under another schedule of that driver, is neither new nor fixed."""
    name = head.get("name", base.get("name", "?"))
    if head["status"] == "harness_error":
        return CaseVerdict(name, "harness_error", f"on HEAD: {head.get('message', '')}", log=head.get("log", ""))
    if head["status"] == "not_run" and _absent_only(head):
        files = ", ".join(head["absent"])
        other = "BASE ran it" if base["status"] == "ran" else "nor has BASE"
        return CaseVerdict(name, "not_run", f"HEAD has no {files}: this driver is not in the tree ({other})")
    if head["status"] == "not_run" and base["status"] == "ran":
        return CaseVerdict(
            name,
            "harness_error",
            f"the harness cannot host HEAD here, though it ran BASE: {_seam_text(head)} (the pull request "
            "goes unchecked in this case; `miles-harness doctor` names each member and the line reading it)",
        )
    if head["status"] == "not_run":
        return CaseVerdict(name, "not_run", f"neither tree can run it: {_seam_text(head)}")
    if base["status"] != "ran":
        why = _seam_text(base) if base["status"] == "not_run" else f"harness error: {base.get('message', '')}"
        return CaseVerdict(name, "no_base", f"BASE could not run it ({why}); {_alone(head)}")
    if _not_started(head) and name.startswith("flag") and str(head.get("error_at", "")).startswith(ARGUMENTS_FILE):
        # the gate set this flag alone; Miles' own argument checks want others with it
        return CaseVerdict(
            name, "not_run", f"HEAD's argument checks refuse the flag set alone: {_cut(_error(head), 240)}"
        )
    if _not_started(head) and not _not_started(base):
        return CaseVerdict(
            name,
            "not_started",
            f"HEAD's run ended before its first generate call: {_error(head)} (BASE's run started)",
            details=[_error(head)],
            log=head.get("log", ""),
        )
    if _not_started(base) and not _not_started(head):
        return CaseVerdict(
            name, "no_base", f"BASE's run ended before its first generate call ({_error(base)}); {_alone(head)}"
        )
    if _not_started(head) and head.get("refusal") and base.get("refusal"):
        # the case checks a start-up refusal (``DiffCase.refused``): the refusal is what ran
        if str(head.get("error_message")) == str(base.get("error_message")):
            return CaseVerdict(
                name, "unchanged", f"both trees refuse it at start-up, as the case expects: {_cut(_error(head))}"
            )
        return CaseVerdict(
            name,
            "changed",
            f"both trees refuse it at start-up, differently: HEAD {_cut(_error(head))}, BASE {_cut(_error(base))}",
        )
    if _not_started(head):
        # nothing of the case ran on either tree: the same error is no evidence that HEAD
        # works, only that both stop before any of the async code the case is for
        raised = {str(r.get("error_message") or r.get("error")) for r in (head, base)}
        if len(raised) == 1:  # the same error, wherever the line moved to
            where = f" (HEAD at {head.get('error_at')}, BASE at {base.get('error_at')})"
            said = f"both raise {_cut(raised.pop())}{where}"
        else:
            said = f"HEAD {_cut(_error(head))}, BASE {_cut(_error(base))}"
        return CaseVerdict(
            name,
            "neither_started",
            f"neither tree's run started, nothing was checked: {said}",
            details=[_error(head)],
            log=head.get("log", ""),
        )
    h, b = broken(head), broken(base)
    h.update(_new_error(head, base))
    sweep = _drawn_kinds(head)
    known = known or {}
    elsewhere = [k for k in h if k not in b and sweep.get(k) in known]
    new = [k for k in h if k not in b and k not in elsewhere]
    base_sweep, head_known = _drawn_kinds(base), head_known or {}
    still = [k for k in b if k not in h and base_sweep.get(k) in head_known]
    fixed = [k for k in b if k not in h and k not in still]
    old = [k for k in h if k in b]
    base_note = ""
    change = first_change(head, base)
    differ = changed_aspects(head, base)
    if new:
        return CaseVerdict(
            name,
            "new_violation",
            f"HEAD breaks {', '.join(new)}, BASE does not{base_note}",
            new=new,
            fixed=fixed,
            old=old,
            first_change=change,
            aspects=differ,
            details=[h[k] for k in new],
            log=head.get("log", ""),
        )
    if fixed:
        rest = f"; still breaks {', '.join(old)} (old)" if old else ""
        return CaseVerdict(
            name,
            "fixed",
            f"BASE breaks {', '.join(fixed)}, HEAD does not{rest}",
            fixed=fixed,
            old=old,
            first_change=change,
            aspects=differ,
        )
    holds = _holds(head) if not old else f"breaks only what BASE breaks too: {', '.join(old)} (old)"
    if elsewhere:
        holds = f"{holds}; shows " + ", ".join(f"{k} (old: BASE shows it in {known[sweep[k]]})" for k in elsewhere)
    if still:
        holds = f"{holds}; no longer shows " + ", ".join(
            f"{k} (not fixed: HEAD shows it in {head_known[base_sweep[k]]})" for k in still
        )
    if change is None:
        return CaseVerdict(name, "unchanged", holds, old=old, elsewhere=elsewhere)
    return CaseVerdict(
        name,
        "changed",
        f"{holds}{base_note}; first change {change}",
        old=old,
        first_change=change,
        aspects=differ,
        elsewhere=elsewhere,
    )


def reproduce(name: str, head: str) -> str:
    """The command that runs case ``name`` again on the tree ``head`` alone and prints its
    violations with their slices of the trace."""
    if name.startswith("fault-seed-"):
        return f"MILES_SRC={head} python -m harness.upstream.fault_sweep replay {name.rsplit('-', 1)[1]}"
    if name.startswith("resume:"):  # resume:SETTING:STOP@ROLLOUT, one stop of the sweep's setting
        setting = name.split(":")[1]
        return f"miles-harness resume-sweep --host upstream --miles-src {head} --setting {setting}"
    return f"miles-harness diff-upstream --miles-src {head} --scenario {name}"


def classify_all(head: list[CaseRecord], base: list[CaseRecord]) -> list[CaseVerdict]:
    """Every case HEAD ran, against BASE's record of the same name (a case BASE has no
    record of, e.g. from a different case list, is a harness error)."""
    by_name = {r["name"]: r for r in base}
    known, head_known = base_kinds(base), base_kinds(head)
    out = []
    for rec in head:
        other = by_name.get(rec["name"])
        if other is None:
            out.append(CaseVerdict(rec["name"], "harness_error", "BASE has no record of this case"))
        else:
            out.append(classify(rec, other, known, head_known))
    return out


def exit_code(verdicts: list[CaseVerdict], *, strict: bool = False, accept_unrun: bool = False) -> Exit:
    """1 on a finding (and, with ``strict``, a change), else 2 on a harness error, else 3
    when no case was compared (every case not run, without a base, or started by neither
    tree), else 4 when some case was started by neither tree (``accept_unrun``: 0), else 0."""
    kinds = {v.verdict for v in verdicts}
    if kinds & FINDINGS or (strict and "changed" in kinds):
        return Exit.FINDING
    if "harness_error" in kinds:
        return Exit.HARNESS_ERROR
    if not kinds - NOT_COMPARED:
        return Exit.REFUSED
    if kinds & UNCHECKED and not accept_unrun:
        return Exit.UNCHECKED
    return Exit.OK


def headline(verdicts: list[CaseVerdict], code: Exit, strict: bool = False, *, lines_unrun: bool = False) -> str:
    """The exit line: the code and what it means for this run (``lines_unrun``: changed
    lines of the async code never ran in any case, and that was not accepted)."""
    counts = Counter(v.verdict for v in verdicts)
    unchecked = [
        *([f"in {counts['neither_started']} case(s) neither tree's run started"] if counts["neither_started"] else []),
        *(["changed lines of the async code never ran in any case"] if lines_unrun else []),
    ]
    finding = (
        "a new invariant violation"
        if counts["new_violation"]
        else "HEAD's run did not start where BASE's did"
        if counts["not_started"]
        else "behaviour changed (--strict)"
    )
    what = {
        Exit.OK: "nothing new is violated",
        Exit.FINDING: finding,
        Exit.HARNESS_ERROR: "the harness could not run every case faithfully",
        Exit.REFUSED: "no case could be compared (each not run, or without a base)",
        Exit.UNCHECKED: f"nothing new is violated, but {' and '.join(unchecked) or 'part of the work never ran'} "
        "(unchecked)",
    }[Exit(code)]
    return f"exit {int(code)}: {what}"


def counts_line(verdicts: list[CaseVerdict]) -> str:
    c = Counter(v.verdict for v in verdicts)
    return f"{len(verdicts)} cases: " + ", ".join(f"{c[k]} {LABELS[k]}" for k in VERDICTS)


def _grouped(verdicts: list[CaseVerdict]) -> list[tuple[str, list[str]]]:
    """Cases with the same message, together (a harness error often repeats in every case
    of a driver)."""
    groups: dict[str, list[str]] = {}
    for v in verdicts:
        groups.setdefault(v.message, []).append(v.name)
    return list(groups.items())


def _names(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def summary_markdown(
    verdicts: list[CaseVerdict],
    *,
    head: str,
    base: str,
    code: Exit,
    wall_s: float,
    cpu_s: float,
    strict: bool = False,
    log_lines: int = 40,
    lead: list[str] | None = None,
    lines_unrun: bool = False,
) -> str:
    """The pull-request comment: the verdict, ``lead`` (the diff coverage), the counts,
    then every case that is not unchanged (grouped by message), with HEAD's log for a new
    violation."""
    c = Counter(v.verdict for v in verdicts)
    icon = TITLES[Exit(code)]
    out = [f"## Miles async gate: {icon}", ""]
    if lead:
        out += ["```", *lead, "```", ""]
    out += [
        (
            f"{headline(verdicts, code, strict, lines_unrun=lines_unrun)}. HEAD `{head}` against BASE `{base}`: {len(verdicts)} cases in "
            f"{wall_s:.0f} s wall, {cpu_s:.0f} s CPU. Each case runs on both trees and each run is judged by every "
            "applicable invariant checker on its own trace."
        ),
        "",
        "| verdict | cases |",
        "|---|---|",
    ]
    out += [f"| {LABELS[k]} | {c[k]} |" for k in VERDICTS]
    for kind, title in (
        ("new_violation", "New violations (HEAD breaks, BASE does not)"),
        ("not_started", "Runs that did not start on HEAD (they did on BASE)"),
        (
            "neither_started",
            "Runs that started on neither tree (nothing of these cases ran: unchecked, not a pass)",
        ),
        (
            "harness_error",
            ("Harness errors (the harness could not run these faithfully; not a finding about the pull request)"),
        ),
        ("fixed", "Violations fixed"),
        ("changed", "Behaviour changed, nothing new violated"),
        ("no_base", "No base (BASE could not run these: HEAD judged on its own trace only)"),
        ("not_run", "Not run (neither tree has a seam the driver needs: `miles-harness doctor`)"),
    ):
        chosen = [v for v in verdicts if v.verdict == kind]
        if not chosen:
            continue
        out += ["", f"### {title}", ""]
        if kind == "new_violation":
            for v in chosen:
                out.append(f"- `{v.name}`: {v.message}")
                out += [f"  - `{k}`: {d.splitlines()[0] if d else ''}" for k, d in zip(v.new, v.details)]
                if v.log.strip():
                    tail = "\n".join(v.log.splitlines()[-log_lines:])
                    out += [
                        "",
                        "<details><summary>upstream's log (end)</summary>",
                        "",
                        "```",
                        tail,
                        "```",
                        "",
                        "</details>",
                        "",
                    ]
        elif kind == "changed":
            out += [f"- `{v.name}`: {v.message}" for v in chosen[:60]]
            if len(chosen) > 60:
                out.append(f"- ... and {len(chosen) - 60} more (the JSON file lists every case)")
        else:
            out += [f"- {_names(names)}: {msg}" for msg, names in _grouped(chosen)]
    if c["unchanged"]:
        out += ["", f"{c['unchanged']} cases unchanged."]
    return "\n".join(out) + "\n"


def summary_json(
    verdicts: list[CaseVerdict],
    *,
    head: str,
    base: str,
    code: Exit,
    wall_s: float,
    cpu_s: float,
    strict: bool,
    trees: dict[str, Any],
) -> dict[str, Any]:
    return {
        "head": head,
        "base": base,
        "exit": int(code),
        "strict": strict,
        "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3),
        "counts": dict(Counter(v.verdict for v in verdicts)),
        "aspects": dict(aspect_counts(verdicts)),
        "trees": trees,
        "cases": [{k: val for k, val in asdict(v).items() if k != "log"} for v in verdicts],
    }


__all__ = [
    "FINDINGS",
    "LABELS",
    "NOT_COMPARED",
    "TITLES",
    "UNCHECKED",
    "VERDICTS",
    "CaseVerdict",
    "aspect_counts",
    "base_kinds",
    "broken",
    "changed_aspects",
    "classify",
    "classify_all",
    "counts_line",
    "exit_code",
    "first_change",
    "headline",
    "reproduce",
    "summary_json",
    "summary_markdown",
]
