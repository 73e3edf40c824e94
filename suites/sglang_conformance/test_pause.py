"""``/pause_generation`` modes seen from a streaming client, and an abort while paused."""

from __future__ import annotations

import itertools
import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.pause_routes]

N = 60
_ids = itertools.count()


def body(rid: str) -> dict:
    return {
        "text": "Count: one two three",
        "rid": rid,
        "stream": True,
        "sampling_params": {"max_new_tokens": N, "ignore_eos": True, "temperature": 0.7},
    }


def run_with(api, mode: str, *, abort_while_paused: bool = False) -> list[dict]:
    rid = f"conf-pause-{mode}-{next(_ids)}"
    chunks: list[dict] = []
    paused = False
    try:
        for payload in api.stream_lines("/generate", body(rid)):
            if payload == "[DONE]":
                break
            chunks.append(json.loads(payload))
            if len(chunks) == 2 and not paused:
                paused = True
                assert api.post("/pause_generation", {"mode": mode}).json()["status"] == "ok"
                if abort_while_paused:
                    assert api.post("/abort_request", {"rid": rid}).status_code == 200
                elif mode != "abort":
                    assert api.post("/continue_generation", {}).json()["status"] == "ok"
                    paused = None
    finally:
        if paused:
            api.post("/continue_generation", {})
    return chunks


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_stream_survives_a_pause_and_goes_on_without_repeats(api, mode):
    chunks = run_with(api, mode)
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": N}
    for before, after in zip(chunks, chunks[1:]):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    assert (last["meta_info"]["num_retractions"] >= 1) == (mode == "retract")


def test_pause_abort_ends_the_stream_with_an_abort_chunk(api):
    chunks = run_with(api, "abort")
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert 2 <= chunks[-1]["meta_info"]["completion_tokens"] < N


def test_a_retracted_request_aborted_while_paused_answers_at_once(api):
    chunks = run_with(api, "retract", abort_while_paused=True)
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] >= 2 and len(last["output_ids"]) >= 2
