"""Sample, group and buffer-input types, with Miles' names.

Mirrors `miles/utils/types.py` and `fully_async_data_buffer.py` in radixark/miles.

Two views of a sample's age are kept side by side:

* ``weight_versions``: what Miles records, one string per generate call, taken from
  the engine's ``meta_info["weight_version"]`` when the output is emitted (completion
  time). ``oldest_weight_version`` is the minimum numeric entry, exactly as upstream.
* ``token_versions``: what really happened, per token: the engine weight version that
  sampled the token and the oldest weight version present in the KV cache it attended
  to (``kv_version``). Stored as runs of equal (version, kv_version) pairs, so a
  thousand-token response made by one version costs one run.

Invariant: ``len(token_versions) == len(response_tokens) == len(rollout_log_probs)``
for every sample a backend returns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterator


class Status(str, enum.Enum):  # noqa: UP042  (not StrEnum: str() of a member is its name, as upstream's)
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


# Speed trick, these and the core's other per-sample shortcuts: 1.301x per CPU-s (results/bench/sim_tricks_ab.json)
# for per-sample code: CPython 3.11 reads ``Status.X`` through the enum metaclass' __getattr__
PENDING, COMPLETED, TRUNCATED, ABORTED = Status.PENDING, Status.COMPLETED, Status.TRUNCATED, Status.ABORTED


def recorded_number(v: str) -> int | None:
    """A recorded version string as Miles reads it: its number, or None if not all digits."""
    return int(v) if v.isdigit() else None


class VersionRuns:
    """Per-token (version, kv_version) pairs stored as runs ``[version, kv_version, count]``."""

    __slots__ = ("runs",)

    def __init__(self, runs: list[list[int]] | None = None) -> None:
        self.runs: list[list[int]] = [list(r) for r in runs] if runs else []

    def append(self, version: int, kv_version: int, count: int = 1) -> None:
        if count <= 0:
            return
        if self.runs and self.runs[-1][0] == version and self.runs[-1][1] == kv_version:
            self.runs[-1][2] += count
        else:
            self.runs.append([version, kv_version, count])

    def __len__(self) -> int:
        return sum(r[2] for r in self.runs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VersionRuns) and self.runs == other.runs

    def __repr__(self) -> str:
        return f"VersionRuns({self.runs})"

    def versions(self) -> list[int]:
        """The weight version of every token, expanded."""
        return [r[0] for r in self.runs for _ in range(r[2])]

    def kv_versions(self) -> list[int]:
        """The oldest KV version each token attended to, expanded."""
        return [r[1] for r in self.runs for _ in range(r[2])]

    @property
    def oldest(self) -> int | None:
        runs = self.runs
        if not runs:
            return None
        lo = runs[0][0]
        for r in runs:  # a loop, not min(genexpr): a few runs per sample, many samples
            if r[0] < lo:
                lo = r[0]
        return lo

    @property
    def newest(self) -> int | None:
        runs = self.runs
        if not runs:
            return None
        hi = runs[0][0]
        for r in runs:
            if r[0] > hi:
                hi = r[0]
        return hi

    def old_kv_token_count(self) -> int:
        """Tokens sampled by newer weights on top of KV computed by older ones (in_place)."""
        runs = self.runs
        if len(runs) == 1:
            r = runs[0]
            return r[2] if r[1] < r[0] else 0
        return sum(r[2] for r in runs if r[1] < r[0])

    def to_json(self) -> list[list[int]]:
        return [list(r) for r in self.runs]


@dataclass(eq=False, slots=True)
class Sample:
    """One trajectory. ``index`` is unique per sample; ``group_index`` per prompt."""

    prompt: str = ""
    prompt_tokens: list[int] = field(default_factory=list)
    response_tokens: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    token_versions: VersionRuns = field(default_factory=VersionRuns)
    weight_versions: list[str] = field(default_factory=list)
    status: Status = Status.PENDING
    index: int = -1
    group_index: int = -1
    label: Any = None
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    retry_count: int = 0
    remove_sample: bool = False

    @property
    def response_length(self) -> int:
        return len(self.response_tokens)

    @property
    def oldest_weight_version(self) -> int | None:
        """Miles' definition (`types.py:L270-L274`): min over numeric ``weight_versions``."""
        wv = self.weight_versions
        if len(wv) == 1:  # the common single-turn case, kept cheap for long simulations
            v = wv[0]
            if type(v) is str:  # what engines record (str(v) is v)
                return recorded_number(v)
            return int(v) if str(v).isdigit() else None
        numeric = [int(v) for v in wv if str(v).isdigit()]
        return min(numeric) if numeric else None

    @property
    def oldest_token_version(self) -> int | None:
        """The true oldest policy that sampled any token of this sample."""
        return self.token_versions.oldest

    def reset_for_retry(self) -> None:
        """As upstream `Sample.reset_for_retry`: clear generation state, keep identity.

        Keeps ``index``, ``group_index``, ``prompt``, ``label`` and ``metadata``; sets
        ``status = ABORTED`` (an empty response means a fresh start). ``retry_count``
        is this harness's addition so a retry cap can be enforced.
        """
        self.response_tokens = []
        self.rollout_log_probs = []
        self.token_versions = VersionRuns()
        self.weight_versions = []
        self.reward = None
        self.remove_sample = False
        self.status = Status.ABORTED
        self.retry_count += 1


# A finished group may be nested when a generate function expands one trajectory.
Group = list[Sample] | list[list[Sample]]


def iter_samples(group: Any) -> Iterator[Sample]:
    """Flatten a nested group one level, as upstream's ``iter_samples``
    (``fully_async_data_buffer.py:L28-L33``): a list item is one trajectory whose items
    are yielded as they are; anything else is yielded itself."""
    for item in group:
        if isinstance(item, list):
            yield from item
        else:
            yield item


def samples_of(group: Any) -> list[Sample]:
    """``list(iter_samples(group))``, without a generator step per sample for the common
    flat group (this runs several times per sample in long simulations). A ``Sample`` is no
    list by its exact type; a negative ``isinstance`` looks up ``__class__`` first."""
    items = list(group)
    for item in items:
        if type(item) is not Sample and isinstance(item, list):
            break
    else:
        return items  # flat
    return [s for item in items for s in (item if isinstance(item, list) else (item,))]


def first_sample(group: Any) -> Sample:
    return next(iter_samples(group))


@dataclass
class DataBufferInput:
    """`fully_async_data_buffer.DataBufferInput`: the resubmittable flat prompt group
    and the finished group (the same objects for single-turn generation)."""

    prompt_group: list[Sample]
    group: Group


@dataclass
class DataBufferConstructorInput:
    args: Any
    unused_handler_fn: Any


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
