"""Sample age at training time, measured outside the core.

``AgeRecorder`` is the ``StepObserver`` the harness injects into every run
(``miles_async_core.drivers.common``). For each trained group it records:

* ``age_versions``: Miles' age, trainer version minus the oldest *recorded* version
  (``Sample.weight_versions``, one entry per generate call, stamped at completion);
* ``token_age_versions``: the true age, trainer version minus the oldest version any
  *token* was generated with (``group_token_version``);
* ``lag_steps``: the policy lag in optimizer steps, trainer steps now minus the trainer
  steps behind the weights of that oldest token version.

``group_token_version`` is the one definition of a group's oldest token version; every
true-age figure of the harness goes through it. Miles' age is the core's
``group_staleness``, the same function the buffer's staleness check calls.
"""

from __future__ import annotations

from typing import Any

from miles_async_core.staleness import group_staleness
from miles_async_core.types import samples_of


def group_token_version(group: Any) -> int | None:
    """The oldest weight version of any token of any sample of ``group`` (None: no tokens)."""
    oldest = None
    for s in samples_of(group):
        v = s.token_versions.oldest
        if v is not None and (oldest is None or v < oldest):
            oldest = v
    return oldest


class AgeRecorder:
    """Maps each engine version to the trainer steps behind its weights and measures each batch."""

    def __init__(self) -> None:
        self.version_steps: dict[int, int] = {}  # engine version -> trainer steps of its weights

    def on_weights_updated(self, ctx: Any, version: int) -> None:
        self.version_steps[version] = ctx.trainer_steps

    def on_train_batch(self, ctx: Any, rollout_id: int, data: list) -> dict[str, Any]:
        version, steps, version_steps = ctx.weight_version, ctx.trainer_steps, self.version_steps
        miles, token, lag, tokens = [], [], [], 0
        for g in data:
            age = group_staleness(g, version)  # Miles' age: the staleness the buffer checks
            if age is not None:
                miles.append(age)
            oldest = group_token_version(g)
            if oldest is not None:
                token.append(version - oldest)
                lag.append(steps - version_steps.get(oldest, 0))
            tokens += sum(len(s.response_tokens) for s in samples_of(g))
        return {"age_versions": miles, "token_age_versions": token, "lag_steps": lag, "tokens": tokens}

__all__ = ["AgeRecorder", "group_token_version"]
