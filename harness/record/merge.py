"""Merge a record directory into one trace, and check it.

Each process file (``harness.record.writer``) is read whole; a last line cut short by a
killed process is dropped and reported (``truncated``), anything else malformed is an
error naming the file and line. Clocks: within a process the events keep their
``time.monotonic()`` order; across processes each file's monotonic clock is mapped onto
the wall clock by its own offset (the median of ``wall - mono`` over its lines), and the
merged trace's ``t`` is seconds since the first event.

Server files (role ``server-N``: the CPU server's own trace, ``harness.record.served_run``)
bring the engine's events. Their request indices are the server's; each request is
joined to the Miles sample whose ``generate_call`` it answered: exactly when both carry
``tokens_digest`` (the request's prompt and output ids; the sample's tokens after the
call) and they are equal (``exact`` counts these). Otherwise, and among samples with
equal tokens: same server-reported ``weight_version``, same number of tokens, same
status, the request inside the call's time window; of several such calls, the one that
ends soonest after the request ends (the answer reaches its caller at once;
``ambiguous`` counts requests left with more than one candidate). Requests that answer
no recorded call (health checks, calls cancelled at the run's end) are left out and
counted. With several servers each server's events carry ``engine`` (its number), its
loads become ``engine_loaded``, and the update counts as done (``engine_version``) when
the last server has loaded it. Without server files, ``generate_call`` events become
``submitted`` / ``finished`` with the versions Miles recorded (no per-token versions:
the checkers that need them are not applicable).

Lives: a run killed and started again with ``--load`` into the same directory has one
rollout-role process per life (``split_lives``); each life is merged alone (its requests
joined to its own calls), its events carry ``life`` between a ``life_start`` and a
``life_end``, and ``verdict`` runs each single-run checker on each life and the resume
checkers across them. A directory with one rollout process merges as before, with no
life fields.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from miles_async_core import events as ev
from miles_async_core.errors import ConfigError

from harness.trace import Event
from harness.typing_aliases import JSONDict, JSONValue

from .lines import Call, CallKey, Line, Request
from .wrappers import GENERATE_BEGIN, GENERATE_CALL
from .writer import PROCESS

if TYPE_CHECKING:
    from harness.checking.invariants.base import Violation
    from miles_async_core.config import AsyncConfig

MERGED_NAME = "merged.jsonl"
JOIN_SLACK_S = 0.05  # clock slack of the request-in-call window (processes on one host share the clock)

# the event kinds each checker reads; a checker whose kinds are absent is not applicable
REQUIRES: dict[str, tuple[str, ...]] = {
    "no_generation_while_paused": (ev.ENGINE_PAUSE, ev.ADMITTED),
    "abort_semantics": (ev.ENGINE_PAUSE, ev.SUBMITTED, ev.FINISHED),
    "kv_versions": (ev.DECODE_STEP, ev.FINISHED),
    "token_versions": (ev.DECODE_STEP, ev.SUBMITTED, ev.FINISHED, ev.ENGINE_VERSION),
    "version_steps": (ev.ENGINE_VERSION, ev.SET_WEIGHT_VERSION),
    "update_outside_generate": (ev.ENGINE_VERSION, ev.GENERATE_START),
    "engine_versions_monotonic": (ev.ENGINE_LOADED,),
    "all_engines_updated_before_resume": (ev.ENGINE_LOADED, ev.ENGINE_RESUME),
    "all_engines_paused_for_update": (ev.ENGINE_LOADED, ev.ENGINE_PAUSE),
    "buffer_capacity": (ev.PUT_ACCEPTED, ev.GOT),
    "buffer_fifo": (ev.PUT_ACCEPTED, ev.GOT),
    "aborted_never_stored": (ev.PUT_ACCEPTED, ev.GOT),
    "filter_rejects_not_handled": (ev.PUT_ACCEPTED, ev.GOT),
    "stale_rejects_handled": (ev.PUT_ACCEPTED, ev.GOT),
    "drain_shape": (ev.DRAIN_START, ev.GOT, ev.DRAIN_END),
    "drain_metrics": (ev.DRAIN_END, ev.METRICS, ev.PUT_ACCEPTED),
    "in_flight_cap": (ev.SUBMITTED, ev.GROUP_DONE),
    "whole_group_submission": (ev.TAKEN, ev.SUBMITTED),
    "one_step_submission_budget": (ev.GENERATE_START, ev.TAKEN, ev.GROUP_DONE),
    "one_group_per_pull": (ev.TAKEN,),
    "conservation": (ev.TAKEN, ev.TRAINED, ev.RUN_END),
    "conservation_prefix": (ev.TAKEN, ev.TRAINED),
    "recycled_first_in_first_out": (ev.TAKEN,),
    "trained_batch_shape": (ev.TRAINED,),
    "got_staleness": (ev.GOT, ev.FINISHED),
    "trained_age_bound": (ev.TRAINED, ev.FINISHED),
    "batch_single_version": (ev.TRAINED, ev.FINISHED),
    "colocate_exclusive": (ev.PHASE_START,),
    "colocate_no_decode_while_training": (ev.PHASE_START, ev.DECODE_STEP),
    "one_step_overlap": (ev.GENERATE_START, ev.TRAINED),
    "no_idle_slot": (ev.TAKEN, ev.GROUP_DONE, ev.PUT_ACCEPTED),
    "dead_worker_surfaces": (ev.GROUP_DONE, ev.DRAIN_START, ev.GOT),
    "resume_exactly_once": (ev.LIFE_START, ev.TAKEN, ev.TRAINED),
    "resume_rollout_once": (ev.LIFE_START, ev.TRAINED),
    "resume_versions": (ev.LIFE_START, ev.ENGINE_VERSION),
}

# checkers that read an event in a sense a record does not have, with what the record lacks:
# a recorded ``trained`` is written by ``log_rollout_data`` while the rollout manager finishes
# rollout N's generate call, and ``train_async.py`` launches generate(N+1) only after it has
# that batch (the ``await rollout_data_next_future`` before the next ``generate.remote``), so
# in a record ``trained`` always precedes generate(N+1): the order says nothing about whether
# the trainer's step overlapped the next rollout
NOT_IN_A_RECORD: dict[str, list[str]] = {
    "one_step_overlap": ["train-start (a recorded trained is the batch handed over, not the trainer's step)"],
    # the checker reads a group_done as the moment the group's task ended; the recorder writes a
    # fully-async group_done at the group's put (RecordingDataBuffer.put), so two groups one wait of
    # the worker returned read as one finishing after the other's put: a slot idle that was not
    "no_idle_slot": [
        "the end of each fully-async group (a recorded group_done is the group's put: which groups "
        "finished in one wait of the worker is not recorded)"
    ],
}


@dataclass
class ProcessFile:
    path: Path
    header: Line  # the identity line (pid, role, host, argv)
    lines: list[Line]
    truncated: bool = False
    offset: float = 0.0  # wall - mono

    @property
    def role(self) -> str:
        return str(self.header.fields.get("role", "?"))


class ProcessSummary(TypedDict):
    """One merged process file, as ``check-trace --merge`` lists it."""

    file: str
    role: str
    pid: int | None
    host: str | None
    events: int
    truncated: bool  # its last line was cut short and dropped
    life: NotRequired[int]  # with lives only


def _summary(pf: ProcessFile, life: int | None) -> ProcessSummary:
    out: ProcessSummary = {
        "file": pf.path.name,
        "role": pf.role,
        "pid": pf.header.get_optional_int("pid"),
        "host": pf.header.get_optional_str("host"),
        "events": len(pf.lines),
        "truncated": pf.truncated,
    }
    if life is not None:
        out["life"] = life
    return out


@dataclass
class Merged:
    events: list[Event]
    processes: list[ProcessSummary]
    truncated: list[str] = field(default_factory=list)
    join: dict[str, int] = field(default_factory=dict)
    bytes_total: int = 0


# (time on the merged clock, position in its process file, kind, fields): a process's events
_Row = tuple[float, int, str, JSONDict]
# (time on the merged clock, kind, fields): a life's events in order
_LifeRow = tuple[float, str, JSONDict]


def read_process_file(path: Path, *, incomplete: bool) -> ProcessFile | None:
    """One process's file, or None when ``path`` is not one (no identity line)."""
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    rows = text.split("\n")
    cut = rows[-1] != ""  # a file a live writer left whole ends with a newline
    docs: list[Line] = []
    truncated = False
    for n, row in enumerate(rows, start=1):
        if not row.strip():
            continue
        try:
            doc: JSONValue = json.loads(row)
        except json.JSONDecodeError:
            last = n == len(rows) if cut else n == len(rows) - 1
            if last:
                truncated = True
                continue
            raise ConfigError(
                f"record {path}, line {n}: not JSON: {row[:80]!r}. Allowed: one JSON event per line as "
                "harness.record writes; only a last line cut short is tolerated. Fix: remove the "
                "line or pass the files as the run left them"
            ) from None
        line = Line.parse(doc, path, n)
        if line is None:
            raise ConfigError(
                f"record {path}, line {n}: {row[:80]!r} lacks a string kind or a numeric mono/wall. "
                "Allowed: harness.record's event lines. Fix: remove the line"
            )
        docs.append(line)
    if not docs or docs[0].kind != PROCESS:
        return None
    if truncated and not incomplete:
        raise ConfigError(
            f"record {path}: the last line is cut short (the process was killed while writing it). "
            "Allowed with --incomplete, which drops that line and checks what holds on a prefix. "
            f"Fix: miles-harness check-trace --merge {path.parent} --incomplete"
        )
    pf = ProcessFile(path, docs[0], docs[1:], truncated)
    pf.offset = statistics.median(d.wall - d.mono for d in docs)
    return pf


def read_dir(directory: Path, *, incomplete: bool) -> list[ProcessFile]:
    if not directory.is_dir():
        raise ConfigError(
            f"--merge {directory}: not a directory. Allowed: the directory MILES_HARNESS_RECORD_DIR "
            "named in the run. Fix: pass that directory"
        )
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        if path.name == MERGED_NAME:
            continue
        pf = read_process_file(path, incomplete=incomplete)
        if pf is not None:
            out.append(pf)
    if not out:
        raise ConfigError(
            f"--merge {directory}: no process files (*.jsonl starting with a process line). Allowed: "
            "the files harness.record writes. Fix: check that MILES_HARNESS_RECORD_DIR pointed here "
            "and that the recorder flags were on the Miles command line"
        )
    return out


_FRAMEWORK_SKIP = {PROCESS, GENERATE_CALL, "train_data", "weights_written"}


def _calls(files: list[ProcessFile]) -> list[Call]:
    return [
        Call.parse(d, pf.offset)
        for pf in files
        for d in pf.lines
        if d.kind == GENERATE_CALL and not d.fields.get("evaluation")
    ]


def _requests(server: ProcessFile, number: int) -> list[Request]:
    """The requests ``server`` finished: its index, submission and end on the merged clock."""
    submitted: dict[int, float] = {}
    out = []
    for d in server.lines:
        if d.kind == ev.SUBMITTED:
            submitted[d.get_int("index")] = d.mono + server.offset
        elif d.kind == ev.FINISHED and d.fields.get("index") in submitted:
            out.append(Request.parse(d, number, submitted[d.get_int("index")], server.offset))
    return out


def _fits(call: Call, req: Request) -> bool:
    """Same tokens added, status and reported version; the request inside the call's window."""
    return (
        call.added_tokens == req.response_length
        and call.status == req.status
        and call.added_versions == req.weight_versions
        and call.t0 <= req.t_sub + JOIN_SLACK_S
        and call.t1 >= req.t - JOIN_SLACK_S
    )


def _nearest(found: list[Call], t: float) -> Call:
    # the answer reaches the caller just after the server finishes it: the call that
    # ends soonest after the request's end (one ending before it, within the slack, last)
    return min(found, key=lambda c: (c.t1 < t, abs(c.t1 - t)))


def _join(servers: list[ProcessFile], calls: list[Call], stats: dict[str, int]) -> list[dict[int, Call]]:
    """Per server, request index -> the ``generate_call`` it answered. Exact first: the
    request's ``tokens_digest`` (prompt and output ids) equals the call's (the sample's
    tokens after it); several calls with the same digest (samples of one prompt with the
    same output) are told apart by ``_fits`` and timing. Then, for requests or calls
    without a digest (a server that records none, a generate function that is not
    single-turn), ``_fits`` and ``_nearest``, taking requests in the order they ended on
    every server together (a request must not take the call of another server's request
    that ended before it)."""
    requests = sorted((r for n, pf in enumerate(servers) for r in _requests(pf, n)), key=lambda r: r.t)
    by_digest: dict[str, list[Call]] = {}
    for c in calls:
        if c.tokens_digest:
            by_digest.setdefault(c.tokens_digest, []).append(c)
    mappings: list[dict[int, Call]] = [{} for _ in servers]

    def take(call: Call, req: Request) -> None:
        call.server = req.server
        mappings[req.server][req.index] = call
        stats["joined"] += 1

    rest = []
    for req in requests:
        digest = req.tokens_digest
        found = [c for c in by_digest.get(digest, ()) if c.server is None] if digest else []
        if not found:
            rest.append(req)
            continue
        if len(found) > 1:
            found = [c for c in found if _fits(c, req)] or found
            stats["ambiguous"] += len(found) > 1
        take(_nearest(found, req.t), req)
        stats["exact"] += 1
    for req in rest:
        digest = req.tokens_digest
        found = [
            c for c in calls if c.server is None and _fits(c, req) and not (digest and c.tokens_digest)
        ]  # two digests that differ: not this call
        if not found:
            stats["server_requests_unjoined"] += 1
            continue
        stats["ambiguous"] += len(found) > 1
        take(_nearest(found, req.t), req)
    return mappings


def _server_events(server: ProcessFile, number: int, multi: bool, mapping: dict[int, Call]) -> list[_Row]:
    out = []
    for n, d in enumerate(server.lines):
        kind = d.kind
        fields = dict(d.fields)
        if kind in (ev.TAKEN, ev.GROUP_DONE, ev.SUBMITTED):
            # the server's own one-request groups, and its arrival order: Miles' groups and
            # its submissions (the generate function's call) come from the recorder
            continue
        if "index" in fields:
            call = mapping.get(d.get_int("index"))
            if call is None:
                continue
            fields["index"] = call.index
            if "group_index" in fields:
                fields["group_index"] = call.group_index
            if kind == ev.FINISHED:  # what Miles' sample holds after this call
                fields["weight_versions"] = list(call.weight_versions)
        if "indices" in fields:
            fields["indices"] = [mapping[i].index for i in d.get_list("indices") if isinstance(i, int) and i in mapping]
            if not fields["indices"]:
                continue
        if multi:
            fields["engine"] = number
            if kind == ev.ENGINE_VERSION:
                kind = ev.ENGINE_LOADED
        out.append((d.mono + server.offset, n, kind, fields))
    return out


def _loads_complete(rows: list[_Row], servers: int) -> list[_Row]:
    """The update to version v is in force when the last server has loaded it (``rows``:
    the servers' events, each loaded version with the ``engine`` that loaded it)."""
    loaded: dict[JSONValue, set[JSONValue]] = {}
    out: list[_Row] = []
    for t, n, kind, fields in sorted(rows, key=lambda r: r[0]):
        if kind == ev.ENGINE_LOADED:
            have = loaded.setdefault(fields["version"], set())
            have.add(fields["engine"])
            if len(have) == servers:
                out.append((t, n, ev.ENGINE_VERSION, {"version": fields["version"]}))
    return out


def _framework_events(pf: ProcessFile, joined: dict[CallKey, int], multi: bool) -> list[_Row]:
    """``pf``'s events; a ``generate_call`` in ``joined`` (its key -> the number of the
    server whose request answered it) has its ``finished`` from that server's events."""
    out: list[_Row] = []
    pending_drain: list[JSONDict] = []
    begins: dict[CallKey, JSONDict] = {}  # a call's submission, by (index, start)
    for n, d in enumerate(pf.lines):
        kind = d.kind
        fields = dict(d.fields)
        t = d.mono + pf.offset
        if kind == GENERATE_BEGIN:
            sub: JSONDict = {
                "index": d.fields.get("index"),
                "group_index": d.fields.get("group_index"),
                "version": None,
            }
            begins[(d.get_optional_int("index"), d.mono)] = sub
            out.append((t, n, ev.SUBMITTED, sub))
            continue
        if kind == GENERATE_CALL:
            if d.fields.get("evaluation"):
                continue
            call = Call.parse(d, pf.offset)
            submission = begins.get(call.key)
            if submission is not None and multi and call.key in joined:
                # the request's engine, as a submission to one of several engines carries
                submission["engine"] = joined[call.key]
            if call.key in joined:
                continue  # the server's events of this request stand for it
            out.append(
                (
                    t,
                    n,
                    ev.FINISHED,
                    {
                        "index": call.index,
                        "group_index": call.group_index,
                        "status": call.status,
                        "response_length": call.response_length,
                        "token_versions": [],
                        "weight_versions": call.weight_versions,
                    },
                )
            )
            continue
        if kind in _FRAMEWORK_SKIP or kind not in ev.EVENT_FIELDS:
            continue
        if kind in (ev.DRAIN_START, ev.DRAIN_END, ev.METRICS) and fields.get("rollout_id") is None:
            pending_drain.append(fields)  # the buffer does not know the rollout id: its batch's log does
        elif kind == ev.TRAINED:
            for start in pending_drain:
                start["rollout_id"] = fields["rollout_id"]
            pending_drain = []
        out.append((t, n, kind, fields))
    return out


def merge_dir(directory: str | Path, *, incomplete: bool = False) -> Merged:
    directory = Path(directory)
    files = read_dir(directory, incomplete=incomplete)
    stats = {"joined": 0, "exact": 0, "ambiguous": 0, "server_requests_unjoined": 0, "calls_unjoined": 0}
    lives = split_lives(files)
    if len(lives) == 1:
        rows = _merge_life(files, stats)
    else:
        rows = []
        saved: dict[JSONValue, JSONValue] = {}  # model checkpoint rollout -> the version its weights were served as
        for number, life_files in enumerate(lives):
            rows += _life_rows(
                number, _merge_life(life_files, stats), last=number == len(lives) - 1, files=life_files, saved=saved
            )
    t_first = rows[0][0] if rows else 0.0
    events = [Event(seq, t - t_first, kind, fields) for seq, (t, kind, fields) in enumerate(rows)]
    life_of = {id(pf): n for n, life in enumerate(lives) for pf in life} if len(lives) > 1 else {}
    procs = [_summary(pf, life_of.get(id(pf))) for pf in files]
    return Merged(
        events=events,
        processes=procs,
        truncated=[pf.path.name for pf in files if pf.truncated],
        join=stats,
        bytes_total=sum(pf.path.stat().st_size for pf in files),
    )


def _span(pf: ProcessFile) -> tuple[float, float]:
    """A process's first and last moment on the wall clock (its identity line included)."""
    monos = [pf.header.mono, *(d.mono for d in pf.lines)]
    return min(monos) + pf.offset, max(monos) + pf.offset


def split_lives(files: list[ProcessFile]) -> list[list[ProcessFile]]:
    """The lives of a run that was stopped and started again with ``--load`` into the same
    record directory: each rollout-role process (the rollout manager's) is one life, in
    the order they started. A life ends before the next starts, so every other process
    (servers, training ranks) belongs to the life whose predecessors' rollout processes
    had all ended when it started. One rollout process (or none): one life."""
    rollout = sorted((pf for pf in files if pf.role == "rollout"), key=lambda pf: _span(pf)[0])
    if len(rollout) <= 1:
        return [files]
    ends = [_span(pf)[1] for pf in rollout]
    lives: list[list[ProcessFile]] = [[] for _ in rollout]
    for pf in files:
        first = _span(pf)[0]
        number = len(rollout) - 1 if pf.role != "rollout" else rollout.index(pf)
        if pf.role != "rollout":
            number = sum(1 for end in ends if end < first)
        lives[min(number, len(rollout) - 1)].append(pf)
    return lives


def _life_rows(
    number: int,
    rows: list[_LifeRow],
    *,
    last: bool,
    files: list[ProcessFile],
    saved: dict[JSONValue, JSONValue],
) -> list[_LifeRow]:
    """One life's events with ``life``, opened by ``life_start`` (``start_rollout_id``: the
    loaded model checkpoint's rollout + 1, as Megatron resumes, else 0; ``loaded_version``:
    the version an earlier life recorded for that checkpoint's weights when it saved them
    (a ``checkpoint_saved`` of the model part; a Megatron trainer's save is not recorded:
    ``None``)) and closed by ``life_end``: a life followed by another
    ended with its process (``crash``: the record cannot tell a kill from a planned exit);
    the last one ``completed`` unless its record was cut short mid-line (``crash``)."""
    loaded = next((f["rollout_id"] for _, k, f in rows if k == ev.CHECKPOINT_LOADED and f["part"] == "model"), None)
    if loaded is not None and not isinstance(loaded, int):
        raise ConfigError(
            f"record: a model checkpoint_loaded has rollout_id {loaded!r}. Allowed: an integer, as "
            "harness.record writes it. Fix: remove the line or record the run again"
        )
    t0 = rows[0][0] if rows else 0.0
    t1 = rows[-1][0] if rows else 0.0
    start: JSONDict = {
        "life": number,
        "start_rollout_id": 0 if loaded is None else loaded + 1,
        "loaded_version": saved.get(loaded) if loaded is not None else None,
    }
    for _, k, f in rows:
        if k == ev.CHECKPOINT_SAVED and f["part"] == "model" and f.get("version") is not None:
            saved[f["rollout_id"]] = f["version"]
    cut = any(pf.truncated for pf in files)
    how = "completed" if last and not cut else "crash"
    at = "" if how == "completed" else ("process killed mid-line" if cut else "the process's record ends")
    return [
        (t0, ev.LIFE_START, start),
        *((t, k, {**f, "life": number}) for t, k, f in rows),
        (t1, ev.LIFE_END, {"life": number, "how": how, "at": at}),
    ]


def _merge_life(files: list[ProcessFile], stats: dict[str, int]) -> list[_LifeRow]:
    """One life's process files merged: (wall time, kind, fields), in order."""
    servers = [pf for pf in files if pf.role.startswith("server")]
    framework = [pf for pf in files if not pf.role.startswith("server")]
    calls = _calls(framework)
    rows: list[tuple[float, int, int, str, JSONDict]] = []  # (t, process, line, kind, fields)
    multi = len(servers) > 1
    server_rows: list[_Row] = []
    for number, (pf, mapping) in enumerate(zip(servers, _join(servers, calls, stats))):
        server_rows += _server_events(pf, number, multi, mapping)
    if multi:
        server_rows += _loads_complete(server_rows, len(servers))
    joined = {c.key: c.server for c in calls if c.server is not None}
    stats["calls_unjoined"] += sum(1 for c in calls if c.server is None) if servers else 0
    for order, pf in enumerate(framework):
        rows += [(t, order, n, k, f) for t, n, k, f in _framework_events(pf, joined, multi)]
    rows += [(t, len(framework) + 1, n, k, f) for t, n, k, f in server_rows]
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    out: list[_LifeRow] = []
    engine: JSONValue = 0
    for t, _, _, kind, fields in rows:
        if kind == ev.ENGINE_VERSION:
            engine = fields["version"]
        if kind == ev.SUBMITTED and fields.get("version") is None:
            fields["version"] = engine  # the update in force at submission (no server file)
        if kind == ev.TRAINED and servers:
            # the trainer trains on the weights the engines last loaded (train_async updates after
            # each step); the version the rollout passed along is kept as manager_version
            fields["manager_version"], fields["trainer_version"] = fields["trainer_version"], engine
        out.append((t, kind, fields))
    return out


class LivesSkipped(TypedDict):
    lives: list[int]  # the lives a checker could not run on
    lacking: list[str]  # the event kinds they lack


class Verdict(TypedDict):
    """``verdict``'s answer: violations by checker, the checkers that could not run and why."""

    ran: dict[str, int]  # checker -> violations found
    violations: dict[str, list[Violation]]
    lacking: dict[str, list[str]]  # checker -> the event kinds the trace lacks
    not_for_config: list[str]
    passed: bool
    lives: NotRequired[int]  # with lives only
    not_run_on_lives: NotRequired[dict[str, LivesSkipped]]


def verdict(merged: Merged, config: AsyncConfig, *, complete: bool) -> Verdict:
    """Every checker that applies to ``config``: run when the kinds it reads are in the
    merged trace, else listed as not applicable with the kinds it lacks. With lives, a
    checker of one run (its group indices restart from the restored cursor in each life)
    runs on each life alone, an earlier life as the prefix of a stopped run, and the
    resume checkers (``Check.applies_to_trace``) run on the whole trace."""
    from harness.checking.invariants import ALL_CHECKS, applicable
    from harness.checking.invariants import resume  # noqa: F401  (registers the resume checkers)

    ran: dict[str, list[Violation]] = {}
    lacking: dict[str, list[str]] = {}
    skipped: dict[str, LivesSkipped] = {}  # with lives: checker -> the lives it could not run on, why
    lives = _by_life(merged.events) if any(e.kind == ev.LIFE_START for e in merged.events) else [merged.events]
    for check in applicable(config, complete=complete, events=merged.events):
        if check.name in NOT_IN_A_RECORD:
            lacking[check.name] = NOT_IN_A_RECORD[check.name]
            continue
        parts = (
            [(0, merged.events)]
            if len(lives) == 1 or check.applies_to_trace is not None
            else [(n, evs) for n, evs in enumerate(lives) if n == len(lives) - 1 or not check.needs_complete_run]
        )
        found: list[Violation] = []
        done = 0
        for n, evs in parts:
            present = {e.kind for e in evs}
            missing = [k for k in REQUIRES.get(check.name, ()) if k not in present]
            if missing:
                lacking.setdefault(check.name, missing)
                skip = skipped.setdefault(check.name, LivesSkipped(lives=[], lacking=missing))
                skip["lives"].append(n)
                continue
            found += check.fn(evs, _life_config(config, evs) if len(parts) > 1 or len(lives) > 1 else config)
            done += 1
        if done:
            ran[check.name] = found
            lacking.pop(check.name, None)
    off = [name for name in ALL_CHECKS if name not in ran and name not in lacking]
    out: Verdict = {
        "ran": {k: len(v) for k, v in ran.items()},
        "violations": ran,
        "lacking": lacking,
        "not_for_config": off,
        "passed": not any(ran.values()),
    }
    if len(lives) > 1:
        out["lives"] = len(lives)
        out["not_run_on_lives"] = {k: v for k, v in skipped.items() if k in ran}
    return out


def _life_config(config: AsyncConfig, events: list[Event]) -> AsyncConfig:
    """The config one life ran under: its ``start_rollout_id`` is where it started."""
    start = next((e for e in events if e.kind == ev.LIFE_START), None)
    if start is None or start.fields.get("start_rollout_id") is None or events is None:
        return config
    return type(config).from_dict({**config.to_dict(), "start_rollout_id": int(start["start_rollout_id"])})


def _by_life(events: list[Event]) -> list[list[Event]]:
    lives: dict[int, list[Event]] = {}
    for e in events:
        lives.setdefault(int(e.fields.get("life", 0)), []).append(e)
    return [lives[k] for k in sorted(lives)]
