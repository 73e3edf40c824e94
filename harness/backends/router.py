"""Least-outstanding-requests routing over N rollout engines: Miles' own router policy.

Miles' router (``miles/router/router.py:L215-L229``, ``_use_url``) sends a request to the
live worker with the fewest requests submitted and not yet returned, ties to the first
registered, dead workers skipped. ``LeastOutstandingRouter`` is that policy, used by the
Ray layout's engine group (``harness.backends.ray_engine``) and by the advisor's
simulated engines (``harness.advise.predict``). It imports nothing but the core's errors,
so both can use it without importing each other or Ray.
"""

from __future__ import annotations

from miles_async_core.errors import EngineDeadError


class LeastOutstandingRouter:
    """The live engine with the fewest outstanding requests, ties to the lowest index.
    ``pick`` counts a request in (``outstanding`` and ``routed``), ``done`` counts it out."""

    def __init__(self, n: int) -> None:
        self.outstanding = [0] * n
        self.routed = [0] * n

    def pick(self, live: list[int] | None = None) -> int:
        """The engine for the next request. ``live``: the engines that may take it (None:
        all of them); raises ``EngineDeadError`` when that list is empty."""
        out = self.outstanding
        if live is None:
            i = out.index(min(out))  # first of the fewest: the lowest index on ties
        elif not live:
            raise EngineDeadError("every rollout engine has died; nothing to route to")
        else:
            i = min(live, key=lambda k: (out[k], k))
        out[i] += 1
        self.routed[i] += 1
        return i

    def done(self, i: int) -> None:
        """Engine ``i`` returned a request (finished, aborted or cancelled)."""
        self.outstanding[i] -= 1
        assert self.outstanding[i] >= 0, f"engine {i}: more requests returned than were routed to it"
