"""Compare benchmark results: medians, ratios, and a significance test on block or run means.

Contract. ``compare_results(base, new)`` returns one row per benchmark present in both
documents with the base and new medians, ``ratio = new/base``, the relative change
``(new - base) / |base|``, a two-sided p-value and a mark:

* ``better`` / ``worse``: the Mann-Whitney U test rejects "same distribution" at
  ``alpha`` (p < alpha); the direction is the side the new samples moved to
  (U / (n_new * n_base) above or below 1/2) read through ``higher_is_better``;
* ``~``: not significant;
* ``?``: untested. Either side has fewer than 2 raw samples after the warm-up steps
  are dropped (a pytest-benchmark file saved without ``--benchmark-save-data`` has
  none), or the numbers of means cannot reach p < alpha at all (e.g. 3 vs 3: the
  smallest exact two-sided p is 0.1).

What is tested. The per-step samples of one run are not independent: consecutive steps
share caches, clocks and queue state (they are autocorrelated), and the first steps
include warm-up. A test on the raw per-step samples pseudo-replicates and overstates
significance. So the test is on independent-ish units instead:

* one run per side: the first ``warmup_steps`` samples (default 1) are dropped, the rest
  is split into ``blocks`` (default 5) contiguous blocks of (nearly) equal length, and
  the block means are compared (5 vs 5 means: the smallest exact p is 0.0079);
* several runs per side (history mode): each run contributes one run-level mean of its
  samples after the warm-up steps.

The medians shown (and the change the thresholds read) are the medians of the samples
after the warm-up steps (history: the median of the run means). Each row says, in a
note, what was compared, e.g. ``5 block means of 5-6 steps each per side, first 1 step
dropped as warm-up``.

The test (implemented here, no scipy): ranks of the pooled samples with mid-ranks for
ties. When the smaller side has fewer than 8 samples the p-value is exact: the
permutation distribution of the rank sum, conditional on the tie pattern, is counted by
dynamic programming over all C(n_base + n_new, n_small) splits. Otherwise the normal
approximation with tie-corrected variance and a 0.5 continuity correction is used.

Thresholds ``NAME:-P%`` fail when the metric got worse by more than P percent in its
bad direction (change < -P% for higher-is-better, > +P% for lower-is-better) AND the
row is marked ``worse``. For an untested row (``?``) the threshold alone decides, and
the row's note says so. A threshold on a benchmark missing from either side, and a
benchmark whose ``unit``, ``higher_is_better`` or ``definition`` differ, raise
``ConfigError`` (exit 2): numbers measured differently are never compared.

History (``history_base``): the base is built from earlier results files of the same
kind on the same machine (CPU model + GPU names): the last N by ``created_utc``, one
base value per run = that run's mean after its warm-up steps. Runs whose definition of
a benchmark differs from the new run's are left out of that benchmark's base (and
counted in the note). Miles' metric-history gate (``tests/ci/metric_history/gate.py``)
compares a value with the mean of up to 20 recent trusted values; here the base is the
runs' means, tested against the new run's block means, and the default N is the same 20.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

import numpy as np

from harness.results.schema import (
    SCHEMA,
    BenchmarkEntry,
    Results,
    load_any,
    looks_like_pytest_benchmark,
    read_json,
    summarize,
)
from miles_async_core.errors import ConfigError

EXACT_BELOW = 8  # exact permutation p-value when the smaller side has fewer samples
HISTORY_LIMIT = 20  # Miles gate.py history_limit
WARMUP_STEPS = 1  # leading per-step samples dropped as warm-up
BLOCKS = 5  # contiguous blocks per run whose means are compared


# --- statistics -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class UTest:
    p_value: float
    prob_new_greater: float  # U_new / (n_new * n_base); 0.5 = no shift, ties count 1/2
    method: str  # "exact" or "normal"
    min_p: float  # the smallest p-value these sample sizes and ties can produce


def _midranks(pooled: np.ndarray) -> np.ndarray:
    order = np.argsort(pooled, kind="mergesort")
    ranks = np.empty(len(pooled), dtype=np.float64)
    sorted_vals = pooled[order]
    i = 0
    while i < len(sorted_vals):
        j = i
        while j + 1 < len(sorted_vals) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def _exact_two_sided(doubled_ranks: np.ndarray, chosen: np.ndarray) -> tuple[float, float]:
    """(p, min_p) for the rank sum of ``chosen`` (a boolean mask) under all equally
    likely splits. Ranks are doubled so mid-ranks are integers."""
    k = int(chosen.sum())
    total = int(doubled_ranks.sum())
    # counts[j, s] = number of j-subsets of the items seen so far with doubled sum s
    counts = np.zeros((k + 1, total + 1), dtype=np.float64)
    counts[0, 0] = 1.0
    for v in doubled_ranks.astype(np.int64):
        for j in range(k, 0, -1):
            counts[j, v:] += counts[j - 1, : total + 1 - v]
    dist = counts[k]
    probs = dist / dist.sum()
    sums = np.arange(total + 1)
    centre2 = k * (len(doubled_ranks) + 1)  # doubled mean rank sum, an integer
    dev = np.abs(sums - centre2)  # |2R - 2E[R]| is an integer: compare exactly
    obs = abs(int(doubled_ranks[chosen].sum()) - centre2)
    support = dist > 0
    p = float(probs[(dev >= obs) & support].sum())
    min_p = float(probs[(dev >= dev[support].max()) & support].sum())
    return min(p, 1.0), min_p


def mann_whitney_u(base: list[float], new: list[float], *, method: str | None = None) -> UTest:
    """Two-sided Mann-Whitney U test of ``new`` against ``base`` (both need >= 1 sample).
    ``method`` ("exact" or "normal") overrides the size rule; tests use it."""
    x = np.asarray(new, dtype=np.float64)
    y = np.asarray(base, dtype=np.float64)
    n1, n2 = len(x), len(y)
    pooled = np.concatenate([x, y])
    ranks = _midranks(pooled)
    u_new = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2.0
    prob = u_new / (n1 * n2)
    if method is None:
        method = "exact" if min(n1, n2) < EXACT_BELOW else "normal"
    if method == "exact":
        chosen = np.zeros(n1 + n2, dtype=bool)
        if n1 <= n2:
            chosen[:n1] = True
        else:
            chosen[n1:] = True
        doubled = np.rint(ranks * 2).astype(np.int64)
        p, min_p = _exact_two_sided(doubled, chosen)
        return UTest(p_value=p, prob_new_greater=prob, method="exact", min_p=min_p)
    n = n1 + n2
    _, tie_counts = np.unique(pooled, return_counts=True)
    tie_term = float(((tie_counts**3) - tie_counts).sum()) / (n * (n - 1))
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:  # every sample identical: no evidence of any shift
        return UTest(p_value=1.0, prob_new_greater=prob, method="normal", min_p=0.0)
    z = max(abs(u_new - n1 * n2 / 2.0) - 0.5, 0.0) / math.sqrt(var)
    return UTest(p_value=min(1.0, math.erfc(z / math.sqrt(2.0))), prob_new_greater=prob, method="normal", min_p=0.0)


# --- units of comparison ----------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def check_settings(warmup_steps: int, blocks: int) -> None:
    if not (isinstance(warmup_steps, int) and warmup_steps >= 0):
        raise ConfigError(f"--warmup-steps {warmup_steps}: must be an integer >= 0 (0 keeps every step), e.g. 1.")
    if not (isinstance(blocks, int) and blocks >= 2):
        raise ConfigError(
            f"--blocks {blocks}: must be an integer >= 2 (the block means are the test's samples), e.g. 5."
        )


def after_warmup(samples: Sequence[float], warmup_steps: int) -> list[float]:
    """The samples after the first ``warmup_steps``. A benchmark with no more samples than
    that is not a per-step series (e.g. one run-level value) and is kept whole."""
    values = [float(x) for x in samples]
    return values[warmup_steps:] if len(values) > warmup_steps else values


def _warmup_text(warmup_steps: int, *, each: bool = False) -> str:
    if warmup_steps == 0:
        return "no warm-up step dropped"
    return f"first {_plural(warmup_steps, 'step')}{' of each run' if each else ''} dropped as warm-up"


def block_means(
    samples: Sequence[float], *, warmup_steps: int = WARMUP_STEPS, blocks: int = BLOCKS
) -> tuple[list[float], str]:
    """Means of up to ``blocks`` contiguous blocks of the samples after the warm-up steps,
    and what they are (``"5 block means of 6 steps each, first 1 step dropped as warm-up"``).
    Block lengths differ by at most one step (the earlier blocks are the longer ones)."""
    kept = after_warmup(samples, warmup_steps)
    if not kept:
        return [], "no samples"
    dropped = warmup_steps if len(kept) < len(samples) else 0
    parts = np.array_split(np.asarray(kept, dtype=np.float64), min(blocks, len(kept)))
    sizes = sorted({len(p) for p in parts})
    size = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    each = "step" if sizes == [1] else "steps each"
    what = f"{_plural(len(parts), 'block mean')} of {size} {each}, {_warmup_text(dropped)}"
    return [float(p.mean()) for p in parts], what


def run_mean(b: BenchmarkEntry, warmup_steps: int) -> float:
    """One run's level: the mean of its samples after the warm-up steps (all of them when
    nothing would be left; the stored median when the file has no raw samples)."""
    samples = _samples(b)
    if not samples:
        return float(b["stats"]["median"])
    return float(np.mean(after_warmup(samples, warmup_steps)))


# --- thresholds ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Threshold:
    name: str
    max_worse_pct: float  # tolerated worsening, percent, > 0
    text: str


def parse_threshold(text: str) -> Threshold:
    name, sep, value = text.rpartition(":")
    v = value.strip()
    if not sep or not name or not v.startswith("-") or not v.endswith("%"):
        raise ConfigError(
            f"--threshold {text!r}: expected NAME:-P% (e.g. tokens_per_s:-10%), the largest tolerated "
            "worsening in percent. Write the benchmark name, a colon, a minus sign and a percentage."
        )
    try:
        pct = float(v[1:-1])
    except ValueError:
        pct = float("nan")
    if not math.isfinite(pct) or pct <= 0:
        raise ConfigError(
            f"--threshold {text!r}: the percentage {v!r} must be a positive number after the minus sign, "
            "e.g. tokens_per_s:-10%."
        )
    return Threshold(name=name, max_worse_pct=pct, text=text)


# --- comparison ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Row:
    name: str
    unit: str
    higher_is_better: bool
    n_base: int
    n_new: int
    base_median: float
    new_median: float
    ratio: float | None  # None when the base median is 0
    change_pct: float | None
    test: UTest | None  # None when untested
    mark: str  # better | worse | ~ | ?
    compared: str  # what the test compared ("" when untested for want of samples), e.g.
    # "on each side: 5 block means of 6 steps each, first 1 step dropped as warm-up"
    threshold: Threshold | None
    threshold_failed: bool
    notes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Comparison:
    base_label: str
    new_label: str
    alpha: float
    rows: tuple[Row, ...]
    only_base: tuple[str, ...]
    only_new: tuple[str, ...]
    notes: tuple[str, ...] = ()
    warmup_steps: int = WARMUP_STEPS
    blocks: int = BLOCKS

    @property
    def failed(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.threshold_failed)


def _identity(b: BenchmarkEntry) -> dict[str, object]:
    flat: dict[str, object] = {"unit": b["unit"], "higher_is_better": b["higher_is_better"]}
    flat.update({f"definition.{k}": v for k, v in b["definition"].items()})
    return flat


def definition_diff(a: BenchmarkEntry, b: BenchmarkEntry) -> list[str]:
    """Keys (``unit``, ``higher_is_better``, ``definition.<key>``) whose values differ."""
    ia, ib = _identity(a), _identity(b)
    missing = object()
    return sorted(
        k
        for k in set(ia) | set(ib)
        if json.dumps(ia.get(k, missing), sort_keys=True, default=str)
        != json.dumps(ib.get(k, missing), sort_keys=True, default=str)
    )


def _samples(b: BenchmarkEntry) -> list[float]:
    return [] if b.get("samples_missing") else list(b["samples"])


HISTORY_UNITS: Final = "units_what"  # key of a history base benchmark: its samples are run means


def _units(b: BenchmarkEntry, warmup_steps: int, blocks: int) -> tuple[list[float], str, float]:
    """(the values the test compares, what they are, the median shown) for one side."""
    if HISTORY_UNITS in b:
        return list(b["samples"]), b[HISTORY_UNITS], float(b["stats"]["median"])
    samples = _samples(b)
    if not samples:
        return [], "no raw samples", float(b["stats"]["median"])
    values, what = block_means(samples, warmup_steps=warmup_steps, blocks=blocks)
    return values, what, float(np.median(after_warmup(samples, warmup_steps)))


def _compare_one(
    name: str,
    b: BenchmarkEntry,
    n: BenchmarkEntry,
    thr: Threshold | None,
    alpha: float,
    warmup_steps: int = WARMUP_STEPS,
    blocks: int = BLOCKS,
) -> Row:
    hib = b["higher_is_better"]
    sb, sn = _samples(b), _samples(n)
    ub, what_b, base_med = _units(b, warmup_steps, blocks)
    un, what_n, new_med = _units(n, warmup_steps, blocks)
    compared = ""
    notes: list[str] = []
    test = None
    if not sb or not sn:
        notes.append(f"no raw samples (base {len(sb)}, new {len(sn)}): untested, threshold alone")
    elif len(ub) < 2 or len(un) < 2:
        notes.append(f"fewer than 2 samples (base {len(ub)}, new {len(un)}): untested, threshold alone")
    else:
        compared = f"on each side: {what_b}" if what_b == what_n else f"base {what_b}; new {what_n}"
        test = mann_whitney_u(ub, un)
        if test.min_p >= alpha:
            notes.append(
                f"{len(ub)} vs {len(un)} means cannot reach p < {alpha:g} (smallest p {test.min_p:.3g}): "
                "untested, threshold alone"
            )
            test = None
    if test is None:
        mark = "?"
    elif test.p_value >= alpha:
        mark = "~"
    else:
        mark = "better" if (test.prob_new_greater > 0.5) == hib else "worse"
    ratio: float | None
    change_pct: float | None
    if base_med != 0:
        ratio, change_pct = new_med / base_med, 100.0 * (new_med - base_med) / abs(base_med)
    else:
        ratio, change_pct = None, (0.0 if new_med == 0 else None)
    failed = False
    if thr is not None:
        if change_pct is None:
            failed = True
            notes.append(f"threshold {thr.text}: base median is 0, a relative change is undefined: FAILED")
        else:
            worse_pct = -change_pct if hib else change_pct
            beyond = worse_pct > thr.max_worse_pct
            failed = beyond and (mark == "worse" or mark == "?")
            verdict = "FAILED" if failed else ("not significant, passed" if beyond else "passed")
            notes.append(f"threshold {thr.text}: {verdict}")
    return Row(
        name=name,
        unit=b["unit"],
        higher_is_better=hib,
        n_base=len(ub),
        n_new=len(un),
        base_median=base_med,
        new_median=new_med,
        ratio=ratio,
        change_pct=change_pct,
        test=test,
        mark=mark,
        compared=compared,
        threshold=thr,
        threshold_failed=failed,
        notes=tuple(notes),
    )


def compare_results(
    base: Results,
    new: Results,
    *,
    thresholds: Sequence[Threshold] = (),
    alpha: float = 0.05,
    base_label: str = "BASE",
    new_label: str = "NEW",
    notes: tuple[str, ...] = (),
    warmup_steps: int = WARMUP_STEPS,
    blocks: int = BLOCKS,
) -> Comparison:
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"--alpha {alpha}: must be between 0 and 1 (exclusive), e.g. 0.05.")
    check_settings(warmup_steps, blocks)
    by_name = {t.name: t for t in thresholds}
    for t in thresholds:
        where = [lbl for lbl, r in ((base_label, base), (new_label, new)) if t.name not in r.benchmarks]
        if where:
            known = sorted(set(base.benchmarks) & set(new.benchmarks))
            raise ConfigError(
                f"--threshold {t.text}: benchmark {t.name!r} is missing from {' and '.join(where)}. "
                f"Benchmarks present in both: {', '.join(known) or '(none)'}. Fix the name or drop the threshold."
            )
    common = [k for k in base.benchmarks if k in new.benchmarks]
    for name in common:
        diff = definition_diff(base.benchmarks[name], new.benchmarks[name])
        if diff:
            b_id, n_id = _identity(base.benchmarks[name]), _identity(new.benchmarks[name])
            detail = "; ".join(f"{k}: {b_id.get(k, '(absent)')!r} vs {n_id.get(k, '(absent)')!r}" for k in diff)
            raise ConfigError(
                f"benchmark {name!r} has a different definition in {base_label} and {new_label} "
                f"(differing keys: {detail}). Numbers measured differently are not comparable. "
                "Fix: compare runs measured the same way, or give the changed benchmark a new name."
            )
    rows = tuple(
        _compare_one(k, base.benchmarks[k], new.benchmarks[k], by_name.get(k), alpha, warmup_steps, blocks)
        for k in common
    )
    return Comparison(
        base_label=base_label,
        new_label=new_label,
        alpha=alpha,
        rows=rows,
        only_base=tuple(k for k in base.benchmarks if k not in new.benchmarks),
        only_new=tuple(k for k in new.benchmarks if k not in base.benchmarks),
        notes=notes,
        warmup_steps=warmup_steps,
        blocks=blocks,
    )


# --- history -------------------------------------------------------------------------------


def machine_key(res: Results) -> tuple[str, tuple[str, ...]]:
    return res.machine["cpu_model"], tuple(sorted(g["name"] for g in res.machine["gpus"]))


def _when(res: Results) -> datetime:
    return datetime.fromisoformat(res.created_utc.replace("Z", "+00:00"))


def load_history(directory: str | Path, new: Results) -> list[Results]:
    """Every results file under ``directory`` (recursively) of ``new``'s kind and machine,
    oldest first, ``new`` itself excluded. JSON files that are neither results files nor
    pytest-benchmark output (traces, configs) are ignored; damaged ones raise."""
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"--history {directory}: not a directory. Pass the folder holding earlier results files.")
    runs = []
    for path in sorted(root.rglob("*.json")):
        doc = read_json(path)
        if not isinstance(doc, dict) or (doc.get("schema") != SCHEMA and not looks_like_pytest_benchmark(doc)):
            continue
        res = load_any(path)
        if res.run_id != new.run_id and res.kind == new.kind and machine_key(res) == machine_key(new):
            runs.append(res)
    return sorted(runs, key=_when)


def history_base(
    runs: list[Results], new: Results, *, last: int, warmup_steps: int = WARMUP_STEPS
) -> tuple[Results, tuple[str, ...]]:
    """A synthetic base whose samples are the run-level means (after ``warmup_steps``) of
    the last ``last`` runs."""
    check_settings(warmup_steps, BLOCKS)
    if last < 1:
        raise ConfigError(f"--last {last}: must be at least 1 (the number of recent runs to compare against).")
    chosen = runs[-last:]
    doc = new.doc.copy()  # the new run's kind and machine; the base's own benchmarks
    doc["run_id"], doc["benchmarks"] = "history", {}
    base = Results(doc)
    notes = []
    for name, nb in new.benchmarks.items():
        means, skipped = [], 0
        for run in chosen:
            rb = run.benchmarks.get(name)
            if rb is None:
                continue
            if definition_diff(rb, nb):
                skipped += 1
                continue
            means.append(run_mean(rb, warmup_steps))
        if skipped:
            notes.append(f"{name}: left out {skipped} history run(s) with a different definition")
        if means:
            base.benchmarks[name] = {
                "unit": nb["unit"],
                "higher_is_better": nb["higher_is_better"],
                "definition": nb["definition"],
                "samples": means,
                "stats": {**summarize(means), "median": float(np.median(means))},
                HISTORY_UNITS: f"{_plural(len(means), 'run mean')}, {_warmup_text(warmup_steps, each=True)}",
            }
    return base, tuple(notes)


# --- formatting ----------------------------------------------------------------------------


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _cells(r: Row) -> list[str]:
    return [
        r.name,
        r.unit,
        _num(r.base_median),
        _num(r.new_median),
        "n/a" if r.ratio is None else f"{r.ratio:.3f}",
        "n/a" if r.change_pct is None else f"{r.change_pct:+.1f}%",
        "-" if r.test is None else f"{r.test.p_value:.3g}",
        r.mark,
    ]


HEADERS = ["benchmark", "unit", "base median", "new median", "ratio", "change", "p", "mark"]


def summary_line(c: Comparison) -> str:
    counts = {m: sum(r.mark == m for r in c.rows) for m in ("worse", "better", "~", "?")}
    parts = [f"{counts['worse']} worse", f"{counts['better']} better", f"{counts['~']} not significant"]
    if counts["?"]:
        parts.append(f"{counts['?']} untested")
    thr = [r for r in c.rows if r.threshold is not None]
    line = ", ".join(parts)
    if thr:
        failed = c.failed
        line += f"; thresholds: {len(failed)} of {len(thr)} failed"
        if failed:
            line += " (" + ", ".join(r.threshold.text for r in failed if r.threshold) + ")"
    return line


def test_description(c: Comparison) -> str:
    return (
        f"Mann-Whitney U, two-sided, alpha {c.alpha:g}, on block means ({c.blocks} contiguous blocks per run) "
        f"or run means, {_warmup_text(c.warmup_steps, each=True)}"
    )


def _compared_lines(c: Comparison) -> list[str]:
    """What each tested row compared, one line per distinct description."""
    groups: dict[str, list[str]] = {}
    for r in c.rows:
        if r.compared:
            groups.setdefault(r.compared, []).append(r.name)
    if len(groups) == 1:
        return [f"compared {next(iter(groups))}"]
    return [f"{', '.join(names)}: compared {what}" for what, names in groups.items()]


def _footnotes(c: Comparison) -> list[str]:
    lines = _compared_lines(c) + [f"{r.name}: {n}" for r in c.rows for n in r.notes]
    lines += list(c.notes)
    if c.only_base:
        lines.append("only in base: " + ", ".join(c.only_base))
    if c.only_new:
        lines.append("only in new: " + ", ".join(c.only_new))
    return lines


def format_table(c: Comparison) -> str:
    body = [HEADERS] + [_cells(r) for r in c.rows]
    widths = [max(len(row[i]) for row in body) for i in range(len(HEADERS))]
    right = {2, 3, 4, 5, 6}

    def line(row: list[str]) -> str:
        return "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()

    out = [f"{c.base_label} -> {c.new_label}  ({test_description(c)})"]
    out += [line(body[0]), line(["-" * w for w in widths])] + [line(r) for r in body[1:]]
    if not c.rows:
        out.append("(no benchmark in common)")
    out += ["  " + n for n in _footnotes(c)]
    out.append("summary: " + summary_line(c))
    return "\n".join(out)


def _md(cell: str) -> str:
    return cell.replace("|", "\\|")


def format_markdown(c: Comparison) -> str:
    out = [f"### `{_md(c.base_label)}` → `{_md(c.new_label)}`", ""]
    out.append("| " + " | ".join(HEADERS) + " |")
    out.append("|" + "|".join([":---", ":---", "---:", "---:", "---:", "---:", "---:", ":---:"]) + "|")
    for r in c.rows:
        cells = _cells(r)
        cells[0] = f"`{_md(cells[0])}`"
        cells[7] = f"**{cells[7]}**" if r.mark in ("worse", "better") else _md(cells[7])
        out.append("| " + " | ".join(_md(x) if i not in (0, 7) else x for i, x in enumerate(cells)) + " |")
    notes = _footnotes(c)
    if notes:
        out.append("")
        out += [f"- {_md(n)}" for n in notes]
    out += ["", f"**Summary:** {summary_line(c)}. Test: {test_description(c)}."]
    return "\n".join(out)
