"""Which function or class each recording wrapper calls: the user's own (named by the
recorder's setting) or upstream's default.

A user who had, say, ``--custom-generate-function-path my_pkg.agent.generate`` keeps it:
the Miles flag now names the recorder, and the recorder is told the original by
``MILES_HARNESS_RECORD_INNER_GENERATE=my_pkg.agent.generate`` or by a JSON file named
by ``MILES_HARNESS_RECORD_CONFIG``: ``{"inner": {"generate": "my_pkg.agent.generate"}}``.
A path is upstream's ``load_function`` form (``pkg.module.attr``; ``pkg.module:attr``
is accepted too). The environment wins over the file.
"""

from __future__ import annotations

import json
import os
from typing import Any

from miles_async_core.errors import ConfigError

CONFIG_ENV = "MILES_HARNESS_RECORD_CONFIG"
INNER_ENV = "MILES_HARNESS_RECORD_INNER_"

# recorder name -> (the Miles flag it goes in through, upstream's default when none is set)
EXTENSION_POINTS: dict[str, tuple[str, str | None]] = {
    "generate": ("--custom-generate-function-path", "miles.rollout.generate_hub.single_turn.generate"),
    "buffer": ("--custom-async-data-buffer-path", "miles.rollout.fully_async_data_buffer.DefaultDataBuffer"),
    "data_source": ("--data-source-path", "miles.rollout.data_source.RolloutDataSourceWithBuffer"),
    "rollout": (
        "--rollout-function-path",
        "miles.rollout.inference_rollout.inference_rollout_common.InferenceRolloutFn",
    ),
    "filter": ("--dynamic-sampling-filter-path", None),  # none: every group is kept
    "convert": ("--custom-convert-samples-to-train-data-path", None),  # none: upstream's conversion
    "log": ("--custom-rollout-log-function-path", None),  # none: upstream's logging runs
    "post_write": ("--custom-update-weight-post-write-path", None),  # none: nothing to publish
}


# the recorder's own wrappers (harness.record.RECORDER_FLAGS): never an inner
RECORDER_PATHS = {
    "harness.record." + n
    for n in (
        "generate",
        "RecordingDataBuffer",
        "RecordingDataSource",
        "RecordingRolloutFn",
        "dynamic_filter",
        "log_rollout_data",
        "convert_samples_to_train_data",
        "post_write",
    )
}


def _config_file() -> dict[str, str]:
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{CONFIG_ENV}={path}: cannot read it as JSON ({exc}). Allowed: "
            '{"inner": {"generate": "pkg.module.fn", ...}}. Fix: correct the file or unset it'
        ) from None
    inner = doc.get("inner", {}) if isinstance(doc, dict) else None
    if (
        not isinstance(inner, dict)
        or set(inner) - set(EXTENSION_POINTS)
        or not all(isinstance(v, str) for v in inner.values())
    ):
        raise ConfigError(
            f'{CONFIG_ENV}={path}: "inner" must map names in {sorted(EXTENSION_POINTS)} to '
            f"import paths; got {str(inner)[:120]!r}. Fix: correct the names"
        )
    return inner


def inner_path(name: str) -> str | None:
    """The user's original for extension point ``name``, or None (upstream's default)."""
    if name not in EXTENSION_POINTS:
        raise ConfigError(f"unknown extension point {name!r}; allowed: {sorted(EXTENSION_POINTS)}")
    value = os.environ.get(INNER_ENV + name.upper()) or _config_file().get(name)
    if not value:
        return None
    return value.replace(":", ".")


def load_inner(name: str) -> Any:
    """The object the user named for ``name`` (loaded as upstream's ``load_function``
    loads a flag's value), or upstream's default for it, or None when upstream has none."""
    from miles.utils.misc import load_function

    path = inner_path(name) or EXTENSION_POINTS[name][1]
    if path is None:
        return None
    if path in RECORDER_PATHS:
        flag = EXTENSION_POINTS[name][0]
        raise ConfigError(
            f"{INNER_ENV}{name.upper()}={path}: the recorder would call itself. Allowed: the function "
            f"or class {flag} named before the recorder was added. Fix: set that path"
        )
    try:
        return load_function(path)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{INNER_ENV}{name.upper()}={path}: cannot load it ({exc}). Allowed: an importable "
            "pkg.module.attr. Fix: correct the path or put its package on PYTHONPATH"
        ) from None
