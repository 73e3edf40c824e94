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
true-age figure of the harness goes through it. ``on_train_batch`` computes, per group,
Miles' age (``group_oldest_weight_version``), the oldest token version (in the same pass as
the token count) and the policy lag; ``suites/harness/test_ages.py`` holds them to the two
definitions.
"""

from __future__ import annotations

from typing import Any

from miles_async_core.staleness import group_oldest_weight_version
from miles_async_core.types import samples_of


def group_token_version(group: Any) -> int | None:
    """The oldest weight version of any token of any sample of ``group`` (None: no tokens)."""
    oldest = None
    for s in samples_of(group):
        for r in s.token_versions.runs:  # VersionRuns.oldest of each sample, inlined
            if oldest is None or r[0] < oldest:
                oldest = r[0]
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
            # ``group_token_version(g)`` and the tokens in one pass over the group's samples
            recorded = group_oldest_weight_version(g)
            oldest = None
            for s in samples_of(g):
                for r in s.token_versions.runs:
                    if oldest is None or r[0] < oldest:
                        oldest = r[0]
                tokens += len(s.response_tokens)
            if recorded is not None:
                miles.append(version - recorded)
            if oldest is not None:
                token.append(version - oldest)
                lag.append(steps - version_steps.get(oldest, 0))
        return {"age_versions": miles, "token_age_versions": token, "lag_steps": lag, "tokens": tokens}


__all__ = ["AgeRecorder", "group_token_version"]
