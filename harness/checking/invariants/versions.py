"""Weight versions.

* ``version_steps``: engine versions start at 1 (a life resumed under
  ``exactly_once_resume``: at its checkpoint's version) and rise by exactly one per update;
  ``set_weight_version`` follows them and never goes backwards.
* ``token_versions``: every ``finished`` sample's tokens were sampled by versions in
  force between its ``submitted`` and its ``finished`` event, in non-decreasing order;
  it records exactly one ``weight_versions`` entry, the version in force at completion
  (Miles' completion-time stamp), and its per-token runs cover ``response_length``. Under
  one-step ``--partial-rollout`` a resumed sample keeps what it had (``GenerateCalls``):
  each call adds one entry, and the tokens it adds fall in its own window.
  Every ``decode_step`` a real engine records sampled with the version in force.
* ``update_outside_generate``: no weight load falls inside a generate (drain) call.
"""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import GenerateCalls, Violation, invariant, violation
from harness.trace import Event


@invariant("version_steps")
def check_version_steps(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out, engine, manager = "version_steps", [], 0, None
    for pos, e in enumerate(events):
        if e.kind == ev.LIFE_START and config.exactly_once_resume and e["loaded_version"] is not None:
            engine = e["loaded_version"] - 1  # the resumed engines serve the checkpoint's version first
        elif e.kind == ev.ENGINE_VERSION:
            if e["version"] != engine + 1:
                out.append(
                    violation(
                        name, f"engine version went {engine} -> {e['version']}, expected {engine + 1}", events, pos
                    )
                )
            engine = e["version"]
        elif e.kind == ev.SET_WEIGHT_VERSION:
            v = e["version"]
            if (manager is not None and v < manager) or v != engine:
                out.append(
                    violation(name, f"set_weight_version {v} after {manager}; engine holds {engine}", events, pos)
                )
            manager = v
    return out


@invariant("token_versions")
def check_token_versions(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out, engine = "token_versions", [], 0
    submitted: dict[int, int] = {}
    calls = GenerateCalls(config)
    for pos, e in enumerate(events):
        if e.kind == ev.ENGINE_VERSION:
            engine = e["version"]
        elif e.kind == ev.DECODE_STEP:
            if e["version"] != engine:
                out.append(
                    violation(
                        name,
                        f"decode step of samples {list(e['indices'])[:8]} stamped its tokens "
                        f"version {e['version']}; the engine holds {engine}",
                        events,
                        pos,
                    )
                )
        elif e.kind == ev.SUBMITTED:
            submitted[e["index"]] = engine
            if e["version"] != engine:
                out.append(
                    violation(
                        name,
                        f"sample {e['index']} submitted with version {e['version']}, engine holds {engine}",
                        events,
                        pos,
                    )
                )
        elif e.kind == ev.FINISHED:
            i, runs = e["index"], e["token_versions"]
            lo = submitted.get(i)
            problems = []
            if lo is None:
                problems.append("finished without being submitted")
                lo = engine
            new_runs, added, before = calls.added(e)
            versions = [r[0] for r in runs]
            if versions != sorted(versions):
                problems.append(f"token versions go backwards: {versions}")
            if any(not lo <= r[0] <= engine for r in new_runs):
                problems.append(
                    f"token versions {[r[0] for r in new_runs]} outside the versions in force [{lo}, {engine}]"
                )
            if sum(r[2] for r in runs) != e["response_length"]:
                problems.append(
                    f"token runs cover {sum(r[2] for r in runs)} tokens, response_length is {e['response_length']}"
                )
            if added != [str(engine)]:
                problems.append(
                    f"weight_versions={e['weight_versions']}, expected {before + [str(engine)]} (the "
                    "version at completion" + (", after those it had" if before else "") + ")"
                )
            if runs and runs[-1][0] != engine and e["status"] != "aborted":
                problems.append(f"last token run has version {runs[-1][0]}, completion version is {engine}")
            if problems:
                out.append(violation(name, f"sample {i}: " + "; ".join(problems), events, pos))
    return out


@invariant("update_outside_generate")
def check_update_outside_generate(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out, open_ids = "update_outside_generate", [], set()
    for pos, e in enumerate(events):
        if e.kind == ev.GENERATE_START:
            open_ids.add(e["rollout_id"])
        elif e.kind == ev.GENERATE_END:
            open_ids.discard(e["rollout_id"])
        elif e.kind == ev.ENGINE_VERSION and open_ids:
            out.append(
                violation(
                    name,
                    f"weights of version {e['version']} loaded while generate "
                    f"rollout_id={sorted(open_ids)} is in flight",
                    events,
                    pos,
                )
            )
    return out
