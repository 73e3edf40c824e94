"""The observables (``harness.upstream.observables``) the differential and the gate compare
runs by: one time-ordered list per aspect, and the first item where two runs part."""

from __future__ import annotations

from harness.upstream import diff
from harness.upstream.observables import ASPECTS, first_divergence, observables


def empty() -> dict[str, list]:
    return {a: [] for a in ASPECTS}


def test_a_run_with_no_events_has_every_aspect_and_its_end():
    obs = observables([], [], 4.5, None)
    assert set(obs) == set(ASPECTS)
    assert obs["end"] == [(4.5, (4.5, None))]
    assert observables([], [], 1.0, KeyError("x"))["end"] == [(1.0, (1.0, "KeyError"))]


def test_runs_that_did_the_same_do_not_diverge():
    a = {**empty(), "trained": [(1.0, (0, (0, 1)))]}
    assert first_divergence(a, {k: list(v) for k, v in a.items()}) is None


def test_the_first_divergence_is_the_earliest_differing_item_over_every_aspect():
    a = {**empty(), "trained": [(1.0, (0, (0, 1))), (3.0, (1, (2, 3)))], "updates": [(2.0, 1)]}
    b = {**empty(), "trained": [(1.0, (0, (0, 1))), (3.0, (1, (3, 2)))], "updates": [(2.0, 2)]}
    assert first_divergence(a, b) == ("updates", 0)


def test_ages_and_the_end_count_only_when_nothing_else_differs():
    a = {**empty(), "ages": [(0.0, (0, (1,), (1,)))], "trained": [(5.0, (0, (0,)))]}
    b = {**empty(), "ages": [(0.0, (0, (2,), (2,)))], "trained": [(5.0, (0, (1,)))]}
    assert first_divergence(a, b) == ("trained", 0)
    assert first_divergence({**a, "trained": []}, {**b, "trained": []}) == ("ages", 0)


def test_the_differential_compares_by_the_same_observables():
    assert diff.observables is observables and diff.ASPECTS is ASPECTS
