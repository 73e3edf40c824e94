"""Checkers across lives: a run that stops and resumes from a checkpoint.

A run with lives (``miles_async_core.events``: ``life_start`` / ``life_end``,
``checkpoint_saved`` / ``checkpoint_loaded``, every event carrying ``life``) is judged on
what survived: the *kept history* is, life by life, the training steps the next life's
checkpoint contains (rollout ids up to the loaded model checkpoint's) and, for the last
life, every step. A step a later life rolled back (trained after the checkpoint it loads)
does not count: its weights are gone.

* ``resume_exactly_once``: every source group (``source_index``, ``epoch``) below the final
  cursor (where the last life's data source stands at the end) is trained exactly once in the kept history: never twice, and never skipped
  unless the run dropped it by design (a ``dropped`` event: handler drop, retry cap, kept
  beyond B, aborted at a rollout's end), or it is still pending when the last life ends.
* ``resume_rollout_once``: each rollout id is trained once in the kept history; a life
  starts at the loaded checkpoint's rollout id + 1, and its first step's optimizer and
  learning-rate steps continue from the checkpoint's.
* ``resume_versions``: weight versions never go back across a resume: a resumed life's
  engines first serve the checkpoint's version (``loaded_version``), no version of the
  life is below it nor below the version served when the checkpoint was saved, and the
  trainer's version (which sample ages are measured against) is never below it.

``resume_report(events)`` is the accounting behind the first checker (``ResumeReport``):
per source group how often it was trained; each lost group with its mechanism (its state
when the loaded checkpoint's data source was saved, the moment its cursor was fixed) and
its response length; the duplicated groups; the response-length bias of what was lost
against what was trained; and one row per resume. All three checkers are not applicable
to a trace without lives (``has_lives``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.checking.invariants.base import Violation, invariant
from harness.trace import Event
from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig

MECHANISMS = (
    "look_ahead",
    "in_flight",
    "buffered",
    "recycled_partial",
    "over_sampling_leftover",
    "recycled_retry",
    "generated_not_trained",
    "trained_after_checkpoint",
    "never_taken",
)

SourceKey = tuple[int, int]  # (source_index, epoch)


def has_lives(events: list[Event]) -> bool:
    """A trace with lives: it records a ``life_start`` (a single-life trace never does)."""
    return any(e.kind == ev.LIFE_START for e in events)


def split_lives(events: list[Event]) -> list[list[Event]]:
    """The events of each life, in order (an event without ``life`` is life 0's)."""
    lives: dict[int, list[Event]] = {}
    for e in events:
        lives.setdefault(int(e.fields.get("life", 0)), []).append(e)
    return [lives[k] for k in sorted(lives)]


@dataclass
class LostGroup:
    source: SourceKey
    life: int  # the life that last held it
    mechanism: str  # one of MECHANISMS: its state when the loaded checkpoint's cursor was saved
    state_at_stop: str  # its state when that life ended
    response_length: float | None  # mean over its samples' last responses, None if none finished


@dataclass
class ResumeRow:
    """One resume: life ``life - 1`` stopped at ``at`` (``how``), life ``life`` started."""

    life: int
    how: str
    at: str
    loaded_rollout_id: int | None
    lost: int = 0
    duplicated: int = 0
    mechanisms: dict[str, int] = field(default_factory=dict)


@dataclass
class ResumeReport:
    trained: dict[SourceKey, list[tuple[int, int]]]  # source -> [(life, rollout_id)] in the kept history
    lost: list[LostGroup]
    duplicated: dict[SourceKey, list[tuple[int, int]]]
    dropped: set[SourceKey]
    pending_at_end: set[SourceKey]
    final_cursor: int  # where the last life's data source stands: its loaded cursor, or past its newest take
    resumes: list[ResumeRow]
    lost_length_mean: float | None
    trained_length_mean: float | None

    @property
    def length_bias(self) -> float | None:
        """Mean response length of the lost groups over that of the trained ones."""
        if self.lost_length_mean is None or not self.trained_length_mean:
            return None
        return self.lost_length_mean / self.trained_length_mean

    def mechanisms(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.lost:
            out[g.mechanism] = out.get(g.mechanism, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, object]:
        return {
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "dropped": len(self.dropped),
            "pending_at_end": len(self.pending_at_end),
            "trained_groups": len(self.trained),
            "final_cursor": self.final_cursor,
            "mechanisms": self.mechanisms(),
            "lost_length_mean": self.lost_length_mean,
            "trained_length_mean": self.trained_length_mean,
            "length_bias": self.length_bias,
            "resumes": [
                {
                    "life": r.life,
                    "how": r.how,
                    "at": r.at,
                    "loaded_rollout_id": r.loaded_rollout_id,
                    "lost": r.lost,
                    "duplicated": r.duplicated,
                    "mechanisms": r.mechanisms,
                }
                for r in self.resumes
            ],
        }


# ---- one life ----------------------------------------------------------------------------


class _Life:
    """What one life's events say about its source groups, steps and checkpoints."""

    def __init__(self, number: int, events: list[Event], config: AsyncConfig | None) -> None:
        self.number = number
        self.events = events
        self.config = config
        self.start = next((e for e in events if e.kind == ev.LIFE_START), None)
        self.end = next((e for e in events if e.kind == ev.LIFE_END), None)
        self.loaded_model = next((e for e in events if e.kind == ev.CHECKPOINT_LOADED and e["part"] == "model"), None)
        self.source_of: dict[int, SourceKey] = {}  # group_index -> source group, in this life
        self.taken_at: dict[SourceKey, int] = {}  # source -> position of its last take
        self.lengths: dict[int, int] = {}  # sample index -> last response length
        self.members: dict[int, list[int]] = {}
        self.trained: list[tuple[int, list[SourceKey], Event]] = []  # (rollout_id, sources, event)
        self.dropped: set[SourceKey] = set()
        for pos, e in enumerate(events):
            self._read(pos, e)

    def _read(self, pos: int, e: Event) -> None:
        k = e.kind
        if k == ev.TAKEN and "source_index" in e.fields:
            src = (int(e["source_index"]), int(e.fields.get("epoch", 0)))
            self.source_of[e["group_index"]] = src
            self.taken_at[src] = pos
            self.members[e["group_index"]] = list(e["indices"])
        elif k == ev.FINISHED:
            self.lengths[e["index"]] = int(e["response_length"])
        elif k == ev.TRAINED:
            srcs = [self.source_of[g] for g in e["group_indices"] if g in self.source_of]
            self.trained.append((int(e["rollout_id"]), srcs, e))
        elif k == ev.DROPPED and e["group_index"] in self.source_of:
            self.dropped.add(self.source_of[e["group_index"]])

    def group_length(self, src: SourceKey) -> float | None:
        gis = [g for g, s in self.source_of.items() if s == src]
        lengths = [self.lengths[i] for g in gis for i in self.members.get(g, []) if i in self.lengths]
        return sum(lengths) / len(lengths) if lengths else None

    def save_position(self, rollout_id: int) -> int | None:
        """Where this life saved the data source of checkpoint ``rollout_id`` (else its model)."""
        found = None
        for pos, e in enumerate(self.events):
            if e.kind == ev.CHECKPOINT_SAVED and e["rollout_id"] == rollout_id:
                found = pos
                if e["part"] == "data_source":
                    return pos
        return found

    def state_at(self, src: SourceKey, upto: int | None, checkpoint: int | None) -> str:
        """The source group's state after the events up to position ``upto`` (inclusive)."""
        gis = {g for g, s in self.source_of.items() if s == src}
        end = len(self.events) if upto is None else upto + 1
        state, taker = "never_taken", None
        generating: int | None = None
        draining: int | None = None
        tokens = 0
        for e in self.events[:end]:
            k = e.kind
            if k == ev.GENERATE_START:
                generating = e["rollout_id"]
            elif k == ev.GENERATE_END:
                generating = None
            elif k == ev.DRAIN_START:
                draining = e["rollout_id"]
            gi = e.fields.get("group_index")
            if k == ev.TRAINED and gis & set(e["group_indices"]):
                state = (
                    "trained_after_checkpoint" if checkpoint is not None and e["rollout_id"] > checkpoint else "trained"
                )
                continue
            if gi not in gis:
                if k == ev.FINISHED and taker is not None and e["index"] in self.members.get(taker, ()):
                    tokens += int(e["response_length"])
                continue
            if k == ev.TAKEN:
                state, taker, tokens = "in_flight", gi, 0
                if (
                    generating is not None
                    and checkpoint is not None
                    and generating > checkpoint
                    and not self._fully_async()
                ):
                    state = "look_ahead"
            elif k == ev.PUT_ACCEPTED:
                state = "buffered"
            elif k == ev.GOT:  # drained for a rollout after the checkpoint: the look-ahead drain
                state = (
                    "look_ahead"
                    if checkpoint is not None and draining is not None and draining > checkpoint
                    else "generated_not_trained"
                )
            elif k == ev.GROUP_DONE and state in ("in_flight",) and not self._fully_async():
                state = "generated_not_trained"
            elif k == ev.RECYCLED:
                state = self._recycled_kind(tokens)
            elif k == ev.DROPPED:
                state = "dropped"
        return state

    def _fully_async(self) -> bool:
        return bool(self.config is not None and self.config.fully_async)

    def _recycled_kind(self, tokens: int) -> str:
        c = self.config
        if c is not None and c.fully_async:
            return "recycled_retry"
        if c is not None and tokens == 0 and c.resolved_over_sampling_batch_size > c.rollout_batch_size:
            return "over_sampling_leftover"
        return "recycled_partial"


def _kept(lives: list[_Life]) -> list[tuple[int, list[SourceKey], int]]:
    """The kept history: (rollout_id, sources, life) of every step the final model contains."""
    kept: list[tuple[int, list[SourceKey], int]] = []
    for life in lives:
        if life.number > 0 or life.start is not None:
            loaded = life.loaded_model["rollout_id"] if life.loaded_model is not None else None
            kept = [s for s in kept if loaded is not None and s[0] <= loaded and s[2] < life.number]
            if loaded is not None:  # a step saved twice (a re-trained rollout) is in the checkpoint once, the last
                seen: set[int] = set()
                last_saves = []
                for s in reversed(kept):
                    if s[0] not in seen:
                        seen.add(s[0])
                        last_saves.append(s)
                kept = last_saves[::-1]
        kept += [(rid, srcs, life.number) for rid, srcs, _ in life.trained]
    return kept


def resume_report(events: list[Event], config: AsyncConfig | None = None) -> ResumeReport | None:
    """The accounting of source groups across lives; ``None`` for a trace without lives."""
    if not has_lives(events):
        return None
    lives = [_Life(i, evs, config) for i, evs in enumerate(split_lives(events))]
    kept = _kept(lives)
    trained: dict[SourceKey, list[tuple[int, int]]] = {}
    for rid, srcs, life in kept:
        for s in srcs:
            trained.setdefault(s, []).append((life, rid))
    dropped = set().union(*(life.dropped for life in lives)) - set(trained)
    last = lives[-1]
    completed = last.end is not None and last.end["how"] == "completed"
    # still queued when the run ends: taken by the last life, or re-queued by its checkpoint and not handed out yet
    queued = {
        (int(i), 0)
        for e in last.events
        if e.kind == ev.CHECKPOINT_LOADED and e["part"] == "data_source"
        for i in (e.fields.get("state") or {}).get("pending", ())
    }
    pending = {s for s in set(last.taken_at) | queued if s not in trained and s not in dropped} if completed else set()
    seen = set().union(*(life.taken_at for life in lives))
    final_cursor = _final_cursor(last)
    lost: list[LostGroup] = []
    for idx in range(final_cursor):
        src = (idx, 0)
        candidates = [s for s in seen if s[0] == idx] or [src]
        for s in candidates:
            if s in trained or s in dropped or s in pending:
                continue
            lost.append(_lost(s, lives))
    lost.sort(key=lambda g: g.source)
    dup = {s: t for s, t in trained.items() if len(t) > 1}
    lost_lengths = [g.response_length for g in lost if g.response_length is not None]
    trained_lengths = [x for x in (_trained_length(s, t, lives) for s, t in trained.items()) if x is not None]
    return ResumeReport(
        trained=trained,
        lost=lost,
        duplicated=dup,
        dropped=dropped,
        pending_at_end=pending,
        final_cursor=final_cursor,
        resumes=_rows(lives, lost, dup),
        lost_length_mean=sum(lost_lengths) / len(lost_lengths) if lost_lengths else None,
        trained_length_mean=sum(trained_lengths) / len(trained_lengths) if trained_lengths else None,
    )


def _final_cursor(last: _Life) -> int:
    """The last life's cursor: the ``sample_offset`` it loaded (0 without a data source part),
    or past the newest source it handed out, whichever is further."""
    loaded = next((e for e in last.events if e.kind == ev.CHECKPOINT_LOADED and e["part"] == "data_source"), None)
    start = int((loaded.fields.get("state") or {}).get("sample_offset", 0)) if loaded is not None else 0
    return max(start, 1 + max((s[0] for s in last.taken_at), default=-1))


def _next_loaded(lives: list[_Life], number: int) -> int | None:
    nxt = lives[number + 1] if number + 1 < len(lives) else None
    return nxt.loaded_model["rollout_id"] if nxt is not None and nxt.loaded_model is not None else None


def _lost(src: SourceKey, lives: list[_Life]) -> LostGroup:
    holder = next((life for life in reversed(lives) if src in life.taken_at), None)
    if holder is None:
        return LostGroup(src, lives[-1].number, "never_taken", "never_taken", None)
    ckpt = _next_loaded(lives, holder.number)
    save = holder.save_position(ckpt) if ckpt is not None else None
    at_stop = holder.state_at(src, None, ckpt)
    mechanism = holder.state_at(src, save, ckpt) if save is not None else at_stop
    return LostGroup(src, holder.number, mechanism, at_stop, holder.group_length(src))


def _trained_length(src: SourceKey, where: list[tuple[int, int]], lives: list[_Life]) -> float | None:
    return lives[where[-1][0]].group_length(src)


def _rows(lives: list[_Life], lost: list[LostGroup], dup: dict[SourceKey, list[tuple[int, int]]]) -> list[ResumeRow]:
    rows = []
    for life in lives[1:]:
        prev = lives[life.number - 1]
        end = prev.end
        row = ResumeRow(
            life=life.number,
            how=end["how"] if end is not None else "unknown",
            at=str(end["at"]) if end is not None else "unknown",
            loaded_rollout_id=life.loaded_model["rollout_id"] if life.loaded_model is not None else None,
        )
        for g in lost:
            if g.life == prev.number:
                row.lost += 1
                row.mechanisms[g.mechanism] = row.mechanisms.get(g.mechanism, 0) + 1
        row.duplicated = sum(1 for t in dup.values() if any(lf == life.number for lf, _ in t[1:]))
        rows.append(row)
    return rows


# ---- the checkers ------------------------------------------------------------------------


def _slice(events: list[Event], src: SourceKey) -> list[Event]:
    """Every event of the source group (through its group indices in each life), plus the
    lives' starts, ends and checkpoints."""
    out, gis = [], set()
    for e in events:
        life = int(e.fields.get("life", 0))
        if e.kind == ev.TAKEN and (e.fields.get("source_index"), e.fields.get("epoch", 0)) == src:
            gis.add((life, e["group_index"]))
        if (
            e.kind in (ev.LIFE_START, ev.LIFE_END, ev.CHECKPOINT_SAVED, ev.CHECKPOINT_LOADED)
            or (life, e.fields.get("group_index")) in gis
            or any((life, g) in gis for g in e.fields.get("group_indices") or ())
        ):
            out.append(e)
    return out


@invariant("resume_exactly_once", applies_to_trace=lambda events: has_lives(events))
def check_resume_exactly_once(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name = "resume_exactly_once"
    report = resume_report(events, config)
    if report is None:
        return []
    out = []
    for src, where in sorted(report.duplicated.items()):
        out.append(
            Violation(
                invariant=name,
                message=f"source group {src[0]} (epoch {src[1]}) trained {len(where)} "
                f"times in the kept history: (life, rollout_id) {where}",
                events=_slice(events, src),
            )
        )
    for g in report.lost:
        out.append(
            Violation(
                invariant=name,
                message=(
                    f"source group {g.source[0]} (epoch {g.source[1]}) below the final cursor {report.final_cursor} was never "
                    f"trained: lost in life {g.life} ({g.mechanism} when the checkpoint's cursor was saved, {g.state_at_stop} "
                    f"at the stop)"
                ),
                events=_slice(events, g.source),
            )
        )
    return out


@invariant("resume_rollout_once", applies_to_trace=lambda events: has_lives(events))
def check_resume_rollout_once(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name = "resume_rollout_once"
    if not has_lives(events):
        return []
    lives = [_Life(i, evs, config) for i, evs in enumerate(split_lives(events))]
    out: list[Violation] = []
    saved: dict[tuple[int, int], Event] = {}  # (life, rollout_id) -> its model checkpoint
    for life in lives:
        for e in life.events:
            if e.kind == ev.CHECKPOINT_SAVED and e["part"] == "model":
                saved[(life.number, e["rollout_id"])] = e
    seen: dict[int, int] = {}
    for rid, _, lf in _kept(lives):
        if rid in seen:
            ctx = [
                e
                for e in events
                if e.kind in (ev.LIFE_START, ev.LIFE_END, ev.CHECKPOINT_LOADED)
                or (e.kind == ev.TRAINED and e["rollout_id"] == rid)
            ]
            out.append(
                Violation(
                    invariant=name,
                    message=f"rollout_id {rid} trained in life {seen[rid]} (kept in the "
                    f"checkpoint) and again in life {lf}",
                    events=ctx,
                )
            )
        seen[rid] = lf
    for life in lives[1:]:
        out += _continuation(name, life, saved)
    return out


def _continuation(name: str, life: _Life, saved: dict[tuple[int, int], Event]) -> list[Violation]:
    """The life starts after its checkpoint, and its first step continues the checkpoint's steps."""
    if life.start is None or life.loaded_model is None:
        return []
    rid = life.loaded_model["rollout_id"]
    ckpt = next((e for (lf, r), e in sorted(saved.items(), reverse=True) if r == rid and lf < life.number), None)
    out, ctx = [], [e for e in (life.start, life.loaded_model, ckpt) if e is not None]
    if life.start["start_rollout_id"] != rid + 1:
        out.append(
            Violation(
                invariant=name,
                message=f"life {life.number} starts at rollout {life.start['start_rollout_id']}"
                f", its checkpoint is rollout {rid}: expected {rid + 1}",
                events=ctx,
            )
        )
    if ckpt is not None and life.trained:
        first = life.trained[0][2]
        for key in ("optimizer_step", "lr_step"):
            want, got = ckpt.fields.get(key), first.fields.get(key)
            if want is not None and got is not None and got != want:
                out.append(
                    Violation(
                        invariant=name,
                        message=f"life {life.number}'s first step has {key} {got}; the "
                        f"checkpoint of rollout {rid} saved {want}",
                        events=ctx + [first],
                    )
                )
    return out


@invariant("resume_versions", applies_to_trace=lambda events: has_lives(events))
def check_resume_versions(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """At most one violation per life and problem: the first event that shows it."""
    name = "resume_versions"
    if not has_lives(events):
        return []
    out: list[Violation] = []
    served: dict[tuple[int, int], int] = {}  # (life, rollout_id of a model save) -> version served then
    for number, evs in enumerate(split_lives(events)):
        out += _life_versions(name, number, evs, served)
    return out


def _life_versions(name: str, number: int, evs: list[Event], served: dict[tuple[int, int], int]) -> list[Violation]:
    """One life's version problems, each reported at its first event; records the version
    served at each of its model saves in ``served``."""
    found: dict[str, Violation] = {}
    current, loaded, first_seen = 0, None, False

    def report(problem: str, message: str, pos: int) -> None:
        found.setdefault(problem, Violation(invariant=name, message=message, events=evs[max(0, pos - 8) : pos + 1]))

    for pos, e in enumerate(evs):
        k = e.kind
        if k == ev.LIFE_START:
            loaded = e["loaded_version"]
            floor = _served_at_save(served, number, evs)
            if loaded is not None and floor is not None and loaded < floor:
                report(
                    "floor",
                    f"life {number} loads version {loaded}, below the version {floor} served when "
                    "its checkpoint was saved",
                    pos,
                )
        elif k == ev.ENGINE_VERSION:
            v = e["version"]
            if loaded is not None and not first_seen and v != loaded:
                report(
                    "first",
                    f"life {number}'s engines first serve version {v}; the checkpoint's weights are version {loaded}",
                    pos,
                )
            elif loaded is not None and v < loaded:
                report("below", f"life {number} serves version {v}, below its checkpoint's {loaded}", pos)
            first_seen, current = True, v
        elif k == ev.CHECKPOINT_SAVED and e["part"] == "model":
            served[(number, e["rollout_id"])] = current
        elif k == ev.TRAINED and loaded is not None and e["trainer_version"] < loaded:
            report(
                "age",
                f"life {number} trains rollout {e['rollout_id']} with trainer version "
                f"{e['trainer_version']}, below the checkpoint's {loaded}: sample ages are measured "
                "against the wrong version",
                pos,
            )
    return list(found.values())


def _served_at_save(served: dict[tuple[int, int], int], number: int, evs: list[Event]) -> int | None:
    loaded = next((e for e in evs if e.kind == ev.CHECKPOINT_LOADED and e["part"] == "model"), None)
    if loaded is None:
        return None
    found = [v for (lf, rid), v in served.items() if rid == loaded["rollout_id"] and lf < number]
    return found[-1] if found else None
