"""Pause modes (the engine contract of `contracts.py`).

* ``no_generation_while_paused``: between ``engine_pause`` and ``engine_resume`` nothing
  is admitted, no decode step runs (``decode_step``, recorded by the real engines as
  they run it), the engine's ``generating`` phase is closed before weights load, no
  request completes other than as ABORTED, and weights load only while paused.
* ``abort_semantics``: a pause with ``abort`` finishes every in-flight request as
  ABORTED before the resume, with tokens of the pre-pause version only. Fully-async
  never pauses with ``abort``. ABORTED samples appear only after an abort pause or an
  injected fault.
* ``kv_versions``: a token's KV is never newer than its weights, and older only under
  ``in_place`` (``retract`` and ``abort`` recompute the prefix with the new weights).

Several engines (the ``ray`` layout; events carry ``engine``): the first two hold per
engine. An engine's pause, resume, generating phase, admissions, decode steps and
results are judged against that engine's own pause state (events without ``engine``
are one engine's); the driver's ``engine_version`` needs every engine still alive
(not named by a ``fault(what=engine_died)``) paused and not generating, and an
``engine_loaded`` needs its own engine paused.
"""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import GenerateCalls, Violation, effective_pause_mode, invariant, violation
from harness.trace import Event


def _is_generating(e: Event) -> bool:
    return e.fields.get("side") == "rollout" and e.fields.get("phase") == "generating"


def _engine_name(key: object) -> str:
    return "the engine" if key is None else f"engine {key}"


@invariant("no_generation_while_paused")
def check_no_generation_while_paused(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "no_generation_while_paused", []
    paused: dict[object, bool] = {}
    generating: dict[object, bool] = {}
    engines: dict[object, None] = {}  # engine keys seen and alive, in order of appearance
    for pos, e in enumerate(events):
        k, key = e.kind, e.fields.get("engine")
        if k == ev.FAULT and e.fields.get("what") == "engine_died":
            engines.pop(key, None)
            continue
        if k != ev.ENGINE_VERSION and (
            k in (ev.ENGINE_PAUSE, ev.ENGINE_RESUME, ev.ADMITTED, ev.DECODE_STEP, ev.ENGINE_LOADED) or _is_generating(e)
        ):
            engines.setdefault(key)
        who = _engine_name(key)
        if k == ev.ENGINE_PAUSE:
            paused[key] = True
        elif k == ev.ENGINE_RESUME:
            paused[key] = False
        elif k == ev.PHASE_START and _is_generating(e):
            generating[key] = True
            if paused.get(key):
                out.append(violation(name, f"{who} started generating while paused", events, pos))
        elif k == ev.PHASE_END and _is_generating(e):
            generating[key] = False
        elif k == ev.ADMITTED and paused.get(key):
            out.append(violation(name, f"request {e['index']} admitted while {who} is paused", events, pos))
        elif k == ev.DECODE_STEP and paused.get(key):
            out.append(
                violation(
                    name,
                    f"a decode step (samples {list(e['indices'])[:8]}, version {e['version']}) ran "
                    f"while {who} is paused",
                    events,
                    pos,
                )
            )
        elif k in (ev.ENGINE_VERSION, ev.ENGINE_LOADED):
            keys = [key] if k == ev.ENGINE_LOADED else (list(engines) or [None])
            for key2 in keys:
                who2 = _engine_name(key2)
                if not paused.get(key2):
                    out.append(
                        violation(
                            name, f"weights of version {e['version']} loaded while {who2} is not paused", events, pos
                        )
                    )
                elif generating.get(key2):
                    out.append(
                        violation(
                            name,
                            f"weights of version {e['version']} loaded while {who2} is still "
                            "generating (a decode step runs through the pause)",
                            events,
                            pos,
                        )
                    )
        elif k == ev.FINISHED and paused.get(key) and e["status"] != "aborted":
            out.append(
                violation(name, f"request {e['index']} completed ({e['status']}) while {who} is paused", events, pos)
            )
    return out


@invariant("abort_semantics")
def check_abort_semantics(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out, engine = "abort_semantics", [], 0
    in_flight: dict[int, int] = {}  # index -> group_index
    on_engine: dict[int, object] = {}  # index -> the engine it was submitted to (None: the only one)
    pending_abort: dict[int, tuple[int, bool]] = {}  # index -> (version at the abort pause, resumed since)
    faulted: set[int] = set()
    calls = GenerateCalls(config)
    abort_pos = -1
    for pos, e in enumerate(events):
        k = e.kind
        if k == ev.ENGINE_VERSION:
            engine = e["version"]
        elif k == ev.SUBMITTED:
            in_flight[e["index"]] = e["group_index"]
            on_engine[e["index"]] = e.fields.get("engine")
        elif k == ev.GROUP_DONE and not e["ok"]:
            # Siblings of a failed request are cancelled: they never return.
            for i in [i for i, g in in_flight.items() if g == e["group_index"]]:
                in_flight.pop(i)
                pending_abort.pop(i, None)
        elif k == ev.FAULT and e.fields.get("index") is not None:
            faulted.add(e["index"])
        elif k == ev.ENGINE_PAUSE and e["mode"] == "abort":
            if config.fully_async:
                out.append(violation(name, "fully-async engine paused with mode=abort", events, pos))
            key = e.fields.get("engine")
            pending_abort.update({i: (engine, False) for i in in_flight if on_engine.get(i) == key})
            abort_pos = pos
        elif k == ev.ENGINE_RESUME:
            key = e.fields.get("engine")
            pending_abort = {i: (v, r or on_engine.get(i) == key) for i, (v, r) in pending_abort.items()}
        elif k == ev.FINISHED:
            i = e["index"]
            in_flight.pop(i, None)
            new_runs, added, _ = calls.added(e)
            if i in pending_abort:
                v, resumed = pending_abort.pop(i)
                versions = {r[0] for r in new_runs}
                if resumed or e["status"] != "aborted" or not versions <= {v} or added != [str(v)]:
                    out.append(
                        violation(
                            name,
                            f"request {i} in flight at the abort pause returned "
                            f"{'after the resume ' if resumed else ''}status={e['status']} token "
                            f"versions {sorted(versions)} weight_versions={e['weight_versions']}; "
                            f"expected ABORTED at the pause with version {v} only",
                            events,
                            pos,
                            context=events[abort_pos : pos + 1][-30:],
                        )
                    )
            elif e["status"] == "aborted" and i not in faulted:
                out.append(
                    violation(
                        name, f"request {i} returned ABORTED without an abort pause or injected fault", events, pos
                    )
                )
            faulted.discard(i)
    if pending_abort and not any(e.kind == ev.FAULT for e in events):
        out.append(
            violation(
                name,
                f"requests {sorted(pending_abort)[:8]} were in flight at an abort pause and never returned",
                events,
                len(events) - 1,
            )
        )
    return out


@invariant("kv_versions")
def check_kv_versions(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "kv_versions", []
    in_place_allowed = effective_pause_mode(config) == "in_place"
    for pos, e in enumerate(events):
        if e.kind != ev.FINISHED:
            continue
        for version, kv, count in e["token_versions"]:
            if kv > version:
                out.append(
                    violation(
                        name,
                        f"sample {e['index']}: {count} tokens of version {version} attended to "
                        f"KV of a newer version {kv}",
                        events,
                        pos,
                    )
                )
            elif kv < version and not in_place_allowed:
                out.append(
                    violation(
                        name,
                        f"sample {e['index']}: {count} tokens of version {version} extend KV of "
                        f"version {kv}; only --pause-generation-mode in_place keeps old KV (mode here: "
                        f"{effective_pause_mode(config)})",
                        events,
                        pos,
                    )
                )
    return out
