"""One-step and sync ``--partial-rollout`` (``inference_rollout_train.py:L38-L53``): the groups pending at the end of
a rollout go back to the data source and a later rollout resumes them
(``inference_rollout_train.py:L40-L53``, ``inference_rollout_common.py:L225`` in
radixark/miles).

Properties: every drawn run (with or without faults) satisfies every trace invariant, the
conservation checker included (a handed-back group is ``recycled``, then taken again or
still in the data source at the run end); a resumed sample loses nothing it had: each of its
generate calls extends the tokens and ``weight_versions`` of the one before. A fixed run shows
the point of the flag: trained samples that carry tokens of two weight versions.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants import check_all, format_violations
from harness.checking.strategies import RunCase, property_settings, run_case, run_cases, violations
from harness.sim.engine import SimEngineConfig
from harness.sim.scenario import Scenario
from harness.sim.run_scenario import simulate
from harness.sim.trainer import SimTrainer, SimTrainerConfig


@st.composite
def partial_rollout_cases(draw: st.DrawFn) -> RunCase:
    case = draw(run_cases(faults=draw(st.booleans()), fully_async=False))
    config = dataclasses.replace(case.scenario.config, partial_rollout=True)
    return RunCase(dataclasses.replace(case.scenario, config=config), case.faults)


def _generate_calls(events: list) -> dict[int, list]:
    """Per sample index: (response_length, weight_versions) of each generate call's end."""
    calls: dict[int, list] = {}
    for e in events:
        if e.kind == ev.FINISHED:
            calls.setdefault(e["index"], []).append((e["response_length"], tuple(e["weight_versions"])))
    return calls


@property_settings(100)
@given(partial_rollout_cases())
def test_partial_rollout_runs_lose_no_group_and_no_token(case: RunCase) -> None:
    outcome = run_case(case)
    assert outcome.clean, f"{case.describe()}\nunexpected error {outcome.error!r}"
    found = violations(outcome, case)
    assert not found, f"{case.describe()}\n\n{format_violations(found)}"
    for index, calls in _generate_calls(outcome.events).items():
        for (before_len, before_wv), (after_len, after_wv) in zip(calls, calls[1:]):
            assert after_len >= before_len and after_wv[: len(before_wv)] == before_wv, (
                f"{case.describe()}\nsample {index} lost what it had when it resumed: {calls}"
            )


class _RecordingTrainer(SimTrainer):
    batches: list = []

    async def train(self, rollout_id, groups):
        type(self).batches.append((rollout_id, groups))
        return await super().train(rollout_id, groups)


def test_resumed_groups_are_trained_later_with_tokens_of_two_weight_versions() -> None:
    config = AsyncConfig(
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        over_sampling_batch_size=6,
        num_rollout=5,
        partial_rollout=True,
        seed=3,
    )
    scenario = Scenario(
        name="partial-rollout",
        config=config,
        engine=SimEngineConfig(seed=3),
        trainer=SimTrainerConfig(step_base_s=2.0),
        max_new_tokens=96,
    )
    _RecordingTrainer.batches = []
    result = simulate(scenario, trainer_factory=_RecordingTrainer)
    assert result.error is None
    assert not check_all(result.events, config, complete=True)
    resumed = [
        (rid, s)
        for rid, groups in _RecordingTrainer.batches
        for g in groups
        for s in g
        if "start_rollout_id" in s.metadata
    ]
    assert resumed, "no handed-back group was trained"
    assert all(s.metadata["start_rollout_id"] < rid for rid, s in resumed)
    mixed = [s for _, s in resumed if len(set(s.weight_versions)) > 1]
    assert mixed, "no resumed sample carries two weight versions"
    for s in mixed:
        assert len(s.response_tokens) == len(s.rollout_log_probs) == len(s.token_versions)
        assert len(set(s.token_versions.versions())) > 1
    recycled = {e["group_index"] for e in result.events if e.kind == ev.RECYCLED}
    retaken = {e["group_index"] for e in result.events if e.kind == ev.TAKEN and e["recycled"]}
    assert recycled and retaken <= recycled
