"""Submission and concurrency (upstream's `submission_scheduler.py` and the fully-async worker).

* ``in_flight_cap``: under fully-async, in-flight samples (submitted, not finished, not
  cancelled with a failed group) never exceed ``G * n`` with sample granularity, and
  in-flight groups (submitted, no ``group_done``) never exceed ``G`` with group
  granularity.
* ``whole_group_submission``: groups are submitted whole and in the order they were
  taken: after a ``taken``, that group's ``n`` samples are submitted before any sample
  of a later group. A one-step ``--partial-rollout`` group handed back and taken again
  submits only its samples that did not finish (upstream's ``generate_and_rm`` keeps a
  finished one as it is), and an aborted one that has used its token budget is truncated
  without a request, which the trace cannot tell from a missing one: such samples may be
  left out. A sample a generate function adds to a trajectory (a nested group,
  ``trajectory_sample``) is not a prompt sample of the group: it may be submitted later,
  but only after its ``trajectory_sample`` announcement, for a trajectory (a prompt sample
  of that group's current take) whose own request was already submitted.
* ``one_step_submission_budget``: a one-step or sync rollout pulls more prompts only while
  its scheduler has room for the groups it still needs: with group granularity the groups
  pending plus those accepted so far are fewer than B; with sample granularity the samples
  in flight plus n fit in ``(B - accepted) * n`` (the budget is B minus the
  groups kept, ``inference_rollout_train.py:L111``). Accepted: finished, not failed, not
  dropped by the dynamic filter. Samples in flight are counted from the trace (a finished
  sample's slot frees a few loop steps after its ``finished`` event, a failed group's
  siblings are released from its first ``finished``), so the sample check is lenient.
* ``one_group_per_pull``: under fully-async every ``get_samples`` call hands out exactly
  one group (``--over-sampling-batch-size`` has no effect there), read from the
  ``call`` number each ``taken`` event carries.
"""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import Violation, invariant, is_fully_async, violation
from harness.trace import Event


@invariant("in_flight_cap", applies=is_fully_async)
def check_in_flight_cap(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "in_flight_cap", []
    n, g_budget = config.n_samples_per_prompt, config.group_budget
    by_sample = config.resolved_rollout_submission_granularity == "sample"
    cap = g_budget * n if by_sample else g_budget
    samples: dict[int, int] = {}  # in-flight sample index -> group
    groups: set[int] = set()
    for pos, e in enumerate(events):
        k = e.kind
        if k == ev.SUBMITTED:
            samples[e["index"]] = e["group_index"]
            groups.add(e["group_index"])
            count = len(samples) if by_sample else len(groups)
            if count > cap:
                unit = "samples" if by_sample else "groups"
                out.append(
                    violation(
                        name,
                        f"{count} {unit} in flight, cap is {cap} (G={g_budget}, n={n}, "
                        f"{config.resolved_rollout_submission_granularity} granularity)",
                        events,
                        pos,
                    )
                )
        elif k == ev.FINISHED:
            samples.pop(e["index"], None)
        elif k == ev.GROUP_DONE:
            groups.discard(e["group_index"])
            if not e["ok"]:
                for i in [i for i, gi in samples.items() if gi == e["group_index"]]:
                    samples.pop(i)
    return out


@invariant("whole_group_submission")
def check_whole_group_submission(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "whole_group_submission", []
    queue: list[list] = []  # [group_index, indices still to submit]
    partial = bool(getattr(config, "partial_rollout", False)) and not config.fully_async
    last: dict[int, Event] = {}  # sample index -> its last `finished` (partial rollout)
    taken: dict[int, set] = {}  # group -> prompt sample indices of its current take
    added: dict[int, int] = {}  # announced sample of a trajectory, not yet submitted -> group
    for pos, e in enumerate(events):
        k = e.kind
        if k == ev.FINISHED and partial:
            last[e["index"]] = e
        elif k == ev.TRAJECTORY_SAMPLE:
            gi, traj = e["group_index"], e["trajectory"]
            pending = any(q[0] == gi and traj in q[1] for q in queue)
            if traj not in taken.get(gi, ()) or e["index"] in taken.get(gi, ()) or pending:
                why = (
                    "its trajectory is still waiting to be submitted"
                    if pending
                    else "it is a prompt sample of the group"
                    if e["index"] in taken.get(gi, ())
                    else f"{traj} is not a prompt sample of group {gi}'s current take"
                )
                out.append(
                    violation(
                        name, f"sample {e['index']} added to trajectory {traj} of group {gi}, but " + why, events, pos
                    )
                )
            else:
                added[e["index"]] = gi
        elif k == ev.TAKEN:
            indices = list(e["indices"])
            taken[e["group_index"]] = set(indices)
            if partial and e["recycled"]:
                indices = [i for i in indices if i not in last or last[i]["status"] == "aborted"]
            queue.append([e["group_index"], indices])
            queue = [q for q in queue if q[1]]
        elif k == ev.SUBMITTED and added.get(e["index"]) == e["group_index"]:
            del added[e["index"]]  # announced for a trajectory of its group (above)
        elif k == ev.SUBMITTED:
            if partial:  # resumed samples with a spent budget send no request
                while (
                    queue
                    and queue[0][0] != e["group_index"]
                    and all(i in last and last[i]["response_length"] > 0 for i in queue[0][1])
                ):
                    queue.pop(0)
            if not queue or queue[0][0] != e["group_index"] or e["index"] not in queue[0][1]:
                head = queue[0][0] if queue else None
                out.append(
                    violation(
                        name,
                        f"sample {e['index']} of group {e['group_index']} submitted while group "
                        f"{head} is not fully submitted (groups are submitted whole, in take order)",
                        events,
                        pos,
                    )
                )
                for q in queue:
                    if q[0] == e["group_index"] and e["index"] in q[1]:
                        q[1].remove(e["index"])
            else:
                queue[0][1].remove(e["index"])
            queue = [q for q in queue if q[1]]
        elif k == ev.FAULT and e["what"] == "worker_crash":
            queue = [q for q in queue if q[0] != e.fields.get("group_index")]
    return out


@invariant("one_step_submission_budget", applies=lambda c: not c.fully_async)
def check_one_step_submission_budget(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "one_step_submission_budget", []
    B, n = config.rollout_batch_size, config.n_samples_per_prompt
    by_sample = config.resolved_rollout_submission_granularity == "sample"
    pending: set[int] = set()  # groups taken in this rollout, not yet done
    accepted = 0
    in_flight: dict[int, int] = {}  # sample index -> group
    last: dict[int, str] = {}  # sample index -> status of its last `finished`
    call = None
    # A failed request cancels its siblings (each frees its slot) before the group's
    # `group_done`; the trace does not say which request failed, so a failed group's
    # samples are released from its first `finished` on (lenient).
    failed = {e["group_index"] for e in events if e.kind == ev.GROUP_DONE and not e["ok"]}
    for pos, e in enumerate(events):
        k = e.kind
        if k == ev.GENERATE_START:
            pending, accepted, in_flight, call = set(), 0, {}, None
        elif k == ev.TAKEN:
            if e.get("call") != call:  # a new get_samples call: the scheduler said it had room
                call = e.get("call")
                if by_sample:
                    flight = len(in_flight) if pending else 0  # nothing pending resets the count
                    room = flight + n <= (B - accepted) * n
                else:
                    room = len(pending) + accepted < B
                if not room:
                    have = f"{len(in_flight)} samples in flight" if by_sample else f"{len(pending)} groups pending"
                    out.append(
                        violation(
                            name,
                            f"get_samples call {call} made with {have} and {accepted} of B={B} "
                            f"groups accepted: the {config.resolved_rollout_submission_granularity}-level "
                            "scheduler had no room",
                            events,
                            pos,
                        )
                    )
            pending.add(e["group_index"])
            for i in e["indices"]:  # a finished sample of a resumed group sends no request
                if last.get(i) not in ("completed", "truncated"):
                    in_flight[i] = e["group_index"]
        elif k == ev.FINISHED:
            in_flight.pop(e["index"], None)
            last[e["index"]] = e["status"]
            if e["group_index"] in failed:
                for i in [i for i, gi in in_flight.items() if gi == e["group_index"]]:
                    in_flight.pop(i)
        elif k == ev.GROUP_DONE and e["group_index"] in pending:
            pending.discard(e["group_index"])
            accepted += bool(e["ok"])
            for i in [i for i, gi in in_flight.items() if gi == e["group_index"]]:
                in_flight.pop(i)  # siblings of a failed request are cancelled
        elif k == ev.DROPPED and str(e["reason"]).startswith("dynamic_filter"):
            accepted -= 1
    return out


@invariant("one_group_per_pull", applies=is_fully_async)
def check_one_group_per_pull(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "one_group_per_pull", []
    seen: dict[int, int] = {}  # call -> groups handed out
    for pos, e in enumerate(events):
        if e.kind == ev.TAKEN and e.get("call") is not None:
            seen[e["call"]] = seen.get(e["call"], 0) + 1
            if seen[e["call"]] == 2:
                out.append(
                    violation(
                        name,
                        f"get_samples call {e['call']} handed out more than one group under "
                        "--fully-async (the worker must pull one group at a time; "
                        "--over-sampling-batch-size has no effect there)",
                        events,
                        pos,
                    )
                )
    return out
