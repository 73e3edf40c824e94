"""One definition each, used by every engine: the pause-mode check
(``contracts.check_pause_mode``), the request check (``engine_io.check_request``) and
the merge of a result into a ``Sample`` with its FINISHED event
(``engine_io.merge_result`` / ``emit_finished``). Each test puts the same input through
every engine and asserts the same outcome, so a private copy that drifts fails here."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from harness.backends.engine_io import check_request, emit_finished, merge_result, request_for
from harness.backends.process_engine import ProcessEngine
from harness.backends.sglang_engine import SGLangEngine, UpdateRecord, apply_generate_output, build_generate_request
from harness.backends.torch_engine import EngineCore, FinishedRequest, TorchEngine, fill_sample
from harness.backends.torch_models import TinyLM, TinyLMConfig
from harness.sim.engine import SimEngine
from miles_async_core import config as config_module
from miles_async_core import contracts
from miles_async_core.contracts import check_pause_mode
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, SamplingParams, Status, VersionRuns

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # fixture in the root conftest.py

CFG = TinyLMConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=32)


class RecordingSink:
    enabled = True

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def emit(self, kind, /, **fields):
        self.events.append((kind, fields))


def bare_process_engine(sink=None, max_seq_len=None) -> ProcessEngine:
    """The parent side of a ``ProcessEngine`` without its child process: every check and
    the result merge run in the parent, before anything is sent."""
    engine = object.__new__(ProcessEngine)
    engine.sink, engine.max_seq_len, engine.seed, engine._futures = sink or RecordingSink(), max_seq_len, 0, {}
    return engine


def sglang_adapter() -> SGLangEngine:
    return SGLangEngine(SimpleNamespace(tokenizer_manager=None), io_struct=SimpleNamespace())


def message(fn) -> str:
    with pytest.raises(ConfigError) as info:
        fn()
    return str(info.value)


# --- pause modes ------------------------------------------------------------------------------------
def test_there_is_one_tuple_of_pause_modes():
    assert config_module.PAUSE_GENERATION_MODES == ("abort", "retract", "in_place")
    assert not hasattr(contracts, "PAUSE_MODES")
    assert contracts.PAUSE_GENERATION_MODES is config_module.PAUSE_GENERATION_MODES


def test_the_pause_mode_error_names_the_flag_the_value_the_allowed_values_and_the_fix():
    text = message(lambda: check_pause_mode("drain"))
    assert "--pause-generation-mode 'drain'" in text
    assert "['abort', 'retract', 'in_place']" in text
    assert "Fix:" in text
    for mode in ("abort", "retract", "in_place"):
        check_pause_mode(mode)


@pytest.mark.model
def test_every_engine_refuses_an_unknown_pause_mode_with_that_same_message():
    expected = message(lambda: check_pause_mode("drain"))
    core = EngineCore(TinyLM(CFG), max_running=1)
    engines = {
        "sim": lambda: asyncio.run(SimEngine().pause_generation("drain")),
        "core": lambda: core.pause("drain"),
        "torch": lambda: asyncio.run(TorchEngine(core).pause_generation("drain")),
        "process": lambda: asyncio.run(bare_process_engine().pause_generation("drain")),
        "sglang": lambda: asyncio.run(sglang_adapter().pause_generation("drain")),
    }
    assert {name: message(fn) for name, fn in engines.items()} == {name: expected for name in engines}
    assert not core.paused


# --- requests ---------------------------------------------------------------------------------------
BAD_REQUESTS = [
    (Sample(prompt_tokens=[]), SamplingParams(max_new_tokens=4), "prompt_tokens is empty"),
    (
        Sample(prompt_tokens=[1], response_tokens=[2, 3]),
        SamplingParams(max_new_tokens=2),
        "max_new_tokens=2 leaves 0 new tokens",
    ),
    (Sample(prompt_tokens=[1]), SamplingParams(max_new_tokens=4, temperature=-1.0), "temperature=-1.0"),
]


@pytest.mark.model
@pytest.mark.parametrize("sample, sampling, expected", BAD_REQUESTS)
def test_every_engine_refuses_a_bad_request_in_the_caller_with_the_same_message(sample, sampling, expected):
    prefix, budget = request_for(sample, sampling)

    def checked(max_seq_len):
        return message(
            lambda: check_request(
                prefix, budget, sampling.temperature, max_seq_len=max_seq_len, generated=len(sample.response_tokens)
            )
        )

    text, sized = checked(None), checked(CFG.max_seq_len)  # sglang leaves the length to the server
    assert expected in text and expected in sized and "Fix:" in text
    core = EngineCore(TinyLM(CFG), max_running=1)
    torch_engine = TorchEngine(core)

    async def torch_generate():
        try:
            torch_engine.generate(sample, sampling)
        finally:
            torch_engine.close()

    async def process_generate():
        bare_process_engine(max_seq_len=CFG.max_seq_len).generate(sample, sampling)

    got = {
        "torch": message(lambda: asyncio.run(torch_generate())),
        "process": message(lambda: asyncio.run(process_generate())),
        "sglang": message(lambda: build_generate_request(sample, sampling)),
    }
    assert got == {"torch": sized, "process": sized, "sglang": text}
    assert not torch_engine._futures
    if not sample.response_tokens:  # the core takes a prompt, not a partial sample
        assert message(lambda: core.add_request(0, prefix, budget, sampling.temperature)) == sized


@pytest.mark.model
def test_the_model_length_is_checked_where_the_engine_knows_it():
    text = message(lambda: check_request([1] * 30, 4, 1.0, max_seq_len=32))
    assert "max_seq_len=32" in text and "Fix:" in text
    core = EngineCore(TinyLM(CFG), max_running=1)
    assert message(lambda: core.add_request(0, [1] * 30, 4)) == text
    sample, sampling = Sample(prompt_tokens=[1] * 30), SamplingParams(max_new_tokens=4)

    async def process_generate():
        bare_process_engine(max_seq_len=32).generate(sample, sampling)

    assert message(lambda: asyncio.run(process_generate())) == text
    check_request([1] * 28, 4, 1.0, max_seq_len=32)  # exactly full is allowed


# --- results ----------------------------------------------------------------------------------------
def partial() -> Sample:
    return Sample(
        prompt_tokens=[1, 2],
        response_tokens=[5, 6],
        rollout_log_probs=[-0.5, -0.25],
        token_versions=VersionRuns([[0, 0, 2]]),
        weight_versions=["0"],
        index=7,
        group_index=3,
    )


def test_merge_result_appends_and_merges_a_continuing_run_into_new_lists():
    sample = partial()
    tokens_before = sample.response_tokens
    merged = merge_result(
        sample,
        tokens=[7, 8, 9],
        log_probs=[-1, -2, -3],
        token_runs=[[0, 0, 1], [1, 0, 2]],
        weight_version=1,
        status=Status.TRUNCATED,
    )
    assert merged is sample
    assert sample.response_tokens == [5, 6, 7, 8, 9] and tokens_before == [5, 6]
    assert sample.rollout_log_probs == [-0.5, -0.25, -1.0, -2.0, -3.0]
    assert sample.token_versions.runs == [[0, 0, 3], [1, 0, 2]]
    assert sample.weight_versions == ["0", "1"] and sample.status is Status.TRUNCATED
    sink = RecordingSink()
    emit_finished(sink, sample)
    assert sink.events == [
        (
            "finished",
            {
                "index": 7,
                "group_index": 3,
                "status": "truncated",
                "response_length": 5,
                "token_versions": [[0, 0, 3], [1, 0, 2]],
                "weight_versions": ["0", "1"],
            },
        )
    ]


@pytest.mark.model
def test_the_same_result_through_every_engine_gives_the_same_sample_and_finished_event():
    tokens, log_probs, runs = [7, 8, 9], [-1.0, -2.0, -3.0], [[0, 0, 1], [1, 1, 2]]

    def fields(s: Sample) -> tuple:
        return (s.response_tokens, s.rollout_log_probs, s.token_versions.runs, s.weight_versions, s.status)

    # torch: the engine thread's FinishedRequest, resolved on the loop
    torch_engine = TorchEngine(EngineCore(TinyLM(CFG)), sink=RecordingSink())
    torch_sink = torch_engine.sink
    done = FinishedRequest(
        req_id=0,
        output_tokens=tokens,
        log_probs=log_probs,
        token_versions=VersionRuns(runs),
        weight_version=1,
        status=Status.TRUNCATED,
    )

    async def torch_resolve() -> Sample:
        fut = asyncio.get_running_loop().create_future()
        torch_engine._futures[0] = (fut, partial())
        torch_engine._resolve([done])
        return await fut

    by_torch = asyncio.run(torch_resolve())
    assert fields(fill_sample(partial(), done)) == fields(by_torch)

    # process: the child's packed tuple, resolved by the parent
    process = bare_process_engine()

    async def process_resolve() -> Sample:
        fut = asyncio.get_running_loop().create_future()
        process._futures[0] = (fut, partial())
        process._resolve([(0, tokens, log_probs, runs, 1, "truncated")])
        return await fut

    by_process = asyncio.run(process_resolve())

    # sglang: the server's output dict, spans over the output tokens
    output = {
        "output_ids": tokens,
        "meta_info": {
            "finish_reason": {"type": "length", "length": 3},
            "weight_version": "1",
            "output_token_logprobs": [(lp, t, None) for lp, t in zip(log_probs, tokens)],
            "weight_versions": [{"version": "0", "start": 0, "end": 1}, {"version": "1", "start": 1, "end": 3}],
        },
    }
    by_sglang = apply_generate_output(
        partial(), output, engine_version_at_submit=0, updates=[UpdateRecord(version=1, pause_mode="retract")]
    )
    expected = ([5, 6, 7, 8, 9], [-0.5, -0.25, -1.0, -2.0, -3.0], [[0, 0, 3], [1, 1, 2]], ["0", "1"], Status.TRUNCATED)
    assert fields(by_torch) == fields(by_process) == fields(by_sglang) == expected
    sglang_sink = RecordingSink()
    emit_finished(sglang_sink, by_sglang)
    assert torch_sink.events == process.sink.events == sglang_sink.events
    assert [k for k, _ in torch_sink.events] == ["finished"]
