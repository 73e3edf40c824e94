"""Pacing: hold the served engine to a GPU server's speed, so that a client's
timing-dependent tests (an abort mid-stream, a pause while requests run, a client that
goes away) see requests still running when they act, as against SGLang on a GPU.

``Pacing(decode_tokens_per_s=R, prefill_tokens_per_s=P)``: a decode step lasts at least
``1 / R`` seconds, so each running request gets at most ``R`` tokens a second whatever
the batch (a small model's decode step on a GPU takes about as long for one request as
for sixteen), and a step that prefills ``k`` prompt tokens lasts ``k / P`` seconds
longer. The engine thread waits out the rest of the step after computing it, with the
real clock, before it hands out the step's tokens; commands (abort, pause) wait for the
step to end, as SGLang's scheduler takes its input between batches. Steps are
scheduled from a deadline (``Pacer.due``), so a late wake-up is made up on the next
step and the achieved rate stays at the setting; a step that computes for longer than
its budget is not sped up (the CPU's rate is the ceiling). Unpaced (``Pacing()``) is
the default: the engine runs as fast as the CPU allows.

Which rate matches which GPU setting is in ``docs/serve.md``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from miles_async_core.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Pacing:
    decode_tokens_per_s: float | None = None
    prefill_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        for flag, value in (
            ("--pace-decode-tokens-per-s", self.decode_tokens_per_s),
            ("--pace-prefill-tokens-per-s", self.prefill_tokens_per_s),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(
                    f"{flag}={value}: allowed a positive number of tokens per second. Fix: pass "
                    "e.g. 300 (decode) or 20000 (prefill), or leave it out to run unpaced."
                )

    @property
    def enabled(self) -> bool:
        return self.decode_tokens_per_s is not None or self.prefill_tokens_per_s is not None

    def step_seconds(self, *, decoded: bool, prefill_tokens: int) -> float:
        """The least a step may last: one decode (if it decoded) plus its prefill."""
        seconds = 0.0
        if decoded and self.decode_tokens_per_s is not None:
            seconds += 1.0 / self.decode_tokens_per_s
        if prefill_tokens and self.prefill_tokens_per_s is not None:
            seconds += prefill_tokens / self.prefill_tokens_per_s
        return seconds


class Pacer:
    """Holds each step to ``Pacing``'s budget on the engine thread (``clock`` and
    ``sleep`` are the real ones in the server; tests pass a fake pair)."""

    def __init__(
        self,
        pacing: Pacing,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.pacing = pacing
        self._clock = clock
        self._sleep = sleep
        self.due = -math.inf  # when the last paced step may end
        self.held_s = 0.0  # seconds spent waiting, all steps together

    def now(self) -> float:
        return self._clock()

    def hold(self, started: float, *, decoded: bool, prefill_tokens: int) -> float:
        """Wait until the step that began at ``started`` has lasted its budget (counted
        from the previous step's deadline when the engine ran on without a break);
        returns the seconds waited."""
        budget = self.pacing.step_seconds(decoded=decoded, prefill_tokens=prefill_tokens)
        if budget <= 0:
            return 0.0
        # run on from the last deadline unless the engine stopped for a step's length or more
        # (idle, or a step that computed past its budget): then from this step's start
        base = self.due if started - self.due < budget else started
        self.due = base + budget
        wait = self.due - self._clock()
        if wait <= 0:
            return 0.0
        self._sleep(wait)
        self.held_s += wait
        return wait
