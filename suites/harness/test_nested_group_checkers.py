"""The invariant checkers on nested groups: a multi-sample generate
function (``harness.upstream.generate_fns.multi_sample``, 1-3 samples per trajectory) makes
each group ``n`` trajectories. The checkers count a group's trajectories at the top level and
read every sample a trajectory added (``trajectory_sample``) as a member of its group: a
nested-group run of the core passes them all, and each seeded bug of
``fixtures.nested_mutants`` fails the checker it names, so that reading has not made them
blind."""

from __future__ import annotations

import pytest

from fixtures.nested_mutants import NESTED_MUTANTS
from harness.checking.invariants import check_all, format_violations
from harness.sim.faults import NO_FAULTS, run_with_faults
from harness.upstream import generate_fns
from harness.upstream.diff import DiffCase


def _run(config: dict, faults, **kwargs):
    sc = DiffCase(name="nested", config=config, generate_function="multi_sample").scenario()

    def hooks(ctx) -> None:
        ctx.rollout_manager.rollout_fn.generate_function = generate_fns.multi_sample  # read now: may be patched

    out = run_with_faults(sc, faults or NO_FAULTS, hooks=hooks, **kwargs)
    return sc, out


def _nested(events) -> int:
    return sum(1 for e in events if e.kind == "trajectory_sample")


def _clean_runs() -> list:
    """Each (config, faults) a seeded bug runs on, once."""
    out = []
    for _, _, _, config, faults in NESTED_MUTANTS:
        if (config, faults) not in out:
            out.append((config, faults))
    return out


@pytest.mark.parametrize("config,faults", _clean_runs())
def test_a_nested_group_run_passes_every_checker(config, faults):
    sc, out = _run(config, faults)
    assert out.error is None, repr(out.error)
    assert _nested(out.events) > 10
    violations = check_all(out.events, sc.config)
    assert not violations, format_violations(violations)


@pytest.mark.parametrize("name,apply,expected,config,faults", NESTED_MUTANTS, ids=[m[0] for m in NESTED_MUTANTS])
def test_each_nested_group_bug_fails_its_checker(name, apply, expected, config, faults):
    with apply() as kwargs:
        sc, out = _run(config, faults, **kwargs)
    assert _nested(out.events) > 0
    fired = {v.invariant for v in check_all(out.events, sc.config, complete=out.error is None)}
    assert expected in fired, f"{name}: {expected} did not fire (fired: {sorted(fired)}, error {out.error!r})"
