"""Tasks: seeded prompt sets, reward functions, the char tokenizer and task lookup."""

from __future__ import annotations

import random

import pytest

from harness.backends.tasks import (
    TINY_TOKENIZER,
    ArithmeticTask,
    CharTokenizer,
    CopyTask,
    get_task,
    make_groups,
)
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample


class ByteTokenizer:
    """A real (if trivial) tokenizer: UTF-8 bytes."""

    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i).decode(errors="replace")


def test_char_tokenizer_round_trips_and_rejects_unknown_characters():
    text = "^abc=12+3?"
    assert TINY_TOKENIZER.decode(TINY_TOKENIZER.encode(text)) == text
    assert TINY_TOKENIZER.decode([TINY_TOKENIZER.bos_token_id] + TINY_TOKENIZER.encode("ab")) == "ab"
    with pytest.raises(ValueError, match=r"\['Z'\]"):
        TINY_TOKENIZER.encode("aZ")
    with pytest.raises(ValueError, match="duplicate"):
        CharTokenizer("aa")


def test_copy_prompts_depend_only_on_the_rng_and_use_the_first_symbols():
    task = CopyTask(n_symbols=3, length=4)
    a, b = task.sample_prompts(random.Random(5), 6), task.sample_prompts(random.Random(5), 6)
    assert [s.prompt for s in a] == [s.prompt for s in b]
    for s in a:
        assert s.prompt == f"^{s.label}=" and len(s.label) == 4 and set(s.label) <= set("abc")
        assert s.prompt_tokens == TINY_TOKENIZER.encode(s.prompt)
    assert task.max_new_tokens == 5 and task.eos_token_id == TINY_TOKENIZER.eos_token_id


@pytest.mark.parametrize(("response", "reward"), [("abc", 1.0), ("abd", 2 / 3), ("dabc", 0.0), ("a", 1 / 3), ("", 0.0)])
def test_copy_reward_is_the_fraction_of_symbols_reproduced_position_by_position(response, reward):
    task = CopyTask(n_symbols=4, length=3)
    sample = Sample(label="abc", response_tokens=TINY_TOKENIZER.encode(response))
    assert task.reward(sample) == pytest.approx(reward)


def test_arithmetic_reward_checks_the_last_integer_of_the_response():
    task = ArithmeticTask(tokenizer=ByteTokenizer(), max_operand=9)
    prompts = task.sample_prompts(random.Random(1), 20)
    for s in prompts:
        a, b = map(int, s.prompt.removeprefix("What is ").removesuffix("? Answer:").split("+"))
        assert s.label == str(a + b) and 0 <= a <= 9 and 0 <= b <= 9
    s = prompts[0]
    scored = [
        Sample(label=s.label, response_tokens=task.tokenizer.encode(text))
        for text in (f" {s.label}.", f"1 + 2 = {s.label}", f" {s.label}0", " no idea", f"{s.label} or 1")
    ]
    assert [task.reward(x) for x in scored] == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_make_groups_gives_n_fresh_samples_per_prompt_with_running_indices():
    groups = make_groups(
        CopyTask(), random.Random(0), rollout_batch_size=3, n_samples_per_prompt=2, first_index=10, first_group_index=4
    )
    assert [[s.index for s in g] for g in groups] == [[10, 11], [12, 13], [14, 15]]
    assert [g[0].group_index for g in groups] == [4, 5, 6]
    assert all(g[0].prompt == g[1].prompt and g[0] is not g[1] for g in groups)


def test_an_unknown_task_name_raises_a_config_error_listing_the_allowed_names():
    with pytest.raises(ConfigError, match=r"--task='sort'.*\['arithmetic', 'copy'\]"):
        get_task("sort")
    assert get_task("copy", length=5).max_new_tokens == 6
    with pytest.raises(ConfigError, match="n_symbols=9"):
        CopyTask(n_symbols=9)


@pytest.mark.parametrize("n_symbols,length", [(1, 1), (3, 2), (4, 2), (2, 3)])
def test_copy_chance_level_is_the_best_prompt_blind_policys_expected_reward(n_symbols, length):
    """Enumerate every fixed response and every label: the best fixed response's mean
    reward over all labels is ``1 / n_symbols`` (and a random policy can only average it)."""
    import itertools

    task = CopyTask(n_symbols=n_symbols, length=length)
    symbols = "abcdefgh"[:n_symbols]
    labels = ["".join(p) for p in itertools.product(symbols, repeat=length)]

    def mean_reward(response: str) -> float:
        tokens = task.tokenizer.encode(response)
        return sum(task.reward(Sample(label=lab, response_tokens=tokens)) for lab in labels) / len(labels)

    best = max(mean_reward("".join(r)) for r in itertools.product(symbols, repeat=length))
    assert best == pytest.approx(task.chance_level) == pytest.approx(1 / n_symbols)


@pytest.mark.parametrize("max_operand", [0, 1, 4, 9])
def test_arithmetic_chance_level_is_the_best_constant_answers_reward(max_operand):
    task = ArithmeticTask(tokenizer=ByteTokenizer(), max_operand=max_operand)
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]

    def mean_reward(guess: int) -> float:
        tokens = ByteTokenizer().encode(str(guess))
        return sum(task.reward(Sample(label=str(a + b), response_tokens=tokens)) for a, b in pairs) / len(pairs)

    best = max(mean_reward(s) for s in range(2 * max_operand + 1))
    assert best == pytest.approx(task.chance_level) == pytest.approx(1 / (max_operand + 1))
