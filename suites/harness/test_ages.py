"""``AgeRecorder.on_train_batch`` computes a batch's ages in one pass over each group;
these tests hold it to the definitions it inlines: ``staleness.group_oldest_weight_version``
(Miles' recorded age), ``ages.group_token_version`` (the true age) and the token count."""

from __future__ import annotations

from types import SimpleNamespace

import hypothesis.strategies as st
from hypothesis import given

from harness.measure.ages import AgeRecorder, group_token_version
from miles_async_core.staleness import group_oldest_weight_version
from miles_async_core.types import Sample, VersionRuns, samples_of

_recorded = st.one_of(st.integers(0, 6).map(str), st.sampled_from(["x", "", "-1"]), st.integers(0, 6))
_runs = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(1, 5)), max_size=3)


@st.composite
def _samples(draw) -> Sample:
    runs = draw(_runs)
    return Sample(
        weight_versions=draw(st.lists(_recorded, max_size=3)),
        token_versions=VersionRuns([list(r) for r in runs]),
        response_tokens=[0] * sum(r[2] for r in runs),
    )


# a flat group, or a nested one (trajectories of samples, as a generate function returns)
_groups = st.one_of(
    st.lists(_samples(), min_size=1, max_size=4),
    st.lists(st.one_of(_samples(), st.lists(_samples(), min_size=1, max_size=3)), min_size=1, max_size=3),
)


@given(
    st.lists(_groups, max_size=4),
    st.integers(6, 9),
    st.integers(0, 20),
    st.dictionaries(st.integers(0, 6), st.integers(0, 20)),
)
def test_the_one_pass_gives_what_the_definitions_give(data, version, steps, version_steps):
    recorder = AgeRecorder()
    recorder.version_steps = dict(version_steps)
    out = recorder.on_train_batch(SimpleNamespace(weight_version=version, trainer_steps=steps), 0, data)
    recorded = [group_oldest_weight_version(g) for g in data]
    oldest = [group_token_version(g) for g in data]
    assert out == {
        "age_versions": [version - r for r in recorded if r is not None],
        "token_age_versions": [version - o for o in oldest if o is not None],
        "lag_steps": [steps - version_steps.get(o, 0) for o in oldest if o is not None],
        "tokens": sum(len(s.response_tokens) for g in data for s in samples_of(g)),
    }
