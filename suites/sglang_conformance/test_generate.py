"""``/generate``: outputs, sampling fields, ``n``, batches, streaming, errors."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # an HTTP server

PROMPT = "The capital of France is"


def greedy(api, n_tokens: int, **extra) -> dict:
    params = {"max_new_tokens": n_tokens, "temperature": 0, "ignore_eos": True}
    params.update(extra.pop("sampling_params", {}))
    return api.generate({"text": PROMPT, "sampling_params": params, **extra})


def test_text_prompt_returns_text_ids_and_meta_info(api):
    out = greedy(api, 8)
    meta = out["meta_info"]
    assert isinstance(out["text"], str) and len(out["output_ids"]) == 8
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["completion_tokens"] == 8 and meta["prompt_tokens"] > 0
    assert isinstance(meta["id"], str) and meta["id"]
    assert "weight_version" in meta and "cached_tokens" in meta


def test_input_ids_prompt_and_logprobs(api):
    ids = api.generate({"text": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    prompt = ids["output_ids"] + greedy(api, 3)["output_ids"]
    out = api.generate(
        {"input_ids": prompt, "return_logprob": True, "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    )
    lps = out["meta_info"]["output_token_logprobs"]
    assert out["meta_info"]["prompt_tokens"] == len(prompt)
    assert [e[1] for e in lps] == out["output_ids"] and len(lps) == 5
    assert all(isinstance(e[0], float) and e[0] <= 1e-6 for e in lps)


def test_greedy_is_repeatable(api):
    assert greedy(api, 12)["output_ids"] == greedy(api, 12)["output_ids"]


def test_stop_token_ids_end_at_the_first_occurrence_and_keep_the_token(api):
    ref = greedy(api, 12)["output_ids"]
    tok = ref[5]
    out = greedy(api, 12, sampling_params={"ignore_eos": False, "stop_token_ids": [tok]})
    first = ref.index(tok)
    assert out["output_ids"] == ref[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok}


def test_ignore_eos_also_ignores_stop_token_ids(api):
    ref = greedy(api, 12)["output_ids"]
    out = greedy(api, 12, sampling_params={"stop_token_ids": [ref[2]]})
    assert out["output_ids"] == ref and out["meta_info"]["finish_reason"]["type"] == "length"


def _stop_string(text: str) -> str:
    for start in range(2, len(text) - 1):  # a printable pair, taken after the first tokens
        s = text[start : start + 2]
        if s.isprintable() and "\ufffd" not in s:
            return s
    pytest.fail(f"no usable stop string in the greedy output {text!r} (the model's output is too short)")


def test_stop_string_trims_the_text_unless_no_stop_trim(api):
    ref = greedy(api, 24)
    stop = _stop_string(ref["text"])
    cut = ref["text"].find(stop)
    out = greedy(api, 24, sampling_params={"stop": [stop]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == ref["text"][:cut]
    assert out["output_ids"] == ref["output_ids"][: len(out["output_ids"])]
    kept = greedy(api, 24, sampling_params={"stop": [stop], "no_stop_trim": True})
    assert kept["text"] == ref["text"][: cut + len(stop)]


def test_sampling_fields_are_accepted(api):
    out = api.generate(
        {
            "text": PROMPT,
            "sampling_params": {
                "max_new_tokens": 6,
                "min_new_tokens": 2,
                "temperature": 0.8,
                "top_p": 0.9,
                "top_k": 20,
                "min_p": 0.05,
                "repetition_penalty": 1.1,
                "frequency_penalty": 0.2,
                "presence_penalty": 0.1,
                "ignore_eos": True,
            },
        }
    )
    assert len(out["output_ids"]) == 6


def test_top_k_one_is_greedy(api):
    ref = greedy(api, 8)["output_ids"]
    out = api.generate(
        {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "top_k": 1, "ignore_eos": True}}
    )
    assert out["output_ids"] == ref


def test_n_returns_one_output_per_sample(api):
    outs = api.generate({"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "n": 3, "ignore_eos": True}})
    assert isinstance(outs, list) and len(outs) == 3
    assert all(len(o["output_ids"]) == 4 for o in outs)
    assert len({o["meta_info"]["id"] for o in outs}) == 3


def test_batch_is_prompt_major_with_child_rids(api):
    outs = api.generate(
        {
            "text": [PROMPT, "Hello"],
            "rid": "conf-batch",
            "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True},
        }
    )
    assert [o["meta_info"]["id"] for o in outs] == ["conf-batch_0", "conf-batch_1"]
    assert outs[0]["output_ids"] == greedy(api, 3)["output_ids"]


def test_stream_chunks_are_cumulative_and_end_with_done(api):
    ref = greedy(api, 10)
    chunks = api.stream(
        "/generate",
        {
            "text": PROMPT,
            "stream": True,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True},
        },
    )
    assert chunks
    for before, after in zip(chunks, chunks[1:]):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert before["meta_info"]["finish_reason"] is None
    last = chunks[-1]
    assert last["output_ids"] == ref["output_ids"] and last["text"] == ref["text"]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    assert all(c["meta_info"]["completion_tokens"] == len(c["output_ids"]) for c in chunks)
    assert len(last["meta_info"]["output_token_logprobs"]) == 10


def test_stream_with_n_tags_chunks_with_their_index(api):
    chunks = api.stream(
        "/generate",
        {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 4, "n": 2, "ignore_eos": True}},
    )
    finals = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]
    assert sorted(c["index"] for c in finals) == [0, 1]
    assert {c["index"] for c in chunks} == {0, 1}


@pytest.mark.parametrize(
    "body, field",
    [
        ({"text": "x", "sampling_params": {"not_a_field": 1}}, "not_a_field"),
        ({"text": "x", "sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
        ({"sampling_params": {"max_new_tokens": 2}}, "input_ids"),
    ],
)
def test_refused_requests_get_400_naming_the_field(api, body, field):
    r = api.post("/generate", body)
    assert r.status_code == 400, r.text
    assert field in api.error_message(r.json())
    assert greedy(api, 1)["meta_info"]["completion_tokens"] == 1  # still serving


def test_unknown_path_is_404(api):
    assert api.post("/no_such_route", {}).status_code == 404
