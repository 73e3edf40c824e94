"""A user's own generate function and data buffer keep working under the recorder: the
recorder's flags name its wrappers, the user's originals are named by
``MILES_HARNESS_RECORD_INNER_<NAME>``, and both the user's behaviour and the recorded
events are checked. Upstream's types, no HTTP (fast tier; needs an upstream tree)."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from harness.record.writer import close_all

USED: list[str] = []


async def my_generate(input):
    """A user's generate function: a fixed three-token answer stamped by version "7"."""
    from miles.rollout.base_types import GenerateFnOutput

    USED.append("generate")
    s = input.sample
    s.tokens = list(s.tokens or [1]) + [5, 6, 7]
    s.response_length += 3
    s.weight_versions.append("7")
    s.status = type(s).Status.COMPLETED
    return GenerateFnOutput(samples=s)


def _lifo_buffer_cls():
    from miles.rollout.fully_async_data_buffer import DataBuffer

    class LifoBuffer(DataBuffer):
        """A user's buffer: last in, first out, no filtering."""

        def __init__(self, input):
            self.items = []

        async def put(self, input):
            USED.append("put")
            self.items.append(input)

        async def get(self, **context):
            return self.items.pop()

        def get_metrics(self):
            return {"my/size": float(len(self.items))}

    return LifoBuffer


@pytest.fixture
def recording(tmp_path, monkeypatch, miles_src):
    from harness.upstream import source

    source.activate(miles_src)
    monkeypatch.setenv("MILES_HARNESS_RECORD_DIR", str(tmp_path))
    monkeypatch.setattr("harness.record.wrappers._GENERATE", None)
    USED.clear()
    yield tmp_path
    close_all()


def _events(directory):
    close_all()
    out = []
    for path in directory.glob("*.jsonl"):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def test_a_users_generate_function_runs_under_the_recorder(recording, monkeypatch):
    from miles.rollout.base_types import GenerateFnInput
    from miles.utils.types import Sample

    import harness.record as record

    monkeypatch.setenv("MILES_HARNESS_RECORD_INNER_GENERATE", f"{__name__}.my_generate")
    state = argparse.Namespace(args=argparse.Namespace())
    sample = Sample(index=3, group_index=1, tokens=[1, 2])
    out = asyncio.run(
        record.generate(GenerateFnInput(state=state, sample=sample, sampling_params={}, evaluation=False))
    )
    assert USED == ["generate"] and out.samples is sample and sample.tokens == [1, 2, 5, 6, 7]
    call = next(e for e in _events(recording) if e["kind"] == "generate_call")
    assert (call["index"], call["group_index"], call["added_tokens"], call["added_versions"]) == (3, 1, 3, ["7"])


def test_a_users_buffer_runs_under_the_recorder(recording, monkeypatch):
    from miles.rollout.fully_async_data_buffer import DataBufferConstructorInput, DataBufferInput
    from miles.utils.types import Sample

    import harness.record as record

    monkeypatch.setattr(f"{__name__}.LifoBuffer", _lifo_buffer_cls(), raising=False)
    monkeypatch.setenv("MILES_HARNESS_RECORD_INNER_BUFFER", f"{__name__}.LifoBuffer")
    args = argparse.Namespace(async_unused_samples_handler="drop", fully_async=True)
    buf = record.RecordingDataBuffer(DataBufferConstructorInput(args=args, unused_handler_fn=lambda g: None))

    def entry(gi):
        s = Sample(index=gi * 2, group_index=gi, status=Sample.Status.COMPLETED, weight_versions=["2"])
        return DataBufferInput(prompt_group=[s], group=[s])

    async def run():
        await buf.put(entry(0))
        await buf.put(entry(1))
        return [(await buf.get(current_version=3)).prompt_group[0].group_index for _ in range(2)]

    assert asyncio.run(run()) == [1, 0]  # the user's LIFO order, not the default FIFO
    assert USED == ["put", "put"] and buf.get_metrics() == {"my/size": 0.0}
    events = _events(recording)
    got = [e for e in events if e["kind"] == "got"]
    assert [(e["group_index"], e["staleness"], e["queue_size"]) for e in got] == [(1, 1, None), (0, 1, None)]
    assert [e["kind"] for e in events if e["kind"] in ("put_accepted", "drain_start")] == [
        "put_accepted",
        "put_accepted",
        "drain_start",
    ]


def test_the_recorder_refuses_itself_as_the_inner(recording, monkeypatch):
    from miles_async_core.errors import ConfigError

    from harness.record.chain import load_inner

    monkeypatch.setenv("MILES_HARNESS_RECORD_INNER_BUFFER", "harness.record.RecordingDataBuffer")
    with pytest.raises(ConfigError, match="MILES_HARNESS_RECORD_INNER_BUFFER"):
        load_inner("buffer")


HOOKED: list[tuple] = []


def my_post_write(args, version_dir, rollout_engines):
    """A user's post-write hook (publishing a disk-delta version)."""
    HOOKED.append((version_dir, len(rollout_engines)))


def test_a_users_post_write_hook_runs_under_the_recorder(recording, monkeypatch):
    import harness.record as record

    monkeypatch.setenv("MILES_HARNESS_RECORD_INNER_POST_WRITE", f"{__name__}.my_post_write")
    HOOKED.clear()
    record.post_write(argparse.Namespace(), "/ckpt/v3", ["engine-0", "engine-1"])
    assert HOOKED == [("/ckpt/v3", 2)]
    written = [e for e in _events(recording) if e["kind"] == "weights_written"]
    assert [(e["version_dir"], e["engines"]) for e in written] == [("/ckpt/v3", 2)]


def test_without_a_record_dir_the_wrappers_record_nothing_and_still_chain(recording, monkeypatch):
    import harness.record as record

    monkeypatch.delenv("MILES_HARNESS_RECORD_DIR")
    monkeypatch.setenv("MILES_HARNESS_RECORD_INNER_POST_WRITE", f"{__name__}.my_post_write")
    HOOKED.clear()
    record.post_write(argparse.Namespace(), "/ckpt/v4", [])
    assert HOOKED == [("/ckpt/v4", 0)] and list(recording.glob("*.jsonl")) == []
