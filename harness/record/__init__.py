"""Record a real Miles run through Miles' own extension flags, then merge and check it.

Add to a Miles command line (each flag names a recorder wrapper; the user's original, if
any, moves to the recorder's own setting, ``harness.record.chain``)::

    --custom-generate-function-path harness.record.generate
    --data-source-path harness.record.RecordingDataSource
    --dynamic-sampling-filter-path harness.record.dynamic_filter
    --custom-rollout-log-function-path harness.record.log_rollout_data
    --custom-convert-samples-to-train-data-path harness.record.convert_samples_to_train_data
    --custom-async-data-buffer-path harness.record.RecordingDataBuffer   # --fully-async
    --rollout-function-path harness.record.RecordingRolloutFn            # not with --fully-async
    --custom-update-weight-post-write-path harness.record.post_write     # disk-delta updates

and set ``MILES_HARNESS_RECORD_DIR``. ``miles-harness check-trace --merge DIR`` merges the
files and runs the checkers (``harness.record.merge``). See ``docs/record.md``.
"""

from .wrappers import (
    RecordingDataBuffer,
    RecordingDataSource,
    RecordingRolloutFn,
    convert_samples_to_train_data,
    dynamic_filter,
    generate,
    log_rollout_data,
    post_write,
)

RECORDER_FLAGS: dict[str, str] = {
    "custom_generate_function_path": "harness.record.generate",
    "data_source_path": "harness.record.RecordingDataSource",
    "dynamic_sampling_filter_path": "harness.record.dynamic_filter",
    "custom_rollout_log_function_path": "harness.record.log_rollout_data",
    "custom_convert_samples_to_train_data_path": "harness.record.convert_samples_to_train_data",
    "custom_async_data_buffer_path": "harness.record.RecordingDataBuffer",
    "rollout_function_path": "harness.record.RecordingRolloutFn",
    "custom_update_weight_post_write_path": "harness.record.post_write",
}


def recorder_flags(*, fully_async: bool) -> dict[str, str]:
    """The Miles flags (``args`` field -> value) that install the recorder; upstream
    refuses ``--rollout-function-path`` with ``--fully-async`` (``arguments.py:L57``)."""
    return {k: v for k, v in RECORDER_FLAGS.items() if not (fully_async and k == "rollout_function_path")}


__all__ = [
    "RECORDER_FLAGS",
    "RecordingDataBuffer",
    "RecordingDataSource",
    "RecordingRolloutFn",
    "convert_samples_to_train_data",
    "dynamic_filter",
    "generate",
    "log_rollout_data",
    "post_write",
    "recorder_flags",
]
