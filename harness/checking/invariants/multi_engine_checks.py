"""Several engines behind one rollout engine (the ``ray`` layout; Miles' updater
pauses, loads and resumes every engine: ``update_weight_from_distributed/mixin.py:L309-L331``).

Engine events carry ``engine`` (the engine's index); each engine records
``engine_loaded(engine, version)`` as it applies an update, the driver one
``engine_version`` per update after every engine has loaded it. An engine named by a
``fault(what=engine_died)`` is out of the account from then on. Traces without
``engine_loaded`` (one engine, the simulator) pass all three vacuously.

* ``engine_versions_monotonic``: on every engine, versions never go backwards: its loads
  rise strictly, its decode steps never use a version below an earlier step's, and
  every decode step uses the version the engine loaded last.
* ``all_engines_updated_before_resume``: when the driver records ``engine_version v``
  every live engine has loaded ``v``, and no engine resumes after that update before
  every live engine has loaded ``v``.
* ``all_engines_paused_for_update``: every live engine is paused (an ``engine_pause``
  since the update's ``weight_sync`` phase began) before the driver records the
  update, all of them with the same mode, and each engine loads only while paused.
"""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import Violation, invariant, violation
from harness.trace import Event


def _multi_engine(events: list[Event]) -> bool:
    return any(e.kind == ev.ENGINE_LOADED for e in events)


class _Live:
    """Engines seen (any event with ``engine``) minus those that died."""

    def __init__(self) -> None:
        self.seen: dict[object, None] = {}
        self.dead: set[object] = set()

    def observe(self, e: Event) -> None:
        key = e.fields.get("engine")
        if key is None:
            return
        if e.kind == ev.FAULT and e.fields.get("what") == "engine_died":
            self.dead.add(key)
        elif key not in self.dead:
            self.seen.setdefault(key)

    def live(self) -> list[object]:
        return [k for k in self.seen if k not in self.dead]


def _engine_order(key: object) -> tuple[int, int, str]:
    """Sort key of an engine id as a trace holds it: ints in order, then any other by text."""
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def _is_weight_sync_start(e: Event) -> bool:
    return e.kind == ev.PHASE_START and e.fields.get("side") == "train" and e.fields.get("phase") == "weight_sync"


@invariant("engine_versions_monotonic")
def check_engine_versions_monotonic(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "engine_versions_monotonic", list[Violation]()
    if not _multi_engine(events):
        return out
    loaded: dict[object, int] = {}
    decoded: dict[object, int] = {}
    for pos, e in enumerate(events):
        key = e.fields.get("engine")
        if e.kind == ev.ENGINE_LOADED:
            v = e["version"]
            if v <= loaded.get(key, 0):
                out.append(
                    violation(
                        name,
                        f"engine {key} loaded version {v} after version {loaded.get(key, 0)}: "
                        "its version went backwards or repeated",
                        events,
                        pos,
                    )
                )
            loaded[key] = v
        elif e.kind == ev.DECODE_STEP and key is not None:
            v = e["version"]
            if v < decoded.get(key, 0):
                out.append(
                    violation(
                        name, f"engine {key} decoded with version {v} after decoding with {decoded[key]}", events, pos
                    )
                )
            if v != loaded.get(key, 0):
                out.append(
                    violation(
                        name,
                        f"engine {key} decoded samples {list(e['indices'])[:8]} with version {v}; "
                        f"it loaded version {loaded.get(key, 0)} last",
                        events,
                        pos,
                    )
                )
            decoded[key] = max(v, decoded.get(key, 0))
    return out


@invariant("all_engines_updated_before_resume")
def check_all_engines_updated_before_resume(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "all_engines_updated_before_resume", list[Violation]()
    if not _multi_engine(events):
        return out
    live = _Live()
    loaded: dict[object, int] = {}
    current = 0  # the driver's last engine_version
    for pos, e in enumerate(events):
        live.observe(e)
        key = e.fields.get("engine")
        if e.kind == ev.ENGINE_LOADED:
            loaded[key] = e["version"]
        elif e.kind == ev.ENGINE_VERSION:
            current = e["version"]
            missing = [k for k in live.live() if loaded.get(k, 0) != current]
            if missing:
                out.append(
                    violation(
                        name,
                        f"the driver recorded version {current} while engine(s) "
                        f"{missing} hold version(s) {[loaded.get(k, 0) for k in missing]}",
                        events,
                        pos,
                    )
                )
        elif e.kind == ev.ENGINE_RESUME and key is not None and current:
            missing = [k for k in live.live() if loaded.get(k, 0) != current]
            if missing:
                out.append(
                    violation(
                        name,
                        f"engine {key} resumed after the update to version {current} while "
                        f"engine(s) {missing} had not loaded it (they hold "
                        f"{[loaded.get(k, 0) for k in missing]})",
                        events,
                        pos,
                    )
                )
    return out


@invariant("all_engines_paused_for_update")
def check_all_engines_paused_for_update(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "all_engines_paused_for_update", list[Violation]()
    if not _multi_engine(events):
        return out
    live = _Live()
    paused: dict[object, bool] = {}
    modes: dict[object, str] = {}  # engine -> mode of its pause since the weight_sync began
    for pos, e in enumerate(events):
        live.observe(e)
        key = e.fields.get("engine")
        if _is_weight_sync_start(e):
            modes = {}
        elif e.kind == ev.ENGINE_PAUSE and key is not None:
            paused[key] = True
            modes[key] = e["mode"]
        elif e.kind == ev.ENGINE_RESUME and key is not None:
            paused[key] = False
        elif e.kind == ev.ENGINE_LOADED and not paused.get(key):
            out.append(violation(name, f"engine {key} loaded version {e['version']} while not paused", events, pos))
        elif e.kind == ev.ENGINE_VERSION:
            unpaused = [k for k in live.live() if k not in modes]
            if unpaused:
                out.append(
                    violation(
                        name,
                        f"the update to version {e['version']} paused engines {sorted(modes, key=_engine_order)} but not {unpaused}",
                        events,
                        pos,
                    )
                )
            if len(set(modes.values())) > 1:
                out.append(
                    violation(
                        name,
                        f"the update to version {e['version']} paused the engines with different modes {modes}",
                        events,
                        pos,
                    )
                )
    return out
