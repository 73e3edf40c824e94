"""harness.results.sim_ab: the simulator's speed at a base commit and at HEAD, side by side."""

from __future__ import annotations

import pytest

from harness.results.sim_ab import compare


@pytest.mark.worktree
def test_a_commit_against_itself_does_the_same_work_and_reports_every_run():
    report = compare("HEAD", pairs=2, steps=2)
    assert report["same_work"] is True
    assert len(report["samples_per_cpu_s"]["base"]) == len(report["samples_per_cpu_s"]["head"]) == 2
    assert len(report["pair_ratios"]) == 2 and report["ratio_head_over_base"] > 0


@pytest.mark.parametrize(
    "kw, message",
    [({"base": "no-such-commit"}, "--base 'no-such-commit'"), ({"base": "HEAD", "pairs": 0}, "--pairs 0")],
)
def test_bad_arguments_name_the_flag(kw, message):
    with pytest.raises(SystemExit, match=message):
        compare(**{"pairs": 1, "steps": 1, **kw})
