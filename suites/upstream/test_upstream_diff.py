"""Upstream Miles under the harness (issue 11): the differential matrix, the invariant
checkers on upstream's own runs, set order (D9), the stand-ins and the tree setting.

Every test needs an upstream Miles tree (``--miles-src``, ``$MILES_SRC``, or the pinned
tree beside the repository); without one the ``miles_src`` fixture skips it, saying why.
Cases that show a known divergence (``DiffCase.known``, ``harness.upstream.diff``) are strict
xfails: they fail loudly once the core and upstream agree. None is left (D1-D11 closed).
"""

from __future__ import annotations

import functools
import sys
import types

import pytest

from harness.upstream import source, stand_ins
from harness.upstream.diff import case_named, extension_cases, matrix, run_case

CASES = matrix()


def _param(case):
    marks = [pytest.mark.xfail(strict=True, reason=case.known)] if case.known else []
    return pytest.param(case, id=case.name, marks=marks)


@functools.cache
def _report(name: str):
    """A case's two runs, made once for the two tests below that read them."""
    return run_case(case_named(name))


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_core_matches_upstream(miles_src, case):
    report = _report(case.name)
    assert report.identical, report.format()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_invariants_hold_on_upstream_runs(miles_src, case):
    from harness.checking.invariants import check_all, format_violations

    up = _report(case.name).upstream_result
    assert up.events, "the host recorded no events"
    violations = check_all(up.events, case.scenario().config, complete=up.error is None)
    assert not violations, format_violations(violations)


def test_matrix_size_and_known_divergences():
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)
    assert not [c.name for c in CASES if c.known]  # D1-D11 closed: every case is identical


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
    report = run_case(case)
    assert not report.identical, report.format()


def test_set_order_changes_what_upstream_does(miles_src):
    """D9: upstream puts the finished groups of one ``asyncio.wait`` return in set order.
    Four groups aborted at once and recycled: the order they come back in follows the order
    the set is walked, so the host must pin it (by index, as the core) to compare."""
    case = case_named("fa-group-abort-storm-retry")
    pinned, reversed_ = run_case(case), run_case(case, set_order="reverse")
    assert pinned.identical, pinned.format()
    assert not reversed_.identical
    aspect, _ = reversed_.first
    assert aspect in ("recycles", "get_samples"), reversed_.format()
    recycled = [gi for _, gi in reversed_.upstream["recycles"]][:4]
    assert recycled == sorted(recycled, reverse=True)


def test_upstream_run_fails_like_upstream_on_a_trainer_error(miles_src):
    report = run_case(case_named("fa-group-trainer-fails"))
    assert type(report.upstream_result.error).__name__ == "TrainerStepError"
    assert report.identical, report.format()


def test_stand_in_only_when_the_real_import_fails(monkeypatch):
    monkeypatch.setattr(stand_ins, "APPLIED", {})
    monkeypatch.setattr(stand_ins, "STAND_INS", {
        "json": ("must not be used: json imports", {"loads": stand_ins._raising}),
        "miles_harness_no_such_pkg.sub": ("test: this module does not exist", {"f": stand_ins._raising}),
    })
    for name in ("miles_harness_no_such_pkg", "miles_harness_no_such_pkg.sub"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    applied = stand_ins.install()
    assert applied == {"miles_harness_no_such_pkg.sub": "test: this module does not exist"}
    import json

    assert not getattr(json, "__miles_harness_stand_in__", False)
    mod = sys.modules["miles_harness_no_such_pkg.sub"]
    assert isinstance(mod, types.ModuleType)
    with pytest.raises(stand_ins.StandInCalled, match="miles_harness_no_such_pkg.sub.f"):
        mod.f()
    for name in ("miles_harness_no_such_pkg", "miles_harness_no_such_pkg.sub"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_every_stand_in_names_its_reason():
    for name, (reason, attrs) in stand_ins.STAND_INS.items():
        assert name.startswith("sglang.") and len(reason) > 30 and attrs, name


def test_tree_setting_order(monkeypatch, tmp_path):
    monkeypatch.setenv(source.ENV, str(tmp_path / "env"))
    assert source.find_miles_src(str(tmp_path / "opt"))[0] == (tmp_path / "opt").resolve()
    assert source.find_miles_src(None)[0] == (tmp_path / "env").resolve()
    monkeypatch.delenv(source.ENV)
    monkeypatch.setattr(source, "DEFAULT_TREE", tmp_path / "absent")
    path, why = source.find_miles_src(None)
    assert path is None and "--miles-src" in why and source.ENV in why


def test_a_directory_that_is_not_miles_is_refused(tmp_path):
    with pytest.raises(source.UpstreamUnavailable, match="not a Miles checkout"):
        source.activate(tmp_path)
