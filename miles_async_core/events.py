"""The typed events the core and the backends emit through an injected ``EventSink``.

Every event is ``(t, kind, fields)``; ``EVENT_FIELDS[kind]`` lists the fields an event
of that kind always carries (more may be present). The harness' trace recorder checks
this schema, so the invariant checkers can rely on it.

Identity: ``index`` is a sample, ``group_index`` a prompt group, ``rollout_id`` a
training step (drain), ``version`` an engine weight version. With several engines (the
``ray`` layout) every engine event and every request event also carries ``engine``, the
engine's index; events without it are the driver's (or a single engine's).

Lives (a run that stops and resumes from a checkpoint, ``harness.lives``): a run is
a sequence of lives; in a run with lives every event carries ``life`` (an int, 0 first)
and a trace without the field is one life (life 0). Only runs with lives add these
fields and events, so a single-life trace is unchanged.

* ``life_start``: ``life``, ``start_rollout_id`` (the first rollout this life trains:
  the loaded checkpoint's rollout id + 1, as ``megatron_utils/actor.py:L212``),
  ``loaded_version`` (the weight version the loaded checkpoint's weights carry, ``None``
  without a checkpoint).
* ``life_end``: ``life``, ``how`` (``crash``: the process is gone, only what was saved
  survives; ``planned``: ``--debug-exit-after-rollout`` or a stop after a
  ``--save-trigger-sentinel`` save; ``completed``: ``--num-rollout`` reached) and ``at``
  (the stop, e.g. ``mid_generation``, ``between_saves``; ``num_rollout`` when completed).
* ``checkpoint_saved``: ``rollout_id``, ``part`` (``model`` or ``data_source``, saved in
  that order, ``train.py:L77-L91``); a ``model`` part carries ``version`` (the weight
  version its weights are served as), ``optimizer_step`` and ``lr_step``; a
  ``data_source`` part carries ``state`` (the saved cursor: ``sample_offset``,
  ``epoch_id``, ``sample_group_index``, ``sample_index``, and under the exactly-once
  extension the re-queued ``pending`` source indices).
* ``checkpoint_loaded``: ``rollout_id``, ``part`` (a ``data_source`` part also carries the
  ``state`` loaded); a part that is missing is not loaded
  and has no event (``RolloutDataSource.load`` logs and loads nothing, ``data_source.py:L150``).
* In a run with lives ``taken`` also carries ``source_index`` (the dataset index of the
  group's prompt, the data source's ``sample_offset`` when it was first handed out) and
  ``epoch``; a *source group* is ``(source_index, epoch)``, the identity that survives a
  resume (a ``group_index`` is re-numbered from the restored cursor). ``trained`` also
  carries ``optimizer_step`` (the trainer's step before this one, counted across lives)
  and ``lr_step``.
"""

from __future__ import annotations

# --- sample lifecycle -------------------------------------------------------------
TAKEN = "taken"  # data source handed out a prompt group
SUBMITTED = "submitted"  # a sample's generate request reached the engine
# a generate function (--custom-generate-function-path) is about to generate a sample it
# added to the trajectory of prompt sample ``trajectory`` (a nested group, generate.py)
TRAJECTORY_SAMPLE = "trajectory_sample"
ADMITTED = "admitted"  # the engine started (or, after retract, re-started) a request
PAUSED_REQ = "paused_req"  # a running request was frozen (in_place) at a pause
RETRACTED = "retracted"  # a running request lost its KV and went back to waiting
ABORTED = "aborted"  # a request finished early as ABORTED by a pause(abort)
FINISHED = "finished"  # a request returned from the engine
GROUP_DONE = "group_done"  # every sample of a group returned (or it failed)
PUT_ACCEPTED = "put_accepted"  # group stored in the data buffer
PUT_BLOCKED = "put_blocked"  # producer waits: buffer full
PUT_REJECTED = "put_rejected"  # aborted or dynamic-filter reject at put
GOT = "got"  # group returned by buffer.get
STALE_REJECTED = "stale_rejected"  # group popped by get, then filtered as stale
HANDLER = "handler"  # unused-samples handler called (drop | retry)
RECYCLED = "recycled"  # group re-added to the data source
DROPPED = "dropped"  # group gone for good (handler drop, retry cap, kept beyond B)
TRAINED = "trained"  # groups consumed by a training step

# --- engine / weights / phases ------------------------------------------------------
ENGINE_PAUSE = "engine_pause"
ENGINE_RESUME = "engine_resume"
ENGINE_VERSION = "engine_version"  # engine loaded weights of a new version
ENGINE_LOADED = "engine_loaded"  # one engine of several applied an update (``engine``: its index; ray layout)
SET_WEIGHT_VERSION = "set_weight_version"  # rollout manager learned the version
DRAIN_START = "drain_start"
DRAIN_END = "drain_end"
GENERATE_START = "generate_start"  # one-step / sync generate call
GENERATE_END = "generate_end"
METRICS = "metrics"
PHASE_START = "phase_start"  # side: rollout | train ; phase: generating | training | weight_sync | waiting
PHASE_END = "phase_end"
ENGINE_BUSY = "engine_busy"  # engine decode loop started running requests
ENGINE_IDLE = "engine_idle"  # engine has nothing to run
DECODE_STEP = "decode_step"  # one batched decode step of a real engine, stamped by the engine when its tokens exist
FAULT = "fault"  # an injected or observed failure
TELEMETRY = "telemetry"  # one GPU sample from harness.measure.telemetry (utilisation, memory, power, phase)
RUN_END = "run_end"

# --- lives: stop and resume (see the module docstring) ------------------------------------
LIFE_START = "life_start"
LIFE_END = "life_end"
CHECKPOINT_SAVED = "checkpoint_saved"
CHECKPOINT_LOADED = "checkpoint_loaded"
LIFE_END_HOWS = ("crash", "planned", "completed")
CHECKPOINT_PARTS = ("model", "data_source")

EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    TAKEN: ("group_index", "indices", "recycled"),
    SUBMITTED: ("index", "group_index", "version"),
    TRAJECTORY_SAMPLE: ("index", "group_index", "trajectory"),
    ADMITTED: ("index", "version", "prefix_tokens"),
    PAUSED_REQ: ("index", "version", "mode"),
    RETRACTED: ("index", "version", "generated_tokens"),
    ABORTED: ("index", "version", "generated_tokens"),
    FINISHED: ("index", "group_index", "status", "response_length", "token_versions", "weight_versions"),
    GROUP_DONE: ("group_index", "ok"),
    PUT_ACCEPTED: ("group_index", "queue_size"),
    PUT_BLOCKED: ("group_index", "queue_size"),
    PUT_REJECTED: ("group_index", "reason"),
    GOT: ("group_index", "staleness", "current_version", "queue_size"),
    STALE_REJECTED: ("group_index", "staleness", "current_version"),
    HANDLER: ("group_index", "handler", "cause"),
    RECYCLED: ("group_index",),
    DROPPED: ("group_index", "reason"),
    TRAINED: ("rollout_id", "group_indices", "trainer_version"),
    ENGINE_PAUSE: ("mode", "in_flight"),
    ENGINE_RESUME: (),
    ENGINE_VERSION: ("version",),
    ENGINE_LOADED: ("engine", "version"),
    SET_WEIGHT_VERSION: ("version",),
    DRAIN_START: ("rollout_id", "current_version"),
    DRAIN_END: ("rollout_id",),
    GENERATE_START: ("rollout_id", "version"),
    GENERATE_END: ("rollout_id",),
    METRICS: ("rollout_id", "metrics"),
    PHASE_START: ("side", "phase"),
    PHASE_END: ("side", "phase"),
    ENGINE_BUSY: (),
    ENGINE_IDLE: (),
    # ``indices``: the samples that got one token each, sampled by weights ``version``; the
    # step (admission prefill included) ran ``dur_s`` seconds up to the event's time.
    DECODE_STEP: ("indices", "version", "dur_s"),
    FAULT: ("what",),
    TELEMETRY: ("t_s", "gpu", "phase"),
    RUN_END: ("pending_groups",),
    LIFE_START: ("life", "start_rollout_id", "loaded_version"),
    LIFE_END: ("life", "how", "at"),
    CHECKPOINT_SAVED: ("rollout_id", "part"),
    CHECKPOINT_LOADED: ("rollout_id", "part"),
}
