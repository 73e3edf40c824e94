"""Conservation of prompt groups.

Every group the data source hands out (``taken``) ends exactly once per time it was
taken: trained, dropped with a reason, rejected by the dynamic filter, recycled (and
then taken again or still queued in the data source), or listed in
``run_end.pending_groups``. Nothing is trained twice unless recycled in between, and
nothing is trained that was not taken. Recycled groups are handed out again before any fresh
prompt, oldest first.
"""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import Violation, invariant, lifecycle, sample_indices, violation
from harness.trace import Event

_OUT, _LIVE, _RECYCLED, _DONE = "never taken", "live", "recycled", "finished"


def _walk(events: list[Event], name: str, *, closing: bool) -> list[Violation]:
    state: dict[int, str] = {}
    out: list[Violation] = []

    def bad(pos: int, gi: int, msg: str) -> None:
        out.append(violation(name, f"group {gi}: {msg}", events, pos, context=lifecycle(events, gi, pos)))

    def end(pos: int, gi: int, how: str) -> None:
        s = state.get(gi, _OUT)
        if s != _LIVE:
            bad(pos, gi, f"{how} while {s}")
        state[gi] = _DONE if how != "recycled" else _RECYCLED

    for pos, e in enumerate(events):
        k = e.kind
        if k == ev.TAKEN:
            gi, s = e["group_index"], state.get(e["group_index"], _OUT)
            if s == _OUT and e["recycled"]:
                bad(pos, gi, "taken as recycled but never recycled")
            elif s not in (_OUT, _RECYCLED):
                bad(pos, gi, f"taken again while {s}")
            state[gi] = _LIVE
        elif k == ev.TRAINED:
            seen: set[int] = set()
            for gi in e["group_indices"]:
                if gi in seen:
                    bad(pos, gi, f"appears twice in one training batch (rollout_id={e['rollout_id']})")
                seen.add(gi)
                end(pos, gi, "trained")
        elif k == ev.DROPPED:
            end(pos, e["group_index"], f"dropped ({e['reason']})")
        elif k == ev.RECYCLED:
            end(pos, e["group_index"], "recycled")
        elif k == ev.PUT_REJECTED and str(e["reason"]).startswith("dynamic_filter"):
            end(pos, e["group_index"], "rejected by the dynamic filter")
        elif k == ev.RUN_END and closing:
            pending = list(e["pending_groups"])
            for gi in pending:
                if state.get(gi) not in (_LIVE, _RECYCLED):
                    bad(pos, gi, f"listed as pending at run end while {state.get(gi, _OUT)}")
            missing = set(pending)
            for gi, s in sorted(state.items()):
                if s in (_LIVE, _RECYCLED) and gi not in missing:
                    bad(pos, gi, f"lost: {s} at run end but not trained, dropped or pending")
            if len(pending) != len(set(pending)):
                out.append(violation(name, f"run_end lists a pending group twice: {pending}", events, pos))
    return out


@invariant("conservation", complete_only=True)
def check_conservation(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """Each take ends exactly once; the run end accounts for what is still live."""
    if not any(e.kind == ev.RUN_END for e in events):
        return [
            Violation(
                invariant="conservation",
                message="trace has no run_end event: cannot close the account",
                events=events[-10:],
            )
        ]
    return _walk(events, "conservation", closing=True)


@invariant("conservation_prefix")
def check_conservation_prefix(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """On any prefix (failed or cancelled runs too): nothing ends twice, nothing trained untaken."""
    return _walk(events, "conservation_prefix", closing=False)


@invariant("recycled_first_in_first_out")
def check_recycled_first_in_first_out(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """Recycled groups are handed out by the next ``get_samples`` calls before any fresh
    prompt, oldest first (the default data source's ``pop_first``, ``data_source.py``)."""
    name, out = "recycled_first_in_first_out", []
    queue: list[int] = []  # recycled, not yet taken again, oldest first
    for pos, e in enumerate(events):
        if e.kind == ev.RECYCLED:
            queue.append(e["group_index"])
        elif e.kind == ev.TAKEN:
            gi = e["group_index"]
            if e["recycled"]:
                if queue and queue[0] != gi:
                    out.append(
                        violation(
                            name,
                            f"recycled group {gi} handed out while group {queue[0]}, recycled before it, still waits",
                            events,
                            pos,
                            context=lifecycle(events, gi, pos),
                        )
                    )
                if gi in queue:
                    queue.remove(gi)
            elif queue:
                out.append(
                    violation(name, f"fresh group {gi} handed out while recycled groups {queue[:8]} wait", events, pos)
                )
    return out


@invariant("trained_batch_shape")
def check_trained_batch_shape(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """Every training batch has exactly B groups of n samples, sorted by first sample index."""
    out = []
    groups = sample_indices(events)
    for pos, e in enumerate(events):
        if e.kind != ev.TRAINED:
            continue
        gis = list(e["group_indices"])
        if len(gis) != config.rollout_batch_size:
            out.append(
                violation(
                    "trained_batch_shape",
                    f"rollout_id={e['rollout_id']} trained {len(gis)} groups, expected B={config.rollout_batch_size}",
                    events,
                    pos,
                )
            )
        bad_n = [gi for gi in gis if len(groups.get(gi, ())) != config.n_samples_per_prompt]
        if bad_n:
            out.append(
                violation(
                    "trained_batch_shape",
                    f"rollout_id={e['rollout_id']}: groups {bad_n} do not have n={config.n_samples_per_prompt} samples",
                    events,
                    pos,
                )
            )
        firsts = [min(groups.get(gi, {-1})) for gi in gis]
        if firsts != sorted(firsts):
            out.append(
                violation(
                    "trained_batch_shape",
                    f"rollout_id={e['rollout_id']}: batch not sorted by first "
                    f"sample index: groups {gis} first indices {firsts}",
                    events,
                    pos,
                )
            )
    return out
