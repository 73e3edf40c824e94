"""The data source's fresh samples: what the keyword constructor would make."""

from __future__ import annotations

import dataclasses

from miles_async_core.data_source import RolloutDataSource, RolloutDataSourceWithBuffer
from miles_async_core.types import Sample


def test_fresh_samples_are_the_keyword_constructed_samples_with_their_own_lists():
    source = RolloutDataSourceWithBuffer(3, lambda k: (f"p{k}", [7, k], {"label": k}))
    source.get_samples(1)
    [group] = source.get_samples(1)
    tokens = group[0].prompt_tokens
    expected = [
        Sample(prompt="p1", prompt_tokens=tokens, label={"label": 1}, group_index=1, index=3 + i) for i in range(3)
    ]
    for got, want in zip(group, expected, strict=True):
        for f in dataclasses.fields(Sample):
            assert getattr(got, f.name) == getattr(want, f.name), f.name
    for f in dataclasses.fields(Sample):  # a field with a default factory: one object per sample
        if f.default_factory is not dataclasses.MISSING and f.name != "prompt_tokens":
            assert len({id(getattr(s, f.name)) for s in group}) == len(group), f"{f.name} shared between samples"


def test_the_prompt_token_list_is_shared_by_the_samples_of_a_group():
    [group] = RolloutDataSource(2, lambda k: ("p", [1, 2], None)).get_samples(1)
    assert group[0].prompt_tokens is group[1].prompt_tokens
