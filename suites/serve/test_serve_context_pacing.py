"""``--context-length`` (SGLang's length check and error) and pacing's step budget,
without a server: the check on numbers, the pacer on a fake clock (no real sleeps)."""

from __future__ import annotations

import pytest

from miles_async_core.errors import ConfigError

from harness.serve.pacing import Pacer, Pacing
from harness.serve.served_engine import check_context
from harness.serve.served_errors import ContextLengthError, ServeError
from harness.serve.server import check_context_length


def test_a_prompt_as_long_as_the_context_is_refused_with_sglangs_message():
    with pytest.raises(ContextLengthError) as info:
        check_context(4096, 1, 4096)
    assert info.value.status == 400 and isinstance(info.value, ServeError)
    assert info.value.message == "The input (4096 tokens) is longer than the model's context length (4096 tokens)."


def test_prompt_plus_max_new_tokens_must_stay_below_the_context():
    check_context(6, 4089, 4096)  # 4095 < 4096
    with pytest.raises(ContextLengthError) as info:
        check_context(6, 4090, 4096)
    assert info.value.message.startswith(
        "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of "
        "4096 tokens: 6 tokens from the input messages and 4090 tokens for the completion."
    )
    assert "--context-length" in info.value.message


@pytest.mark.parametrize("value, own, words", [(1, None, ">= 2"), (9000, 8192, "max_position_embeddings")])
def test_a_bad_context_length_names_the_flag(value, own, words):
    with pytest.raises(ConfigError, match=f"--context-length={value}.*{words}"):
        check_context_length(value, own, "smollm2")
    check_context_length(own or 2, own, "smollm2")


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_each_paced_step_lasts_its_budget_from_the_last_deadline():
    clock = FakeClock()
    pacer = Pacer(Pacing(decode_tokens_per_s=100, prefill_tokens_per_s=1000), clock=clock, sleep=clock.sleep)
    started = clock()
    clock.t += 0.002  # the step computed for 2 ms
    assert pacer.hold(started, decoded=True, prefill_tokens=50) == pytest.approx(0.058)  # 10 ms + 50 ms - 2 ms
    started = clock.t + 0.001  # 1 ms between steps: made up from the deadline
    clock.t = started + 0.003
    assert pacer.hold(started, decoded=True, prefill_tokens=0) == pytest.approx(0.006)
    assert clock.t == pytest.approx(100.070)  # two steps: 60 ms + 10 ms, exactly


def test_a_break_or_a_slow_step_restarts_the_schedule_without_a_burst():
    clock = FakeClock()
    pacer = Pacer(Pacing(decode_tokens_per_s=100), clock=clock, sleep=clock.sleep)
    pacer.hold(clock(), decoded=True, prefill_tokens=0)
    clock.t += 5.0  # idle
    started = clock()
    clock.t += 0.030  # a step that computed past its 10 ms budget: no wait, and no catch-up later
    assert pacer.hold(started, decoded=True, prefill_tokens=0) == 0.0
    started = clock()
    assert pacer.hold(started, decoded=True, prefill_tokens=0) == pytest.approx(0.010)


def test_unpaced_steps_never_wait_and_bad_rates_name_the_flag():
    clock = FakeClock()
    assert Pacer(Pacing(), clock=clock, sleep=clock.sleep).hold(clock(), decoded=True, prefill_tokens=9) == 0.0
    assert not Pacing().enabled and clock.sleeps == []
    assert (
        Pacer(Pacing(prefill_tokens_per_s=10), clock=clock, sleep=clock.sleep).hold(
            clock(), decoded=True, prefill_tokens=0
        )
        == 0.0
    )  # a decode step is free when only prefill is paced
    with pytest.raises(ConfigError, match="--pace-decode-tokens-per-s=0"):
        Pacing(decode_tokens_per_s=0)
    with pytest.raises(ConfigError, match="--pace-prefill-tokens-per-s=nan"):
        Pacing(prefill_tokens_per_s=float("nan"))
