"""The ``RolloutEngine`` contract (``miles_async_core/contracts.py``) over SGLang's offline ``Engine``.

Two layers:

* a pure translation layer, tested on CPU against hand-written response shapes
  (``fixtures/sglang/*.json``): ``build_generate_request`` turns a ``Sample`` into
  ``async_generate`` keyword arguments (checked by ``engine_io.check_request``, as
  every engine's requests are), ``apply_generate_output`` writes SGLang's output dict
  back into the ``Sample`` (through ``engine_io.merge_result``, as every engine does);
* ``SGLangEngine``, the thin I/O layer: it awaits the engine's tokenizer-manager
  coroutines on the caller's event loop and keeps its own record of pause/update
  events, which the translation layer needs to know what KV each token attended to.

Invariant: every sample returned has ``len(token_versions) == len(response_tokens)
== len(rollout_log_probs)`` and exactly one new ``weight_versions`` entry, the raw
``meta_info["weight_version"]`` string (so ``Sample.oldest_weight_version`` behaves
exactly as Miles': the engine's initial ``"default"`` is ignored there).

Source read: the sglang 0.5.23 wheel (cp311 manylinux_2_34), not installed, unpacked.
What this module relies on, by file and line in that wheel (``sglang/srt/...``):

* ``entrypoints/engine.py:L545`` ``Engine.async_generate(prompt=None,
  sampling_params=None, input_ids=None, ..., return_logprob=False, ..., stream=False,
  ..., rid=None, ...)``; non-streaming returns one dict ``{"text", "output_ids",
  "meta_info"}`` (``managers/tokenizer_manager.py:L2665-L2670``; ``"text"`` is absent
  with ``skip_tokenizer_init``, L2705-L2709).
* ``meta_info`` keys (``managers/tokenizer_manager.py:L2507-L2513``): ``id``,
  ``finish_reason``, ``prompt_tokens``, ``weight_version`` (the tokenizer manager's
  current version when the output is emitted), ``num_retractions``; plus
  ``completion_tokens`` and ``cached_tokens`` (L2554-L2558); ``output_token_logprobs``
  as ``(logprob, token_id, text_or_None)`` tuples (L2869, built by
  ``detokenize_logprob_tokens`` L3098-L3116).
* Per-token versions: since this release a finished request also carries
  ``meta_info["weight_versions"] = [{"version", "start", "end"}, ...]`` spans over the
  output tokens, and ``weight_version`` is the last span's version
  (``utils/weight_versions.py:L66-L105``, filled at ``tokenizer_manager.py:L2559-L2568``
  and, for aborts, L3602-L3613). The scheduler records a span boundary whenever the
  version changes (``managers/scheduler.py:L5636-L5655``), including through
  ``update_weights_from_tensor(weight_version=...)``
  (``managers/scheduler_components/weight_updater.py:L135-L136``). Only requests that
  already have output tokens get a boundary.
* ``finish_reason`` (``managers/schedule_batch.py:L284-L345``): ``{"type": "stop",
  "matched": ...}``, ``{"type": "length", "length": n}``, ``{"type": "abort",
  "message", "status_code", "err_type"}``; an abort while waiting has message
  ``"Abort in waiting queue"`` (``tokenizer_manager.py:L3595-L3599``).
* The offline ``Engine`` has no ``pause_generation`` / ``continue_generation`` /
  ``update_weight_version`` methods (only the HTTP server routes them,
  ``entrypoints/http_server.py:L1527``, ``L1831``, ``L1844``), and its synchronous
  methods call ``self.loop.run_until_complete`` (e.g. ``flush_cache`` L1506,
  ``update_weights_from_tensor`` L1679), which cannot run inside a running loop. So
  this adapter awaits the tokenizer manager directly:
  ``pause_generation(PauseGenerationReqInput(mode=...))`` (``tokenizer_manager.py:
  L2267``; request type ``managers/io_struct.py:L1927``, default mode ``"abort"``),
  ``continue_generation(ContinueGenerationReqInput())`` (L2282; io_struct L1949),
  ``flush_cache(timeout_s=...)`` (``tokenizer_control_mixin.py:L325``),
  ``update_weights_from_tensor(UpdateWeightsFromTensorReqInput(
  serialized_named_tensors, load_format=None, flush_cache=True, weight_version=None,
  ...))`` (``tokenizer_control_mixin.py:L563``; io_struct L2027-L2046; the version is
  set only on success), and ``abort_request(rid="", abort_all=False)``
  (``tokenizer_manager.py:L2241``; synchronous, what the ``/abort_request`` route calls).
  Tensors are serialised per TP rank with ``Engine._serialize_tensors_per_rank``
  (``engine.py:L1743``), a private helper: the public synchronous wrapper does the
  same and then blocks on the loop.
* ``flush_cache`` succeeds only when no request is running; while paused the waiting
  queue is ignored (``managers/scheduler.py:L5518-L5546``), so it works after
  ``retract`` and fails after ``in_place`` with requests frozen in the running batch.
  The update therefore flushes unless the pause was ``in_place``, as Miles' updater
  does (``update_weight_from_distributed/mixin.py:L315``), and passes ``flush_cache=False``
  to the load itself.
* The initial version is the server argument ``weight_version``, default
  ``"default"`` (``arg_groups/fields/serving.py:L172-L175``).

Token versions. Each span gives the weight version that sampled its tokens (exact).
The KV version is not reported; it follows from the pause mode of the update that
started the span, which only this adapter knows: after ``retract`` the request is
re-prefilled under the new weights (the cache was flushed), so ``kv_version`` is the
new version; after ``in_place`` decoding continues on the old KV, so ``kv_version``
stays that of the previous span. Non-numeric versions (``"default"``) map to
``initial_version``. Where spans are missing (older SGLang) and an update happened
while the request was in flight, the per-token split is unknown: the response is
recorded as one run of the reported version and ``metadata["token_versions_exact"]``
is ``False``; a streaming path could count tokens at the pause, but with spans
available it would only add an off-by-one race against the overlap scheduler.
Approximation kept: a prompt prefix served from the radix cache after an ``in_place``
update (no flush) was computed by older weights; ``cached_tokens`` shows that it
happened but not under which version, so the first span's ``kv_version`` is taken
to be its own version.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Awaitable, Mapping, Sequence

from miles_async_core import events as ev
from miles_async_core.contracts import EventSink, NullSink, check_pause_mode
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, SamplingParams, Status, VersionRuns

from .engine_io import check_request, emit_finished, emit_submitted, merge_result, request_for

_STATUS_BY_FINISH_TYPE = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


@dataclass(frozen=True, kw_only=True)
class UpdateRecord:
    """One weight update the adapter applied: the version it set and the pause mode
    the engine was in while it was loaded."""

    version: int
    pause_mode: str


# --- translation layer (pure) ---------------------------------------------------------------------
def build_generate_request(
    sample: Sample,
    sampling: SamplingParams,
    *,
    rid: str | None = None,
    sampling_overrides: Mapping[str, Any] | None = None,
) -> dict:
    """Keyword arguments for ``Engine.async_generate`` for ``sample``.

    A partially generated sample (Miles' partial rollout) resumes: the prefix is
    ``prompt_tokens + response_tokens`` and the budget what is left of
    ``max_new_tokens``. ``no_stop_trim`` and ``skip_special_tokens=False`` keep the
    stop token in the output, as Miles' rollout sampling parameters do.
    ``sampling_overrides`` adds other SGLang sampling parameters (``stop_token_ids``,
    ``ignore_eos``, ``top_p`` ...); it may not set the two this harness owns.
    """
    prefix, budget = request_for(sample, sampling)
    # the server knows its context length; the rest is checked here, in the caller
    check_request(prefix, budget, sampling.temperature, generated=len(sample.response_tokens))
    owned = sorted({"max_new_tokens", "temperature"} & set(sampling_overrides or {}))
    if owned:
        raise ConfigError(
            f"sampling_overrides sets {owned}; allowed are other SGLang sampling parameters. "
            f"Fix: set those through SamplingParams (--rollout-max-response-len, --rollout-temperature)."
        )
    request: dict[str, Any] = {
        "input_ids": prefix,
        "sampling_params": {
            "max_new_tokens": budget,
            "temperature": sampling.temperature,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            **dict(sampling_overrides or {}),
        },
        "return_logprob": True,
    }
    if rid is not None:
        request["rid"] = rid
    return request


def version_number(version: Any, *, initial_version: int) -> int:
    """SGLang versions are strings; numeric ones are ours, others (``"default"``) are the
    weights the engine was launched with."""
    text = str(version)
    return int(text) if text.isdigit() else initial_version


def status_from_finish_reason(finish_reason: Any) -> Status:
    kind = finish_reason.get("type") if isinstance(finish_reason, Mapping) else None
    if kind not in _STATUS_BY_FINISH_TYPE:
        raise ValueError(
            f"SGLang output has finish_reason={finish_reason!r}; expected a dict with type in "
            f"{sorted(_STATUS_BY_FINISH_TYPE)} (an unfinished streaming chunk has None)."
        )
    return _STATUS_BY_FINISH_TYPE[kind]


def token_versions_from_output(
    meta_info: Mapping[str, Any], num_tokens: int, *, updates: Sequence[UpdateRecord], initial_version: int
) -> tuple[VersionRuns, bool]:
    """Per-token (version, kv_version) runs for one output and whether they are exact.

    ``updates`` are the updates applied while the request was in flight, oldest first.
    """
    reported = version_number(meta_info["weight_version"], initial_version=initial_version)
    spans = meta_info.get("weight_versions")
    if spans and sum(int(s["end"]) - int(s["start"]) for s in spans) == num_tokens:
        return _runs_from_spans(spans, updates=updates, initial_version=initial_version)
    runs = VersionRuns()
    runs.append(reported, reported, num_tokens)
    return runs, not updates


def _runs_from_spans(
    spans: Sequence[Mapping[str, Any]], *, updates: Sequence[UpdateRecord], initial_version: int
) -> tuple[VersionRuns, bool]:
    mode_by_version = {u.version: u.pause_mode for u in updates}
    runs, exact, kv = VersionRuns(), True, None
    for span in spans:
        version = version_number(span["version"], initial_version=initial_version)
        if kv is None:  # prefilled under this version (see the radix-cache caveat above)
            kv = version
        else:
            mode = mode_by_version.get(version)
            if mode == "in_place":
                kv = min(kv, version)  # decoding continues on the old KV
            else:
                kv = version  # retract: re-prefilled under the new weights
                exact = exact and mode == "retract"
        runs.append(version, kv, int(span["end"]) - int(span["start"]))
    return runs, exact


def apply_generate_output(
    sample: Sample,
    output: Mapping[str, Any],
    *,
    engine_version_at_submit: int,
    updates: Sequence[UpdateRecord] = (),
    initial_version: int = 0,
) -> Sample:
    """Write one finished ``async_generate`` output into ``sample`` (appending to any
    partial response) and return it. ``engine_version_at_submit`` goes to metadata for
    the trace; ``updates`` are those applied while the request was in flight."""
    meta = output["meta_info"]
    status = status_from_finish_reason(meta.get("finish_reason"))
    tokens = [int(t) for t in output["output_ids"]]
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise ValueError(
            "SGLang output has no meta_info['output_token_logprobs']; the request must set return_logprob=True."
        )
    if [int(e[1]) for e in entries] != tokens:
        raise ValueError(
            f"SGLang output_token_logprobs name {len(entries)} tokens that differ from the "
            f"{len(tokens)} output_ids (request id={meta.get('id')!r}); refusing a sample whose "
            f"log-probs do not match its tokens."
        )
    runs, exact = token_versions_from_output(meta, len(tokens), updates=updates, initial_version=initial_version)
    carried_exact = sample.metadata.get("token_versions_exact", True) if sample.response_tokens else True
    merge_result(
        sample,
        tokens=tokens,
        log_probs=[e[0] for e in entries],
        token_runs=runs.runs,
        weight_version=meta["weight_version"],
        status=status,
    )
    sample.metadata["token_versions_exact"] = exact and carried_exact
    sample.metadata["engine_version_at_submit"] = engine_version_at_submit
    sample.metadata["num_retractions"] = meta.get("num_retractions", 0)
    return sample


# --- I/O layer ------------------------------------------------------------------------------------
def _import_sglang() -> tuple[Any, Any]:
    try:
        import sglang
        from sglang.srt.managers import io_struct
    except ImportError as exc:
        raise ConfigError(
            f"backend='sglang' needs the sglang package, which is not importable here ({exc}). "
            f"Allowed: a machine with a CUDA GPU and the `gpu` extra installed. "
            f"Fix: pip install -e .[gpu]  (or use the torch backend on CPU)."
        ) from exc
    return sglang, io_struct


class SGLangEngine:
    """asyncio adapter over an ``sglang.Engine``; bind it to one event loop.

    Pass ``engine`` (and ``io_struct``, the module holding SGLang's request types) to
    wrap an existing engine; otherwise ``model_path`` and ``engine_kwargs`` launch one
    (``sglang.Engine(model_path=..., **engine_kwargs)``, i.e. ``ServerArgs`` fields).
    Construct it inside the event loop that will drive it: SGLang's tokenizer manager
    binds its receive loop to the loop that first awaits it.
    """

    def __init__(
        self,
        engine: Any = None,
        *,
        model_path: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        io_struct: Any = None,
        initial_version: int = 0,
        flush_cache_timeout_s: float = 60.0,
        sampling_overrides: Mapping[str, Any] | None = None,
        sink: EventSink | None = None,
    ) -> None:
        if engine is None or io_struct is None:
            sglang, sgl_io = _import_sglang()
            io_struct = io_struct or sgl_io
            if engine is None:
                if not model_path:
                    raise ConfigError(
                        "SGLangEngine(model_path=None): a model path or HF id is required to launch an engine. Fix: pass model_path=..."
                    )
                engine = sglang.Engine(model_path=model_path, **dict(engine_kwargs or {}))
        self.engine = engine
        self.io = io_struct
        self.initial_version = initial_version
        self.weight_version = initial_version
        self.flush_cache_timeout_s = flush_cache_timeout_s
        self.sampling_overrides = dict(sampling_overrides or {})
        self.sink = sink or NullSink()
        self.updates: list[UpdateRecord] = []
        self.paused_mode: str | None = None
        self._rids = itertools.count()
        self._in_flight: set[str] = set()
        self._tasks: set[asyncio.Future] = set()  # generate calls not yet returned

    # --- the RolloutEngine contract ---------------------------------------------------------
    def generate(self, sample: Sample, sampling: SamplingParams) -> Awaitable[Sample]:
        rid = f"miles-{sample.index}-{next(self._rids)}"
        request = build_generate_request(
            sample,
            sampling,
            rid=rid,  # raises here, in the caller
            sampling_overrides=self.sampling_overrides,
        )
        # the request is handed over now; SGLang's own steps are not visible here
        emit_submitted(self.sink, sample, self.weight_version)
        task = asyncio.ensure_future(self._generate(sample, request, rid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def pause_generation(self, mode: str) -> None:
        check_pause_mode(mode)
        in_flight = len(self._in_flight)
        await self.engine.tokenizer_manager.pause_generation(self.io.PauseGenerationReqInput(mode=mode))
        self.paused_mode = mode
        if self.sink.enabled:
            self.sink.emit(ev.ENGINE_PAUSE, mode=mode, in_flight=in_flight)

    async def update_weights(self, version: int, weights: Any) -> None:
        """Load ``weights`` (a name->tensor mapping or (name, tensor) pairs) as ``version``."""
        if self.paused_mode is None:
            raise RuntimeError(
                f"update_weights(version={version}) called while the engine is running; "
                f"call pause_generation(mode) first."
            )
        tm = self.engine.tokenizer_manager
        if self.paused_mode != "in_place":
            flushed = await tm.flush_cache(timeout_s=self.flush_cache_timeout_s)
            if not flushed.success:
                raise TimeoutError(f"Timeout while flushing cache: {flushed.message}")
        named = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
        request = self.io.UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=self.engine._serialize_tensors_per_rank(named, None),
            load_format=None,
            flush_cache=False,
            weight_version=str(version),
        )
        success, message = await tm.update_weights_from_tensor(request, None)
        if not success:
            raise RuntimeError(f"SGLang update_weights_from_tensor(version={version}) failed: {message}")
        self.updates.append(UpdateRecord(version=version, pause_mode=self.paused_mode))
        self.weight_version = version  # the driver records engine_version once per update

    async def continue_generation(self) -> None:
        # Recorded before the request goes out (and engine_pause after the pause returns):
        # the traced paused window lies inside the engine's, since SGLang may run
        # requests as soon as it receives the resume.
        if self.sink.enabled:
            self.sink.emit(ev.ENGINE_RESUME)
        await self.engine.tokenizer_manager.continue_generation(self.io.ContinueGenerationReqInput())
        self.paused_mode = None

    async def abort_requests(self) -> None:
        """``POST /abort_request {"abort_all": true}``, which upstream's ``abort()`` sends
        after every one-step rollout: the HTTP route calls the tokenizer manager's
        ``abort_request(rid="", abort_all=True)`` (synchronous: it sends one ``AbortReq``
        to the scheduler, which finishes every running and waiting request as ``abort``
        with its partial output), and so does this. It then waits for every generate call
        in flight to return, so the trace shows them inside an abort pause
        (``engine_pause(mode="abort")`` ... ``engine_resume``), as every harness engine
        records it (no ``engine_resume`` while paused: SGLang stays paused). Nothing, not
        one event, when no call is in flight. A call whose request reached SGLang after
        the abort is not aborted and returns as it ends."""
        tasks = set(self._tasks)
        if not tasks:
            return
        if self.sink.enabled:
            self.sink.emit(ev.ENGINE_PAUSE, mode="abort", in_flight=len(tasks))
        self.engine.tokenizer_manager.abort_request(rid="", abort_all=True)
        await asyncio.wait(tasks)
        if self.sink.enabled and self.paused_mode is None:
            self.sink.emit(ev.ENGINE_RESUME)

    def close(self) -> None:
        self.engine.shutdown()

    # --- internals --------------------------------------------------------------------------
    async def _generate(self, sample: Sample, request: dict, rid: str) -> Sample:
        first_update, version_at_submit = len(self.updates), self.weight_version
        self._in_flight.add(rid)
        try:
            output = await self.engine.async_generate(**request)
        except asyncio.CancelledError:
            self.engine.tokenizer_manager.abort_request(rid=rid)  # cancelling removes the request
            raise
        finally:
            self._in_flight.discard(rid)
        apply_generate_output(
            sample,
            output,
            engine_version_at_submit=version_at_submit,
            updates=self.updates[first_update:],
            initial_version=self.initial_version,
        )
        emit_finished(self.sink, sample)
        return sample
