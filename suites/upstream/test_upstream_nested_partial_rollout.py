"""Upstream finding: ``--partial-rollout`` with a generate function that returns a list of
samples per prompt sample (nested groups) fails at the first end-of-rollout abort that
finds a group still pending.

``abort`` (``miles/rollout/inference_rollout/inference_rollout_train.py:L40-L50``) waits
for every pending group task (L40) and, with ``--partial-rollout``, marks each sample of
the group with the rollout it started in: ``for sample in group`` (L45), ``if
sample.response and ...`` (L46). In a nested group each item is a trajectory, a
``list[Sample]`` (``base_types.py:L82-L86``; the rest of ``generate_rollout_async``
already reads ``group[0][0]`` when ``group[0]`` is a list, L151, L164), so L46 raises
``AttributeError: 'list' object has no attribute 'response'``: the rollout, and with it
the run, fails before its first training step.

The core mirrors upstream's ``abort`` here (``OneStepRollout._abort`` in
``miles_async_core/rollout.py``) and fails the same way, on its own attribute:
``AttributeError: 'list' object has no attribute 'response_tokens'``. It raises no clearer
error for the combination; this test pins both, so a fix on either side shows here.

Replay: ``.venv/bin/python -m pytest -q suites/upstream/test_upstream_nested_partial_rollout.py``
with ``MILES_SRC`` set (the case below is ``one-step-nested-over-sampling`` with
``partial_rollout`` on).
"""

from __future__ import annotations

import traceback

import pytest

from harness.upstream.diff import DiffCase, run_case

CASES = [
    DiffCase(
        name="one-step-nested-partial-rollout",
        config={"partial_rollout": True, "over_sampling_batch_size": 6},
        generate_function="multi_sample",
    ),
    DiffCase(
        name="sync-nested-partial-rollout",
        config={"driver": "train", "partial_rollout": True, "over_sampling_batch_size": 6},
        generate_function="multi_sample",
    ),
]


def _last_frame(error: BaseException) -> traceback.FrameSummary:
    return traceback.extract_tb(error.__traceback__)[-1]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_partial_rollout_abort_fails_on_nested_groups_upstream_and_in_the_core(miles_src, case):
    r = run_case(case)
    up, core = r.upstream_result.error, r.core_result.error
    assert isinstance(up, AttributeError) and str(up) == "'list' object has no attribute 'response'", up
    frame = _last_frame(up)
    assert frame.filename.endswith("miles/rollout/inference_rollout/inference_rollout_train.py")
    # the line, not its number: older trees have it a line earlier (one import fewer)
    assert (frame.name, frame.line) == ("abort", 'if sample.response and "start_rollout_id" not in sample.metadata:')
    # L45-L46 (pinned tree) run only for a group pending at the abort, so the error shows there was one
    assert r.upstream_result.history == []  # before the first training step
    assert isinstance(core, AttributeError) and str(core) == "'list' object has no attribute 'response_tokens'", core
    frame = _last_frame(core)
    assert frame.filename.endswith("miles_async_core/rollout.py") and frame.name == "_abort"
    assert r.core_result.history == []
