"""What a run observably did, aspect by aspect, and the first place two runs part.

``observables(events, history, wall_s, error)`` turns a run's trace into one
time-ordered list per aspect (``ASPECTS``), each item ``(time, value)``:

* ``generate``: the weight version each generate / drain read (``generate_start``);
* ``updates``: weight updates (time, version);
* ``trained``: each training batch (rollout id, prompt groups in order);
* ``ages``: per trained group, the recorded-version age and the true oldest-token age;
* ``weight_versions``: per trained sample, ``weight_versions`` as recorded;
* ``get_samples``: every ``get_samples`` call (groups handed out, recycled ones marked);
* ``recycles``: groups handed back to the data source;
* ``pauses``: engine pauses (time, mode, requests in flight);
* ``metrics``: every ``rollout/*`` metric of each drain / generate; the core's own
  extension keys (``EXTENSION_METRICS``) are left out, upstream has none;
* ``end``: total virtual time and the error type, if the run failed.

``first_divergence(a, b)`` is the earliest differing item over all aspects (by virtual
time; ``ages`` and ``end`` have no time of their own and count only when nothing else
differs), as ``(aspect, position)``, or ``None`` when every aspect is the same.

The differential (``harness.upstream.diff``: core against upstream) and the gate
(``harness.upstream.gate``: a pull request's tree against its base) compare runs by these.
"""

from __future__ import annotations

from miles_async_core import events as ev
from harness.trace import Event

# The core's own accounting, not Miles metrics: the fully-async handler counters and the
# one-step drop counters (nothing is lost silently). Upstream reports neither.
EXTENSION_METRICS = ("rollout/fully_async/handler_", "rollout/dropped_groups/")
ASPECTS = (
    "generate",
    "updates",
    "trained",
    "ages",
    "weight_versions",
    "get_samples",
    "recycles",
    "pauses",
    "metrics",
    "end",
)


def observables(
    events: list[Event],
    history: list[dict],
    wall_s: float,
    error: BaseException | None,
    finished: dict[int, list] | None = None,
) -> dict[str, list]:
    out: dict[str, list] = {a: [] for a in ASPECTS}
    calls: dict[int, list] = {}
    wv: dict[int, tuple] = {}
    for e in events:
        k, t = e.kind, e.t
        if k == ev.GENERATE_START:
            out["generate"].append((t, (e["rollout_id"], e["version"])))
        elif k == ev.ENGINE_VERSION:
            out["updates"].append((t, e["version"]))
        elif k == ev.TRAINED:
            out["trained"].append((t, (e["rollout_id"], tuple(e["group_indices"]))))
            for gi in e["group_indices"]:
                out["weight_versions"].append((t, (gi, wv.get(gi))))
        elif k == ev.FINISHED:
            prev = dict(wv.get(e["group_index"], ()))
            prev[e["index"]] = tuple(e["weight_versions"])
            wv[e["group_index"]] = tuple(sorted(prev.items()))
        elif k == ev.TAKEN:
            calls.setdefault(e.get("call", -1), []).append((t, (e["group_index"], bool(e["recycled"]))))
        elif k == ev.RECYCLED:
            out["recycles"].append((t, e["group_index"]))
        elif k == ev.ENGINE_PAUSE:
            out["pauses"].append((t, (e["mode"], e["in_flight"])))
        elif k == ev.METRICS:
            m = {
                key: round(float(v), 9)
                for key, v in e["metrics"].items()
                if key.startswith("rollout/") and not key.startswith(EXTENSION_METRICS)
            }
            out["metrics"].append((t, (e["rollout_id"], tuple(sorted(m.items())))))
    for c in sorted(calls):
        items = calls[c]
        out["get_samples"].append((items[0][0], tuple(v for _, v in items)))
    for r in history:
        out["ages"].append(
            (0.0, (r.get("rollout_id"), tuple(r.get("age_versions", ())), tuple(r.get("token_age_versions", ()))))
        )
    out["end"].append((wall_s, (round(wall_s, 9), type(error).__name__ if error is not None else None)))
    return out


def first_divergence(a: dict[str, list], b: dict[str, list]) -> tuple[str, int] | None:
    best: tuple[float, int, str, int] | None = None
    for rank, aspect in enumerate(ASPECTS):
        xs, ys = a[aspect], b[aspect]
        for i in range(max(len(xs), len(ys))):
            if i >= len(xs) or i >= len(ys) or xs[i][1] != ys[i][1]:
                t = min(x[i][0] for x in (xs, ys) if i < len(x))
                if aspect in ("ages", "end"):
                    t = float("inf")  # no time of their own: reported only when nothing else differs
                key = (t, rank, aspect, i)
                if best is None or key < best:
                    best = key
                break
    return None if best is None else (best[2], best[3])


__all__ = ["ASPECTS", "EXTENSION_METRICS", "first_divergence", "observables"]
