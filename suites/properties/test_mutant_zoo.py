"""The seeded-bug zoo (`fixtures/mutants`): every wrong implementation is caught by the
whole-run property suite, by an invariant it is expected to break; the real
implementation passes the same search. Buffer bugs must also fail the buffer
conformance machine (`harness/checking/buffer_machine.py`).

Prints a kill-rate table: mutant, kind, invariants broken by the first catching run,
and how many drawn runs that took. The search is ``hypothesis.find`` over the property
suite's own strategy (``run_cases(faults=True)``) with explicit, derandomized settings
and no shrinking, so the counts are reproducible and the zoo stays fast. Real-engine
mutants (kind ``real_engine``) are searched on small real runs of the main job instead
(``fixtures/mutants/real_engine.REAL_RUNS``, tried in order): "runs needed" counts those.
The unmutated real engine passes the same runs (``suites/backends/test_real_engine_checkers.py``).
Ray mutants (kind ``ray_engine``) are searched on small two-engine runs of the ray layout
(``fixtures/mutants/ray_engine.RAY_RUNS``); the unmutated group passes them in
``suites/backends/test_ray_layout.py``. They share the session's Ray cluster (``ray_cluster``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from miles_async_core.buffer import DefaultDataBuffer
from harness.checking.buffer_machine import check_buffer, default_settings
from harness.checking.invariants import ALL_CHECKS, Violation
from harness.checking.strategies import RunCase, run_case, run_cases, violations

try:
    from fixtures.mutants import KINDS, MUTANTS, Mutant
    from fixtures.mutants.ray_engine import RAY_RUNS, run_ray
    from fixtures.mutants.real_engine import REAL_RUNS, run_real
    from fixtures.mutants.resume import RESUME_RUNS, run_resume
except ModuleNotFoundError:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.mutants import KINDS, MUTANTS, Mutant
    from fixtures.mutants.ray_engine import RAY_RUNS, run_ray
    from fixtures.mutants.real_engine import REAL_RUNS, run_real
    from fixtures.mutants.resume import RESUME_RUNS, run_resume

SEARCH_EXAMPLES = 800  # per mutant; the slowest needs a few hundred
BASELINE_EXAMPLES = 300
MACHINE_EXAMPLES = 100


def search_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def first_real_catch(mutant: Mutant) -> tuple[int, tuple[str, str] | None, list[Violation]]:
    """A real-engine mutant: (real runs made, the first (mode, layout) caught, its violations)."""
    for runs, (mode, layout) in enumerate(REAL_RUNS, start=1):
        with mutant.apply():
            result, found = run_real(mode, layout)
        if {v.invariant for v in found} & mutant.expected_invariants:
            return runs, (mode, layout), found
    return len(REAL_RUNS), None, []


def first_ray_catch(mutant: Mutant) -> tuple[int, str | None, list[Violation]]:
    """A ray mutant: (two-engine runs made, the first mode caught, its violations)."""
    for runs, mode in enumerate(RAY_RUNS, start=1):
        with mutant.apply():
            result, found = run_ray(mode)
        if {v.invariant for v in found} & mutant.expected_invariants:
            return runs, mode, found
    return len(RAY_RUNS), None, []


def first_resume_catch(mutant: Mutant) -> tuple[int, str | None, list[Violation]]:
    """A resume mutant: (runs that stop and resume made, the first caught, its violations)."""
    for runs, (scenario, stops) in enumerate(RESUME_RUNS, start=1):
        with mutant.apply() as variant:
            _, found = run_resume(scenario, stops, **variant)
        if {v.invariant for v in found} & mutant.expected_invariants:
            return runs, scenario.name, found
    return len(RESUME_RUNS), None, []


def first_catch(mutant: Mutant | None, max_examples: int) -> tuple[int, RunCase | None, list[Violation]]:
    """(runs drawn, the first run caught, its violations); ``None`` if none is caught."""
    if mutant is not None and mutant.kind == "real_engine":
        return first_real_catch(mutant)  # type: ignore[return-value]
    if mutant is not None and mutant.kind == "ray_engine":
        return first_ray_catch(mutant)  # type: ignore[return-value]
    if mutant is not None and mutant.kind == "resume":
        return first_resume_catch(mutant)  # type: ignore[return-value]
    seen = {"runs": 0, "violations": []}
    wanted = mutant.expected_invariants if mutant else None

    def caught(case: RunCase) -> bool:
        seen["runs"] += 1
        if mutant is None:
            found = violations(run_case(case), case)
        else:
            with mutant.apply() as variant:
                found = violations(run_case(case, **variant), case)
        hit = bool(found) if wanted is None else bool({v.invariant for v in found} & wanted)
        if hit:
            seen["violations"] = found
        return hit

    try:
        case = find(run_cases(faults=True), caught, settings=search_settings(max_examples))
    except NoSuchExample:
        return seen["runs"], None, []
    return seen["runs"], case, seen["violations"]


def test_the_zoo_is_registered_with_known_kinds_and_invariants() -> None:
    assert len(MUTANTS) >= 15 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        assert m.kind in KINDS and m.doc, m.name
        assert m.expected_invariants <= set(ALL_CHECKS) | {"run_error"}, m.name


def test_the_real_implementation_passes_the_zoo_search() -> None:
    runs, case, found = first_catch(None, BASELINE_EXAMPLES)
    assert case is None, f"{case.describe()}\n\n" + "\n\n".join(v.format() for v in found[:3])
    assert runs == BASELINE_EXAMPLES
    assert check_buffer(DefaultDataBuffer, settings=_machine_settings()) is None


def test_the_real_resume_passes_the_resume_runs() -> None:
    """The exactly-once extension, unmutated, passes every run the resume mutants are caught on."""
    for scenario, stops in RESUME_RUNS:
        result, found = run_resume(scenario, stops)
        assert all(result.reached) and not found, (scenario.name, [v.format() for v in found[:3]])


def _machine_settings() -> settings:
    return settings(default_settings(MACHINE_EXAMPLES), derandomize=True, phases=[Phase.generate])


# the zoo in three parts: the simulated kinds in the fast tier, the real and the Ray engine
# mutants (real runs) in the slow tier; between them every checker but one is made to fail
SIMULATED = tuple(k for k in KINDS if k not in ("real_engine", "ray_engine"))
PARTS = [
    pytest.param(SIMULATED, id="simulated"),
    pytest.param(("real_engine",), id="real_engine", marks=pytest.mark.model),
    pytest.param(("ray_engine",), id="ray_engine", marks=pytest.mark.ray),
]


def expected_of(kinds: tuple[str, ...]) -> set[str]:
    return set().union(*(m.expected_invariants for m in MUTANTS if m.kind in kinds))


def must_fire(kinds: tuple[str, ...]) -> set[str]:
    """The checkers this part of the zoo must make fail: those only its mutants are meant to
    break, and, for the simulated part, every other one (``conservation_prefix`` aside)."""
    others = expected_of(tuple(k for k in KINDS if k not in kinds))
    if kinds == SIMULATED:
        return set(ALL_CHECKS) - {"conservation_prefix"} - (others - expected_of(kinds))
    return expected_of(kinds) - others


def test_the_parts_of_the_zoo_cover_every_kind_and_together_every_checker() -> None:
    kinds = [p.values[0] for p in PARTS]
    assert sorted(k for part in kinds for k in part) == sorted(KINDS)
    assert set().union(*(must_fire(part) for part in kinds)) == set(ALL_CHECKS) - {"conservation_prefix"}


@pytest.mark.parametrize("kinds", PARTS)
def test_every_seeded_bug_is_caught_by_an_expected_invariant(
    kinds: tuple[str, ...], capsys: pytest.CaptureFixture, request: pytest.FixtureRequest
) -> None:
    if "ray_engine" in kinds:
        request.getfixturevalue("ray_cluster")
    mutants = [m for m in MUTANTS if m.kind in kinds]
    rows, survivors, fired = [], [], set()
    start = time.perf_counter()
    for m in mutants:
        runs, case, found = first_catch(m, SEARCH_EXAMPLES)
        broken = sorted({v.invariant for v in found})
        fired.update(broken)
        machine = "-"
        if m.kind == "buffer":
            with m.apply() as variant:
                failure = check_buffer(variant.get("buffer_cls", DefaultDataBuffer), settings=_machine_settings())
            machine = failure.invariant if failure else "NOT CAUGHT"
            if failure is None:
                survivors.append(f"{m.name} (buffer conformance machine)")
        if case is None:
            survivors.append(m.name)
        rows.append((m.name, m.kind, ", ".join(broken) or "NOT CAUGHT", str(runs) if case else f">{runs}", machine))
    killed = len(mutants) - len({s.split(" ")[0] for s in survivors})
    header = ("mutant", "kind", "caught by (driver runs)", "runs needed", "buffer machine")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [header, *rows])
    with capsys.disabled():
        print(
            f"\n{table}\nkill rate: {killed}/{len(mutants)} = {killed / len(mutants):.0%} "
            f"({time.perf_counter() - start:.1f} s)"
        )
    assert not survivors, f"surviving mutants: {survivors}\n{table}"
    assert fired >= must_fire(kinds), f"checkers no seeded bug made fail: {sorted(must_fire(kinds) - fired)}"
