"""The shapes of the Miles objects the recorder reads, as Protocols.

Miles is not a dependency of the harness (the recorder imports it only inside the Miles
process it records), so its classes cannot annotate the wrappers. These Protocols name
the attributes the wrappers read, with the types upstream declares (pinned tree:
``miles/utils/types.py`` ``Sample``, ``miles/rollout/base_types.py`` the rollout and
generate inputs and outputs, ``miles/rollout/fully_async_data_buffer.py`` the buffer's).
Everything a wrapper only hands on to the inner function is typed ``object``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class Sample(Protocol):
    """``miles.utils.types.Sample``: the fields the wrappers read."""

    index: int | None
    group_index: int | None
    status: object  # Sample.Status, an Enum of strings
    response_length: int
    weight_versions: list[str]
    tokens: list[int]
    rollout_log_probs: list[float] | None
    reward: object  # float | dict | None


# a group as the rollout passes it: samples, or (multi-sample generate) lists of them
Group = Sequence["Sample | list[Sample]"]


class GenerateFnInput(Protocol):
    sample: Sample
    evaluation: bool


class GenerateFnOutput(Protocol):
    samples: Sample | list[Sample]


class RolloutFnInput(Protocol):
    """``RolloutFnTrainInput`` (``evaluation`` False) or ``RolloutFnEvalInput``."""

    rollout_id: int
    weight_version: int | None
    evaluation: bool


class RolloutFnOutput(Protocol):
    samples: list[list[Sample]]


class DataBufferConstructorInput(Protocol):
    args: object  # Miles' argparse.Namespace
    unused_handler_fn: Callable[[list[Sample]], None]


class DataBufferInput(Protocol):
    prompt_group: list[Sample]
    group: Group
