"""Verifiable tasks: prompt sets made here (no hub) and reward functions.

A ``Task`` has ``name``, ``tokenizer`` (``encode(str) -> list[int]``, ``decode(list[int])
-> str``), ``eos_token_id``, ``max_new_tokens``, ``sample_prompts(rng, k) -> list[Sample]``
(each with ``prompt``, ``prompt_tokens`` and ``label``) and ``reward(sample) -> float``
in [0, 1]. Prompts depend only on the ``random.Random`` passed in, so a seeded run
draws the same prompts.

* ``copy``: prompt ``^abc=``, the response should start with the same symbols; reward =
  fraction of the prompt symbols reproduced position by position at the start of the
  response. Char-level vocabulary; the tiny model learns it from scratch in tens of
  GRPO steps.  ``chance_level`` = ``1 / n_symbols``: the expected reward of the best
  policy that ignores the prompt (each position's target is uniform over the symbols).
* ``arithmetic``: ``What is 3+4?`` (inside the chat template when the tokenizer has
  one, else ``... Answer:``); reward 1 when the last integer in the response equals
  the sum. Built for SmolLM2-Instruct (its GGUF tokenizer), usable with any tokenizer
  that has encode/decode. ``chance_level`` = ``1 / (max_operand + 1)``: the reward of
  the best constant answer, ``max_s P(a + b = s)``, reached at ``s = max_operand``.

Every task has ``chance_level``: the expected reward of the best policy that ignores the
prompt. A run learned the task only when its reward ends clearly above it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample


class CharTokenizer:
    """Character-level vocabulary: ids 0..2 are ``<pad>``, ``<bos>``, ``<eos>``."""

    SPECIALS = ("<pad>", "<bos>", "<eos>")

    def __init__(self, chars: str) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError(f"duplicate characters in the vocabulary {chars!r}")
        self.itos = list(self.SPECIALS) + list(chars)
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        unknown = sorted({c for c in text if c not in self.stoi})
        if unknown:
            raise ValueError(f"characters {unknown} are not in the vocabulary")
        return [self.stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids if i >= len(self.SPECIALS))


# One shared char vocabulary for the tiny model (30 ids), so every char task fits it.
TINY_CHARS = "abcdefghij0123456789+-=?^: "
TINY_TOKENIZER = CharTokenizer(TINY_CHARS)


class Task(Protocol):
    # read-only members, so a frozen dataclass (CopyTask, ArithmeticTask) is a Task
    @property
    def name(self) -> str: ...
    @property
    def tokenizer(self) -> Any: ...
    @property
    def eos_token_id(self) -> int | None: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def chance_level(self) -> float: ...

    def sample_prompts(self, rng: random.Random, k: int) -> list[Sample]: ...

    def reward(self, sample: Sample) -> float: ...


@dataclass(frozen=True, kw_only=True)
class CopyTask:
    n_symbols: int = 3
    length: int = 2
    tokenizer: Any = TINY_TOKENIZER
    name: str = "copy"

    def __post_init__(self) -> None:
        if not 1 <= self.n_symbols <= 8:
            raise ConfigError(f"copy task n_symbols={self.n_symbols}: allowed 1..8 (symbols a..h).")
        if self.length < 1:
            raise ConfigError(f"copy task length={self.length}: must be >= 1.")

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def max_new_tokens(self) -> int:
        return self.length + 1  # the symbols, then EOS

    @property
    def chance_level(self) -> float:
        """Best prompt-blind policy: any fixed symbol per position hits 1 in ``n_symbols``."""
        return 1.0 / self.n_symbols

    def sample_prompts(self, rng: random.Random, k: int) -> list[Sample]:
        symbols = "abcdefgh"[: self.n_symbols]
        out = []
        for _ in range(k):
            label = "".join(rng.choice(symbols) for _ in range(self.length))
            prompt = f"^{label}="
            out.append(Sample(prompt=prompt, prompt_tokens=self.tokenizer.encode(prompt), label=label))
        return out

    def reward(self, sample: Sample) -> float:
        target = self.tokenizer.encode(sample.label)
        hits = sum(1 for a, b in zip(sample.response_tokens, target) if a == b)
        return hits / len(target)


@dataclass(frozen=True, kw_only=True)
class ArithmeticTask:
    tokenizer: Any
    max_operand: int = 9
    max_new_tokens: int = 12
    chat: bool = True
    name: str = "arithmetic"

    @property
    def eos_token_id(self) -> int | None:
        return getattr(self.tokenizer, "eos_token_id", None)

    @property
    def chance_level(self) -> float:
        """Best constant answer: ``max_s P(a + b = s)`` for a, b uniform on 0..max_operand,
        which is ``(m + 1) / (m + 1)**2`` at ``s = m``."""
        return 1.0 / (self.max_operand + 1)

    def sample_prompts(self, rng: random.Random, k: int) -> list[Sample]:
        out = []
        for _ in range(k):
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            prompt, tokens = self._encode(f"What is {a}+{b}?")
            out.append(Sample(prompt=prompt, prompt_tokens=tokens, label=str(a + b)))
        return out

    def _encode(self, question: str) -> tuple[str, list[int]]:
        """Instruct models (SmolLM2-Instruct) answer only inside their chat template."""
        if self.chat and hasattr(self.tokenizer, "apply_chat_template"):
            messages = [{"role": "user", "content": f"{question} Answer with the number only."}]
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return text, list(self.tokenizer.encode(text, add_special_tokens=False))
        text = f"{question} Answer:"
        return text, list(self.tokenizer.encode(text))

    def reward(self, sample: Sample) -> float:
        """1 when the last integer of the response is the sum ("3 + 4 = 7", "It is 7.")."""
        numbers = re.findall(r"-?\d+", self.tokenizer.decode(sample.response_tokens))
        return 1.0 if numbers and numbers[-1] == sample.label else 0.0


def _arithmetic(**kwargs: Any) -> ArithmeticTask:
    if "tokenizer" not in kwargs:
        from .torch_models import load_smollm2_tokenizer

        kwargs["tokenizer"] = load_smollm2_tokenizer()
    return ArithmeticTask(**kwargs)


TASKS: dict[str, Callable[..., Task]] = {"copy": CopyTask, "arithmetic": _arithmetic}


def get_task(name: str, **kwargs: Any) -> Task:
    if name not in TASKS:
        raise ConfigError(
            f"--task={name!r} is not a known task; allowed: {sorted(TASKS)}. Fix: pass one of those names."
        )
    return TASKS[name](**kwargs)


def make_groups(
    task: Task,
    rng: random.Random,
    *,
    rollout_batch_size: int,
    n_samples_per_prompt: int,
    first_index: int = 0,
    first_group_index: int = 0,
) -> list[list[Sample]]:
    """B prompt groups of n fresh samples each; ``index`` counts up from ``first_index``."""
    groups, index = [], first_index
    for g, prompt in enumerate(task.sample_prompts(rng, rollout_batch_size)):
        group = []
        for _ in range(n_samples_per_prompt):
            group.append(
                Sample(
                    prompt=prompt.prompt,
                    prompt_tokens=list(prompt.prompt_tokens),
                    label=prompt.label,
                    index=index,
                    group_index=first_group_index + g,
                )
            )
            index += 1
        groups.append(group)
    return groups
