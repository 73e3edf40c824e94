"""Upstream Miles under the harness: the differential matrix, the invariant
checkers on upstream's own runs, set order (``done-set-order``), the import fakes and the tree setting.

Every test needs an upstream Miles tree (``--miles-src``, ``$MILES_SRC``, or the pinned
tree beside the repository); without one the ``miles_src`` fixture skips it, saying why.
Cases that show a known divergence (``DiffCase.known``, ``harness.upstream.diff``) are strict
xfails: they fail loudly once the core and upstream agree. None is left (every named divergence of ``docs/upstream.md`` is closed).
"""

from __future__ import annotations

import sys
import types

import pytest

from harness.upstream import leaf_fakes, source
from harness.upstream.diff import PAIRWISE_FLAGS, case_named, extension_cases, matrix, run_case

CASES = matrix()


def _param(case):
    marks = [pytest.mark.xfail(strict=True, reason=case.known)] if case.known else []
    return pytest.param(case, id=case.name, marks=marks)


def _runs_here(case) -> None:
    """Skip, naming the missing seams, a case whose driver the active tree cannot run
    faithfully (``harness.upstream.seams``; ``miles-harness doctor`` prints the table)."""
    reason = source.refused_reason(case.scenario().config)
    if reason:
        pytest.skip(reason)


_REPORTS: dict[str, object] = {}


def _report(case):
    """``run_case(case)``, once per process: the differential and the invariant tests
    read the same two runs (the matrix stays in the fast tier)."""
    if case.name not in _REPORTS:
        _REPORTS[case.name] = run_case(case)
    return _REPORTS[case.name]


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_core_matches_upstream(miles_src, case):
    _runs_here(case)
    report = _report(case)
    assert report.identical, report.format()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_invariants_hold_on_upstream_runs(miles_src, case):
    from harness.checking.invariants import check_all, format_violations

    _runs_here(case)
    up = _report(case).upstream_result
    assert up.events, "the runner recorded no events"
    violations = check_all(up.events, case.scenario().config, complete=up.error is None)
    assert not violations, format_violations(violations)


def test_matrix_names_are_unique_and_no_case_expects_a_divergence():
    assert len({c.name for c in CASES}) == len(CASES)
    assert not [c.name for c in CASES if c.known]  # every named divergence is closed: every case is identical


@pytest.mark.parametrize("driver", list(PAIRWISE_FLAGS))
def test_every_pair_of_flag_values_is_in_the_matrix_or_refused(driver):
    """Each driver runs every value of every flag it reads, with every value of every
    other such flag (pairwise), unless the miles profile refuses that pair outright."""
    from harness.upstream.diff import DRIVER_BASE, _valid
    from harness.upstream.seams import driver_of

    flags = PAIRWISE_FLAGS[driver]
    defaults = {n: vs[0] for n, vs in flags.items()}
    seen = []
    for c in CASES:
        if driver_of(c.scenario().config) != driver or c.generate_function or c.faults or c.trainer or c.engine:
            continue
        cfg = c.scenario().config
        seen.append({n: (c.dynamic_filter if n == "dynamic_filter" else getattr(cfg, n)) for n in flags})
    names = list(flags)
    missing = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for x in flags[a]:
                for y in flags[b]:
                    if any(r[a] == x and r[b] == y for r in seen):
                        continue
                    row = {**defaults, a: x, b: y}
                    if _valid(driver, row):  # a valid setting has the pair: it must be covered
                        missing.append((a, x, b, y))
    assert not missing, f"{driver}: flag pairs no matrix case runs: {missing[:10]}"
    assert DRIVER_BASE[driver] is not None


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in extension_cases()])
def test_each_harness_extension_parts_from_upstream_only_when_switched_on(miles_src, case):
    """A deliberate extension is off by default: its matrix case (the name before ``+``)
    has the same config less the extension's fields, and it is identical (above)."""
    from miles_async_core.config import HARNESS_EXTENSIONS

    base = case_named(case.name.split("+")[0])
    assert base.known is None
    on = {k: v for k, v in case.config.items() if base.config.get(k) != v}
    assert on and set(on) <= set(HARNESS_EXTENSIONS), on
    assert {**base.config, **on} == case.config
    _runs_here(case)
    report = run_case(case)
    assert not report.identical, report.format()


def test_set_order_changes_what_upstream_does(miles_src):
    """``done-set-order``: upstream puts the finished groups of one ``asyncio.wait`` return in set order.
    Four groups aborted at once and recycled: the order they come back in follows the order
    the set is walked, so the runner must pin it (by index, as the core) to compare."""
    case = case_named("fa-group-abort-storm-retry")
    _runs_here(case)
    pinned, reversed_ = run_case(case), run_case(case, set_order="reverse")
    assert pinned.identical, pinned.format()
    assert not reversed_.identical
    aspect, _ = reversed_.first
    assert aspect in ("recycles", "get_samples"), reversed_.format()
    recycled = [gi for _, gi in reversed_.upstream["recycles"]][:4]
    assert recycled == sorted(recycled, reverse=True)


def test_upstream_run_fails_like_upstream_on_a_trainer_error(miles_src):
    _runs_here(case_named("fa-group-trainer-fails"))
    report = run_case(case_named("fa-group-trainer-fails"))
    assert type(report.upstream_result.error).__name__ == "TrainerStepError"
    assert report.identical, report.format()


def test_an_import_fake_only_when_the_real_import_fails(monkeypatch):
    monkeypatch.setattr(leaf_fakes, "APPLIED", {})
    monkeypatch.setattr(
        leaf_fakes,
        "IMPORT_FAKES",
        {
            "json": ("must not be used: json imports", {"loads": leaf_fakes._raising}),
            "miles_harness_no_such_pkg.sub": ("test: this module does not exist", {"f": leaf_fakes._raising}),
        },
    )
    for name in ("miles_harness_no_such_pkg", "miles_harness_no_such_pkg.sub"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    applied = leaf_fakes.install()
    assert applied == {"miles_harness_no_such_pkg.sub": "test: this module does not exist"}
    import json

    assert not getattr(json, "__miles_harness_fake__", False)
    mod = sys.modules["miles_harness_no_such_pkg.sub"]
    assert isinstance(mod, types.ModuleType)
    with pytest.raises(leaf_fakes.LeafCalled, match="miles_harness_no_such_pkg.sub.f"):
        mod.f()
    for name in ("miles_harness_no_such_pkg", "miles_harness_no_such_pkg.sub"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_every_import_fake_names_its_reason():
    for name, (reason, attrs) in leaf_fakes.IMPORT_FAKES.items():
        assert name.startswith("sglang.") and len(reason) > 30 and attrs, name


def test_tree_setting_order(monkeypatch, tmp_path):
    (tmp_path / "opt").mkdir()
    (tmp_path / "env").mkdir()
    monkeypatch.setenv(source.ENV, str(tmp_path / "env"))
    assert source.find_miles_src(str(tmp_path / "opt"))[0] == (tmp_path / "opt").resolve()
    assert source.find_miles_src(None)[0] == (tmp_path / "env").resolve()
    monkeypatch.delenv(source.ENV)
    monkeypatch.setattr(source, "DEFAULT_TREE", tmp_path / "absent")
    path, why = source.find_miles_src(None)
    assert path is None and "--miles-src" in why and source.ENV in why


def test_a_tree_path_that_does_not_exist_says_so(tmp_path):
    path, why = source.find_miles_src(str(tmp_path / "gone"))
    assert path is None and f"{tmp_path / 'gone'} does not exist" in why and "not a Miles checkout" not in why


def test_a_directory_that_is_not_miles_is_refused(tmp_path):
    with pytest.raises(source.UpstreamUnavailable, match="not a Miles tree"):
        source.activate(tmp_path)
