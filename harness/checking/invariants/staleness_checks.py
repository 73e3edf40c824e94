"""Staleness and sample age.

* ``got_staleness``: every ``got`` has staleness ``None`` or ``<= max_weight_staleness``,
  and the reported staleness is Miles' definition recomputed from the trace:
  ``current_version - min(oldest numeric weight version over the group's samples)``.
* ``trained_age_bound``: under fully-async ``train_async.py`` with ``s`` set, every
  trained group's Miles age (trainer version - oldest recorded version) is ``<= s + 1``.
* ``batch_single_version``: sync and one-step batches: every sample of batch ``M`` was
  made by exactly one weight version, ``version(gen(M))`` (``expected_batch_version``),
  token by token (so the true token-level age equals the recorded one). With
  ``--partial-rollout`` a group handed back at an earlier rollout's end carries older
  versions too (``inference_rollout_train.py:L38-L53``): then every recorded version is at
  most ``version(gen(M))``, non-decreasing, and every token was made by one of the
  recorded versions.
"""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import (
    Violation,
    invariant,
    is_fully_async,
    lifecycle,
    oldest_weight_version,
    violation,
    walk_groups,
)
from harness.trace import Event


def _oldest(gi: int, members: dict[int, list[int]], finished: dict[int, Event]) -> int | None:
    found = [oldest_weight_version(finished[i]) for i in members.get(gi, ()) if i in finished]
    vs = [v for v in found if v is not None]
    return min(vs) if vs else None


@invariant("got_staleness", applies=is_fully_async)
def check_got_staleness(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, s_max, out = "got_staleness", config.max_weight_staleness, []
    for pos, e, members, finished in walk_groups(events):
        if e.kind not in (ev.GOT, ev.STALE_REJECTED):
            continue
        gi, s = e["group_index"], e["staleness"]
        if e.kind == ev.GOT and s is not None and s_max is not None and s > s_max:
            out.append(
                violation(name, f"got group {gi} with staleness {s} > max_weight_staleness {s_max}", events, pos)
            )
        cur, oldest = e["current_version"], _oldest(gi, members, finished)
        expected = None if cur is None or oldest is None else cur - oldest
        if s != expected:
            out.append(
                violation(
                    name,
                    f"{e.kind} group {gi}: staleness reported {s}, but current_version={cur} - "
                    f"oldest weight version {oldest} = {expected}",
                    events,
                    pos,
                    context=lifecycle(events, gi, pos),
                )
            )
    return out


def _fully_async_bounded(c: AsyncConfig) -> bool:
    return c.fully_async and c.driver == "train_async" and c.max_weight_staleness is not None


@invariant("trained_age_bound", applies=_fully_async_bounded)
def check_trained_age_bound(events: list[Event], config: AsyncConfig) -> list[Violation]:
    assert config.max_weight_staleness is not None, "applies only with a bound (_fully_async_bounded)"
    name, bound, out = "trained_age_bound", config.max_weight_staleness + 1, []
    for pos, e, members, finished in walk_groups(events):
        if e.kind != ev.TRAINED:
            continue
        for gi in e["group_indices"]:
            oldest = _oldest(gi, members, finished)
            if oldest is not None and e["trainer_version"] - oldest > bound:
                out.append(
                    violation(
                        name,
                        f"rollout_id={e['rollout_id']} trained group {gi} at age "
                        f"{e['trainer_version'] - oldest} versions (trainer version "
                        f"{e['trainer_version']}, oldest {oldest}) > s+1 = {bound}",
                        events,
                        pos,
                        context=lifecycle(events, gi, pos),
                    )
                )
    return out


def expected_batch_version(config: AsyncConfig, rollout_id: int, first: int = 1) -> int:
    """``version(gen(M))``: sync ``M - S + 1``; one-step ``1 + #{N in [S, M-2] : (N+1) % k == 0}``
    (the updates done before generate(M) launched: one after each iteration N with
    ``(N+1) % k == 0``, ``train_async.py``). ``first``: the version the first update serves
    (1; a life resumed under ``exactly_once_resume``: its checkpoint's)."""
    s, k = config.start_rollout_id, config.update_weights_interval
    if config.driver == "train":
        return rollout_id - s + first
    return first + sum(1 for n in range(s, rollout_id - 1) if (n + 1) % k == 0)


@invariant("batch_single_version", applies=lambda c: not c.fully_async)
def check_batch_single_version(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "batch_single_version", []
    partial = bool(getattr(config, "partial_rollout", False))
    first = 1
    for pos, e, members, finished in walk_groups(events):
        if e.kind == ev.LIFE_START and config.exactly_once_resume and e["loaded_version"] is not None:
            first = e["loaded_version"]
        if e.kind != ev.TRAINED:
            continue
        want = expected_batch_version(config, e["rollout_id"], first)
        for gi in e["group_indices"]:
            for i in members.get(gi, ()):
                fin = finished.get(i)
                if fin is None:
                    out.append(violation(name, f"group {gi} trained but sample {i} never finished", events, pos))
                    continue
                tokens = {r[0] for r in fin["token_versions"]}
                if partial:
                    recorded = [int(v) if str(v).isdigit() else -1 for v in fin["weight_versions"]]
                    ok = (
                        recorded == sorted(recorded)
                        and all(0 <= v <= want for v in recorded)
                        and tokens <= set(recorded)
                    )
                else:
                    ok = list(fin["weight_versions"]) == [str(want)] and tokens <= {want}
                if not ok:
                    out.append(
                        violation(
                            name,
                            f"rollout_id={e['rollout_id']}: sample {i} of group {gi} has "
                            f"weight_versions={fin['weight_versions']} token versions {sorted(tokens)}, "
                            + ("expected versions up to " if partial else "expected only version ")
                            + f"{want}",
                            events,
                            pos,
                            context=lifecycle(events, gi, pos),
                        )
                    )
    return out
