"""The SGLang adapter on CPU: the translation layer against hand-written output shapes
in ``fixtures/sglang/``, and the I/O layer against a fake engine (no sglang needed)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.backends.sglang_engine import (
    SGLangEngine,
    UpdateRecord,
    apply_generate_output,
    build_generate_request,
    status_from_finish_reason,
    version_number,
)
from miles_async_core.contracts import RolloutEngine
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, SamplingParams, Status, VersionRuns

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sglang"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def fresh_sample(case: dict, index: int = 0) -> Sample:
    return Sample(prompt_tokens=list(case["prompt_tokens"]), index=index, group_index=index)


def apply_case(case: dict, sample: Sample | None = None) -> Sample:
    adapter = case["adapter"]
    return apply_generate_output(
        sample or fresh_sample(case),
        case["output"],
        engine_version_at_submit=adapter["engine_version_at_submit"],
        updates=[UpdateRecord(**u) for u in adapter["updates"]],
        initial_version=adapter["initial_version"],
    )


# --- translation layer --------------------------------------------------------------------------
def test_every_hand_written_case_is_covered():
    assert set(CASES) >= {
        "completed",
        "truncated",
        "aborted_mid_pause",
        "retract_across_update",
        "in_place_across_update",
        "default_initial_version",
    }


@pytest.mark.parametrize("name", CASES)
def test_hand_written_output_fills_the_sample_as_expected(name):
    case = load(name)
    sample = apply_case(case)
    expected = case["expected"]
    assert sample.status == Status(expected["status"])
    assert sample.token_versions.to_json() == expected["token_versions"]
    assert sample.weight_versions == expected["weight_versions"]
    assert sample.metadata["token_versions_exact"] is expected["token_versions_exact"]
    assert sample.oldest_weight_version == expected["oldest_weight_version"]
    assert sample.oldest_token_version == expected["oldest_token_version"]
    assert sample.token_versions.old_kv_token_count() == expected["old_kv_token_count"]


@pytest.mark.parametrize("name", CASES)
def test_tokens_log_probs_and_versions_have_one_entry_per_token(name):
    case = load(name)
    sample = apply_case(case)
    entries = case["output"]["meta_info"]["output_token_logprobs"]
    assert sample.response_tokens == case["output"]["output_ids"]
    assert sample.rollout_log_probs == [e[0] for e in entries]
    assert len(sample.token_versions) == len(sample.response_tokens) == len(sample.rollout_log_probs)


def test_a_request_spanning_a_retract_update_looks_fresh_to_miles_but_not_per_token():
    sample = apply_case(load("retract_across_update"))
    assert sample.oldest_weight_version == 2  # Miles under-reports: it records the version at completion only
    assert sample.oldest_token_version == 1
    assert sample.metadata["num_retractions"] == 1


def test_an_update_the_adapter_did_not_record_makes_the_split_inexact():
    case = load("in_place_across_update")
    sample = apply_generate_output(
        fresh_sample(case), case["output"], engine_version_at_submit=1, updates=[], initial_version=0
    )
    assert sample.metadata["token_versions_exact"] is False
    assert sample.token_versions.to_json() == [[1, 1, 4], [2, 2, 3]]


def test_a_resumed_partial_sample_appends_tokens_versions_and_one_weight_version():
    case = load("completed")
    sample = fresh_sample(case)
    sample.response_tokens = [7, 8]
    sample.rollout_log_probs = [-0.5, -0.25]
    sample.token_versions = VersionRuns([[3, 3, 2]])
    sample.weight_versions = ["2"]
    apply_case(case, sample)
    assert sample.response_tokens == [7, 8, 1701, 29889, 13, 2]
    assert sample.rollout_log_probs[:2] == [-0.5, -0.25]
    assert sample.token_versions.to_json() == [[3, 3, 6]]
    assert sample.weight_versions == ["2", "3"]


def test_exactness_carries_over_a_resumed_response_but_not_a_retry_from_scratch():
    inexact = load("legacy_no_spans_across_update")
    resumed = apply_case(load("completed"), apply_case(inexact))
    assert resumed.metadata["token_versions_exact"] is False
    retried = apply_case(inexact)
    retried.reset_for_retry()
    assert apply_case(load("completed"), retried).metadata["token_versions_exact"] is True


def test_log_probs_that_name_other_tokens_are_refused():
    case = load("completed")
    case["output"]["meta_info"]["output_token_logprobs"][1][1] = 99
    with pytest.raises(ValueError, match="differ from the 4 output_ids"):
        apply_case(case)


def test_an_output_without_log_probs_is_refused():
    case = load("truncated")
    del case["output"]["meta_info"]["output_token_logprobs"]
    with pytest.raises(ValueError, match="return_logprob=True"):
        apply_case(case)


@pytest.mark.parametrize(
    "reason, status",
    [
        ({"type": "stop", "matched": 2}, Status.COMPLETED),
        ({"type": "length", "length": 8}, Status.TRUNCATED),
        ({"type": "abort", "message": "Aborted"}, Status.ABORTED),
    ],
)
def test_finish_reason_type_maps_to_status(reason, status):
    assert status_from_finish_reason(reason) == status


@pytest.mark.parametrize("reason", [None, {"type": "eos"}, "stop"])
def test_an_unknown_or_missing_finish_reason_is_an_error(reason):
    with pytest.raises(ValueError, match="finish_reason"):
        status_from_finish_reason(reason)


def test_non_numeric_versions_map_to_the_initial_version():
    assert version_number("default", initial_version=5) == 5
    assert version_number("12", initial_version=5) == 12


def test_generate_request_sends_token_ids_with_log_probs_and_the_remaining_budget():
    sample = Sample(prompt_tokens=[1, 2, 3], response_tokens=[4, 5], index=3)
    request = build_generate_request(sample, SamplingParams(max_new_tokens=6, temperature=0.7), rid="r")
    assert request == {
        "input_ids": [1, 2, 3, 4, 5],
        "sampling_params": {
            "max_new_tokens": 4,
            "temperature": 0.7,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        },
        "return_logprob": True,
        "rid": "r",
    }


def test_sampling_overrides_add_sglang_parameters_but_not_the_owned_ones():
    sample = Sample(prompt_tokens=[1])
    request = build_generate_request(
        sample, SamplingParams(max_new_tokens=3), sampling_overrides={"ignore_eos": True, "stop_token_ids": [2]}
    )
    assert request["sampling_params"]["ignore_eos"] is True
    assert request["sampling_params"]["stop_token_ids"] == [2]
    with pytest.raises(ConfigError, match=r"sampling_overrides sets \['temperature'\]"):
        build_generate_request(sample, SamplingParams(), sampling_overrides={"temperature": 0.0})


@pytest.mark.parametrize(
    "sample, sampling, field",
    [
        (Sample(prompt_tokens=[]), SamplingParams(), "prompt_tokens"),
        (Sample(prompt_tokens=[1], response_tokens=[2, 3]), SamplingParams(max_new_tokens=2), "max_new_tokens=2"),
        (Sample(prompt_tokens=[1]), SamplingParams(temperature=-1.0), "temperature=-1.0"),
    ],
)
def test_a_bad_request_raises_a_config_error_naming_the_field(sample, sampling, field):
    with pytest.raises(ConfigError, match=field) as info:
        build_generate_request(sample, sampling)
    assert "Fix:" in str(info.value)


# --- I/O layer against a fake engine ------------------------------------------------------------
class FakeTokenizerManager:
    """Records the calls the adapter makes; each coroutine answers like SGLang's."""

    def __init__(self, *, flush_ok: bool = True, update_ok: bool = True) -> None:
        self.calls: list[tuple] = []
        self.flush_ok, self.update_ok = flush_ok, update_ok
        self.on_abort_all = None  # the engine's: finish every request in flight as aborted

    async def pause_generation(self, obj):
        self.calls.append(("pause", obj.mode))

    async def continue_generation(self, obj):
        self.calls.append(("continue",))

    async def flush_cache(self, timeout_s=None):
        self.calls.append(("flush", timeout_s))
        return SimpleNamespace(success=self.flush_ok, message="" if self.flush_ok else "pending requests")

    async def update_weights_from_tensor(self, obj, request=None):
        self.calls.append(("update", obj.serialized_named_tensors, obj.flush_cache, obj.weight_version))
        return self.update_ok, "ok" if self.update_ok else "shape mismatch"

    def abort_request(self, rid="", abort_all=False):
        if abort_all:
            self.calls.append(("abort_all",))
            self.on_abort_all()
        else:
            self.calls.append(("abort", rid))


class FakeEngine:
    """``async_generate`` waits until the test hands it the output for that rid."""

    def __init__(self, tm: FakeTokenizerManager) -> None:
        self.tokenizer_manager = tm
        self.pending: dict[str, asyncio.Future] = {}
        self.requests: list[dict] = []
        self.shut_down = False
        self.abort_output: dict | None = None  # what an aborted request returns (its partial output)
        tm.on_abort_all = self._abort_all

    def _abort_all(self):
        for rid, fut in self.pending.items():
            if not fut.done():
                fut.set_result({**self.abort_output, "meta_info": {**self.abort_output["meta_info"], "id": rid}})

    async def async_generate(self, **request):
        self.requests.append(request)
        fut = asyncio.get_running_loop().create_future()
        self.pending[request["rid"]] = fut
        return await fut

    def _serialize_tensors_per_rank(self, named_tensors, load_format):
        return [("serialized", tuple(named_tensors), load_format)]

    def shutdown(self):
        self.shut_down = True


def fake_io_struct():
    def request(**fields):
        return SimpleNamespace(**fields)

    return SimpleNamespace(
        PauseGenerationReqInput=request, ContinueGenerationReqInput=request, UpdateWeightsFromTensorReqInput=request
    )


class RecordingSink:
    enabled = True

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def emit(self, kind, /, **fields):
        self.events.append((kind, fields))


def make_adapter(**tm_kwargs) -> tuple[SGLangEngine, FakeEngine, FakeTokenizerManager, RecordingSink]:
    tm = FakeTokenizerManager(**tm_kwargs)
    engine = FakeEngine(tm)
    sink = RecordingSink()
    adapter = SGLangEngine(engine, io_struct=fake_io_struct(), initial_version=1, flush_cache_timeout_s=5.0, sink=sink)
    return adapter, engine, tm, sink


def test_the_adapter_satisfies_the_rollout_engine_protocol():
    adapter, *_ = make_adapter()
    assert isinstance(adapter, RolloutEngine)
    assert adapter.weight_version == 1


@pytest.mark.parametrize("mode, flushed", [("retract", True), ("abort", True), ("in_place", False)])
def test_an_update_pauses_flushes_unless_in_place_loads_with_the_version_and_continues(mode, flushed):
    adapter, _, tm, sink = make_adapter()

    async def run():
        await adapter.pause_generation(mode)
        await adapter.update_weights(2, {"w": "tensor"})
        await adapter.continue_generation()

    asyncio.run(run())
    update = ("update", [("serialized", (("w", "tensor"),), None)], False, "2")
    expected = [("pause", mode)] + ([("flush", 5.0)] if flushed else []) + [update, ("continue",)]
    assert tm.calls == expected
    assert adapter.weight_version == 2
    assert adapter.updates == [UpdateRecord(version=2, pause_mode=mode)]
    assert [kind for kind, _ in sink.events] == ["engine_pause", "engine_resume"]  # engine_version: the driver's


def test_update_while_running_is_refused():
    adapter, _, tm, _ = make_adapter()
    with pytest.raises(RuntimeError, match="pause_generation"):
        asyncio.run(adapter.update_weights(2, {}))
    assert tm.calls == []


def test_an_unknown_pause_mode_is_a_config_error_naming_the_flag():
    adapter, *_ = make_adapter()
    with pytest.raises(ConfigError, match="--pause-generation-mode"):
        asyncio.run(adapter.pause_generation("drain"))


def test_a_refused_flush_raises_like_miles_and_loads_nothing():
    adapter, _, tm, _ = make_adapter(flush_ok=False)

    async def run():
        await adapter.pause_generation("retract")
        await adapter.update_weights(2, [("w", "tensor")])

    with pytest.raises(TimeoutError, match="Timeout while flushing cache: pending requests"):
        asyncio.run(run())
    assert [c[0] for c in tm.calls] == ["pause", "flush"]
    assert adapter.weight_version == 1


def test_a_failed_load_keeps_the_old_version():
    adapter, *_ = make_adapter(update_ok=False)

    async def run():
        await adapter.pause_generation("in_place")
        await adapter.update_weights(2, [("w", "tensor")])

    with pytest.raises(RuntimeError, match="shape mismatch"):
        asyncio.run(run())
    assert adapter.weight_version == 1 and adapter.updates == []


def test_a_request_in_flight_across_an_in_place_update_gets_old_kv_runs():
    adapter, engine, _, sink = make_adapter()
    case = load("in_place_across_update")
    sample = fresh_sample(case, index=4)

    async def run():
        task = adapter.generate(sample, SamplingParams(max_new_tokens=16))
        await asyncio.sleep(0)  # let the request reach the fake engine
        await adapter.pause_generation("in_place")
        await adapter.update_weights(2, {})
        await adapter.continue_generation()
        (rid,) = engine.pending
        engine.pending[rid].set_result(case["output"])
        return await task

    done = asyncio.run(run())
    assert done is sample
    assert sample.token_versions.to_json() == [[1, 1, 4], [2, 1, 3]]
    assert sample.metadata["engine_version_at_submit"] == 1
    assert engine.requests[0]["input_ids"] == case["prompt_tokens"]
    assert sink.events[-1][0] == "finished"
    assert sink.events[-1][1]["token_versions"] == [[1, 1, 4], [2, 1, 3]]
    # the adapter's own events: submitted in generate (the version then), pause after
    # SGLang paused, resume before it is asked to continue (the traced pause lies inside)
    assert [kind for kind, _ in sink.events] == ["submitted", "engine_pause", "engine_resume", "finished"]
    assert sink.events[0][1] == {"index": 4, "group_index": sample.group_index, "version": 1}


def test_updates_before_submission_are_not_attributed_to_the_request():
    adapter, engine, _, _ = make_adapter()
    case = load("in_place_across_update")

    async def run():
        await adapter.pause_generation("retract")
        await adapter.update_weights(2, {})
        await adapter.continue_generation()
        task = adapter.generate(fresh_sample(case), SamplingParams(max_new_tokens=16))
        await asyncio.sleep(0)
        (rid,) = engine.pending
        engine.pending[rid].set_result(case["output"])
        return await task

    sample = asyncio.run(run())
    assert sample.metadata["engine_version_at_submit"] == 2
    assert sample.metadata["token_versions_exact"] is False  # the 1->2 span boundary is unexplained


def test_cancelling_a_generate_aborts_that_request_in_the_engine():
    adapter, engine, tm, _ = make_adapter()
    sample = Sample(prompt_tokens=[1, 2], index=9)

    async def run():
        task = adapter.generate(sample, SamplingParams(max_new_tokens=4))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    (rid,) = engine.pending
    assert tm.calls == [("abort", rid)]
    assert sample.status == Status.PENDING


def test_abort_requests_sends_abort_all_and_returns_when_every_call_came_back_aborted():
    """Upstream's abort() posts /abort_request {"abort_all": true} after every one-step
    rollout; the route calls abort_request(abort_all=True) on the tokenizer manager."""
    adapter, engine, tm, sink = make_adapter()
    case = load("aborted_mid_pause")
    engine.abort_output = case["output"]
    samples = [fresh_sample(case, index=i) for i in (3, 4)]

    async def run():
        await adapter.abort_requests()  # nothing in flight: nothing sent, nothing recorded
        assert tm.calls == [] and sink.events == []
        tasks = [adapter.generate(s, SamplingParams(max_new_tokens=16)) for s in samples]
        await asyncio.sleep(0)  # let the requests reach the fake engine
        await adapter.abort_requests()
        assert all(t.done() for t in tasks)

    asyncio.run(run())
    assert tm.calls == [("abort_all",)]
    for s in samples:
        assert s.status is Status.ABORTED and s.response_tokens == case["output"]["output_ids"]  # partial output
        assert s.token_versions.to_json() == case["expected"]["token_versions"]
    assert [kind for kind, _ in sink.events] == [
        "submitted",
        "submitted",
        "engine_pause",
        "finished",
        "finished",
        "engine_resume",
    ]
    assert sink.events[2][1] == {"mode": "abort", "in_flight": 2}


def test_a_bad_request_raises_in_the_caller_before_anything_is_sent():
    adapter, engine, _, _ = make_adapter()
    with pytest.raises(ConfigError):
        adapter.generate(Sample(prompt_tokens=[]), SamplingParams())
    assert engine.requests == []


def test_without_sglang_the_constructor_names_the_gpu_extra_and_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # makes `import sglang` raise ImportError
    with pytest.raises(ConfigError) as info:
        SGLangEngine(model_path="HuggingFaceTB/SmolLM2-135M-Instruct")
    message = str(info.value)
    assert "backend='sglang'" in message and "`gpu` extra" in message
    assert "pip install -e .[gpu]" in message


def test_close_shuts_the_engine_down():
    adapter, engine, _, _ = make_adapter()
    adapter.close()
    assert engine.shut_down
