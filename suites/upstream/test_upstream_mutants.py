"""Seeded bugs in upstream Miles, in the spirit of the mutant zoo
(``suites/properties/test_mutant_zoo.py``): each ``fixtures/upstream_mutants.py`` entry is a
small patch applied in memory to the upstream tree at test time
(``harness.upstream.patching``); with it in effect, the differential matrix's cases run on
upstream's code in order until one is caught by an invariant checker on the upstream
run or by the differential against the core (on cases that agree unmutated), and on that
case by at least one checker of the runner's own (an invariant or the hang watchdog), not only
the differential. Prints the table: mutant, what caught it, runs needed (cases run on the
mutant).

Without the mutant, the catching case is not caught (the bug, not the case, is what the
checks see), and the whole matrix passes unmutated (``test_upstream_diff.py``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from harness.upstream import patching, source
from harness.upstream.diff import case_named, matrix

try:
    from fixtures.upstream_mutants import UPSTREAM_MUTANTS
except ModuleNotFoundError:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.upstream_mutants import UPSTREAM_MUTANTS


def test_at_least_ten_mutants_in_every_area():
    assert len(UPSTREAM_MUTANTS) >= 10 and len({m.name for m in UPSTREAM_MUTANTS}) == len(UPSTREAM_MUTANTS)
    assert {m.area for m in UPSTREAM_MUTANTS} == {"buffer", "fully_async", "scheduler", "data_source", "driver"}
    for m in UPSTREAM_MUTANTS:
        assert m.doc and m.patches and m.expected, m.name


def _not_here(mutant) -> str | None:
    """Why ``mutant`` cannot be tried on the active tree: it patches a file behind a seam
    the tree lacks (that driver is refused here, ``harness.upstream.seams``)."""
    from harness.upstream.seams import DRIVERS

    runnable = [d for d in DRIVERS if not source.report().missing_for(d)]
    if not set(runnable) & mutant.observable_in:
        return (
            f"{mutant.name} shows only in {', '.join(sorted(mutant.observable_in))} runs, which "
            f"{source.active()} cannot run faithfully (missing seams: `miles-harness doctor`)"
        )
    behind = {p.path: source.refused_files()[p.path] for p in mutant.patches if p.path in source.refused_files()}
    if behind:
        return (
            f"{mutant.name} patches {', '.join(behind)}, behind seam(s) {', '.join(sorted(set(behind.values())))} "
            f"that {source.active()} lacks: the driver it would run under is refused on this tree"
        )
    return None


def _runnable_cases() -> list:
    return [c for c in matrix() if source.refused_reason(c.scenario().config) is None]


@pytest.mark.parametrize("mutant", UPSTREAM_MUTANTS, ids=lambda m: m.name)
def test_every_patch_applies_to_the_tree(miles_src, mutant):
    if _not_here(mutant):
        pytest.skip(_not_here(mutant))
    for p in mutant.patches:
        assert patching.patched_text(mutant, p, miles_src) != (miles_src / p.path).read_text()


def test_a_patch_that_no_longer_applies_fails_naming_the_mutant_and_the_file(tmp_path, miles_src):
    (tmp_path / "miles" / "rollout").mkdir(parents=True)
    (tmp_path / "miles" / "rollout" / "fully_async_data_buffer.py").write_text("class DefaultDataBuffer:\n    pass\n")
    m = next(m for m in UPSTREAM_MUTANTS if m.name == "buffer_lifo")
    with pytest.raises(patching.PatchDoesNotApply, match="'buffer_lifo'.*fully_async_data_buffer.py.*0 times"):
        patching.patched_text(m, m.patches[0], tmp_path)
    with pytest.raises(patching.PatchDoesNotApply, match="'buffer_lifo'.*fully_async_data_buffer.py.*0 times"):
        with patching.applied(m, tmp_path):
            pass
    twice = patching.UpstreamMutant(
        "twice",
        "scheduler",
        "x",
        (patching.Patch("miles/rollout/submission_scheduler.py", "    ", "  "),),
        frozenset({"differential"}),
    )
    with pytest.raises(patching.PatchDoesNotApply, match="'twice'.*occurs [0-9]+ times"):
        with patching.applied(twice):
            pass


def test_a_patch_that_changes_only_a_comment_is_refused(miles_src):
    m = next(m for m in UPSTREAM_MUTANTS if m.name == "buffer_lifo")
    if _not_here(m):
        pytest.skip(_not_here(m))
    comment = patching.UpstreamMutant(
        "comment_only",
        "buffer",
        "x",
        (patching.Patch(m.patches[0].path, "# filters at retrieving sample: staleness filter", "# a comment"),),
        frozenset(),
    )
    with pytest.raises(patching.PatchDoesNotApply, match="'comment_only'.*changes no code"):
        with patching.applied(comment):
            pass


def test_applying_a_mutant_changes_the_live_code_and_leaving_restores_it(miles_src):
    buffer_lifo = next(m for m in UPSTREAM_MUTANTS if m.name == "buffer_lifo")
    if _not_here(buffer_lifo):
        pytest.skip(_not_here(buffer_lifo))
    from miles.rollout.fully_async_data_buffer import DefaultDataBuffer
    from miles.rollout.fully_async_rollout import DefaultDataBuffer as imported_elsewhere

    from harness.upstream import host

    get = DefaultDataBuffer.get
    before = get.__code__
    m = next(m for m in UPSTREAM_MUTANTS if m.name == "buffer_lifo")
    with patching.applied(m):
        assert DefaultDataBuffer.get is get and get.__code__ is not before
        assert imported_elsewhere.get.__code__ is get.__code__  # every reference runs the patch
    assert get.__code__ is before
    drv = next(m for m in UPSTREAM_MUTANTS if m.area == "driver")
    with patching.applied(drv):
        assert "train_async.py" in host.DRIVER_SOURCES
    assert host.DRIVER_SOURCES == {}


def test_every_upstream_mutant_is_caught(miles_src, capsys):
    import logging

    rows, survivors, cache = [], [], {}
    start = time.perf_counter()
    quiet = [logging.getLogger(n) for n in ("miles", "asyncio")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.CRITICAL)
    try:
        mutants = [m for m in UPSTREAM_MUTANTS if not _not_here(m)]
        cases = _runnable_cases()
        catches = [patching.first_catch(m, cases, cache) for m in mutants]
    finally:
        for q, lv in zip(quiet, levels):
            q.setLevel(lv)
    skipped = [m.name for m in UPSTREAM_MUTANTS if _not_here(m)]
    for m, c in zip(mutants, catches):
        kinds = {k.split(":")[0] for k in c.caught_by}
        if c.case is None or not kinds & (set(m.expected) | {"hang"}):
            survivors.append(f"{m.name} (caught by {c.caught_by or 'nothing'}, expected {sorted(m.expected)})")
        elif kinds <= {"differential"} and len(cases) == len(matrix()):
            # the runner's own checks must see it on upstream's run too; on a tree that
            # refuses a driver the cases a checker catches it on may be among those not run
            survivors.append(f"{m.name} (caught only by the differential: {c.caught_by})")
        rows.append(
            (
                m.name,
                m.area,
                ", ".join(c.caught_by) or "NOT CAUGHT",
                c.case or "-",
                str(c.runs) if c.case else f">{c.runs}",
            )
        )
    header = ("mutant", "area", "caught by", "first catching case", "runs needed")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    table = "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in [header, *rows])
    killed = len(mutants) - len(survivors)
    with capsys.disabled():
        print(
            f"\n{table}\nupstream kill rate: {killed}/{len(mutants)} on {len(cases)} cases "
            f"({time.perf_counter() - start:.1f} s)"
            + (f"; not tried (the tree lacks their driver's seams): {', '.join(skipped)}" if skipped else "")
        )
    assert not survivors, f"surviving upstream mutants: {survivors}\n{table}"
    # the catching case is quiet without the mutant: the checks saw the bug, not the case
    for case_name in sorted({c.case for c in catches}):
        clean = patching.clean_catch(case_named(case_name), cache)
        assert clean == [], f"unmutated upstream is caught on {case_name}: {clean}"
