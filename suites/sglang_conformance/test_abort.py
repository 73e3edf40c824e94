"""``/abort_request``: by rid (exact, live), ``abort_all``, and the tokens an aborted
request keeps."""

from __future__ import annotations

import itertools
import json
import threading

import pytest

pytestmark = pytest.mark.slow  # an HTTP server

LONG = 400  # long enough to be aborted mid-way on any server
_ids = itertools.count()


def long_body(rid: str, **extra) -> dict:
    return {
        "text": "Count: one two three",
        "rid": rid,
        "stream": True,
        **extra,
        "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True, "temperature": 0.7},
    }


def rid_of(what: str) -> str:
    return f"conf-{what}-{next(_ids)}"


def stream_until(api, body: dict, n_chunks: int, action) -> list[dict]:
    """Read ``n_chunks`` chunks of a stream, call ``action()``, read the rest."""
    chunks, done = [], False
    for payload in api.stream_lines("/generate", body):
        if payload == "[DONE]":
            done = True
            break
        chunks.append(json.loads(payload))
        if len(chunks) == n_chunks:
            action()
    assert done, "the stream did not end with [DONE]"
    return chunks


def test_abort_by_rid_returns_the_tokens_so_far(api):
    rid = rid_of("abort")
    chunks = stream_until(api, long_body(rid), 3, lambda: api.post("/abort_request", {"rid": rid}))
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert 3 <= last["meta_info"]["completion_tokens"] < LONG
    assert len(last["output_ids"]) == last["meta_info"]["completion_tokens"]
    assert last["output_ids"][: len(chunks[2]["output_ids"])] == chunks[2]["output_ids"]


def test_abort_of_a_non_streaming_request_answers_200_with_abort(api):
    rid = rid_of("plain")
    result: dict = {}
    body = dict(long_body(rid), stream=False)
    worker = threading.Thread(target=lambda: result.update(r=api.post("/generate", body)))
    worker.start()
    api.wait_for(lambda: api.loads()["loads"][0]["num_running_reqs"] >= 1, "the request to run")
    assert api.post("/abort_request", {"rid": rid}).status_code == 200
    worker.join(120)
    r = result["r"]
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert len(r.json()["output_ids"]) == meta["completion_tokens"] < LONG


def test_rids_match_exactly(api):
    """Aborting ``job-1`` when only ``job-10`` and ``job-1_0`` are live ends neither."""
    base = rid_of("job")
    others = [f"{base}-1_0", f"{base}-10"]
    results: dict = {}

    def run(rid: str) -> None:
        body = {"text": "Hi", "rid": rid, "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
        results[rid] = api.post("/generate", body).json()

    workers = [threading.Thread(target=run, args=(rid,)) for rid in others]
    for w in workers:
        w.start()
    api.wait_for(
        lambda: api.loads()["loads"][0]["num_running_reqs"] + api.loads()["loads"][0]["num_waiting_reqs"] >= 1,
        "the requests to reach the scheduler",
    )
    assert api.post("/abort_request", {"rid": f"{base}-1"}).status_code == 200
    for w in workers:
        w.join(120)
    assert [results[rid]["meta_info"]["finish_reason"]["type"] for rid in others] == ["length", "length"]


def test_missing_or_finished_rid_is_a_no_op(api):
    rid = rid_of("done")
    api.generate({"text": "Hi", "rid": rid, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert api.post("/abort_request", {"rid": rid}).status_code == 200
    assert api.post("/abort_request", {"rid": "conf-no-such-rid"}).status_code == 200
    out = api.generate({"text": "Hi", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_all_ends_every_request(api):
    rids = [rid_of("all"), rid_of("all")]
    results: dict = {}

    def run(rid: str) -> None:
        results[rid] = api.stream("/generate", long_body(rid))

    workers = [threading.Thread(target=run, args=(rid,)) for rid in rids]
    for w in workers:
        w.start()
    api.wait_for(lambda: api.loads()["loads"][0]["num_running_reqs"] >= 2, "both requests to run")
    assert api.post("/abort_request", {"abort_all": True}).status_code == 200
    for w in workers:
        w.join(120)
    for rid in rids:
        assert results[rid][-1]["meta_info"]["finish_reason"]["type"] == "abort"


def test_duplicate_live_rid_is_refused(api):
    rid = rid_of("dup")

    def second() -> None:
        r = api.post("/generate", {"text": "Hi", "rid": rid, "sampling_params": {"max_new_tokens": 2}})
        message = api.error_message(r.json()).lower()
        assert r.status_code == 400 and ("duplicate" in message or rid in message), r.text
        api.post("/abort_request", {"rid": rid})

    chunks = stream_until(api, long_body(rid), 2, second)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
