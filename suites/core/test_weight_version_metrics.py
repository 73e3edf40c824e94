"""``weight_version_metrics`` reads a batch in one pass; these tests hold it to the
definitions it inlines: ``Sample.oldest_weight_version`` (Miles' figures, as
`miles/ray/rollout/metrics.py:L107-L111` computes them) and ``VersionRuns.oldest``,
``.newest`` and ``.old_kv_token_count()`` (the harness' per-token figures)."""

from __future__ import annotations

import statistics

import hypothesis.strategies as st
from hypothesis import given

from miles_async_core.drivers.common import weight_version_metrics
from miles_async_core.types import Sample, VersionRuns, samples_of

_recorded = st.one_of(st.integers(0, 6).map(str), st.sampled_from(["x", ""]), st.integers(0, 6))
_runs = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(1, 5)), max_size=3)


@st.composite
def _samples(draw) -> Sample:
    runs = draw(_runs)
    return Sample(
        weight_versions=draw(st.lists(_recorded, max_size=3)),
        token_versions=VersionRuns([list(r) for r in runs]),
        response_tokens=[0] * (sum(r[2] for r in runs) + draw(st.integers(0, 2))),
    )


_groups = st.one_of(
    st.lists(_samples(), min_size=1, max_size=4),
    st.lists(st.one_of(_samples(), st.lists(_samples(), min_size=1, max_size=3)), min_size=1, max_size=3),
)


def _by_definition(groups: list) -> dict[str, float]:
    samples = [s for g in groups for s in samples_of(g)]
    m: dict[str, float] = {}
    oldest = [s.oldest_weight_version for s in samples if s.oldest_weight_version is not None]
    if oldest:
        m["rollout/weight_version/mean"] = sum(oldest) / len(oldest)
        m["rollout/weight_version/median"] = statistics.median(oldest)
        m["rollout/weight_version/max"] = float(max(oldest))
        m["rollout/weight_version/min"] = float(min(oldest))
        m["rollout/weight_version/mixed_version_ratio"] = sum(len(set(s.weight_versions)) > 1 for s in samples) / len(
            samples
        )
    runs = [s.token_versions for s in samples if s.token_versions.runs]
    if runs:
        m["rollout/token_version/min"] = float(min(r.oldest for r in runs))
        m["rollout/token_version/mixed_ratio"] = sum(r.oldest != r.newest for r in runs) / len(samples)
        m["rollout/token_version/old_kv_token_share"] = sum(r.old_kv_token_count() for r in runs) / max(
            1, sum(len(s.response_tokens) for s in samples)
        )
    return m


@given(st.lists(_groups, max_size=5))
def test_the_one_pass_gives_what_the_definitions_give(groups):
    assert weight_version_metrics(groups) == _by_definition(groups)
