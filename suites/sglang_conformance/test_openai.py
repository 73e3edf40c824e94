"""OpenAI-compatible routes: completions and chat, plain and streaming, with log-probs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # an HTTP server

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Say something."}]


def completion(api, **extra) -> dict:
    body = {"model": api.model_name(), "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = api.post("/v1/completions", dict(body, **extra))
    assert r.status_code == 200, r.text
    return r.json()


def chat(api, **extra) -> dict:
    body = {"model": api.model_name(), "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = api.post("/v1/chat/completions", dict(body, **extra))
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_with_logprobs_and_weight_version(api):
    out = completion(api, logprobs=2)
    choice = out["choices"][0]
    assert out["object"] == "text_completion" and isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 6
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == 6
    assert all(len(top) <= 2 for top in lp["top_logprobs"])
    assert "weight_version" in out["metadata"]


def test_completion_n_gives_indexed_choices(api):
    out = completion(api, n=2, temperature=0.8)
    assert sorted(c["index"] for c in out["choices"]) == [0, 1]
    assert out["usage"]["completion_tokens"] == 12


def test_completion_stream_deltas_add_up(api):
    ref = completion(api)["choices"][0]["text"]
    chunks = api.stream(
        "/v1/completions",
        {
            "model": api.model_name(),
            "prompt": PROMPT,
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert "".join(texts) == ref
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_chat_completion_with_logprobs(api):
    out = chat(api, logprobs=True, top_logprobs=2)
    choice = out["choices"][0]
    assert out["object"] == "chat.completion"
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    content = choice["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] == 6
    assert all({"token", "logprob", "bytes", "top_logprobs"} <= set(c) for c in content)
    assert "weight_version" in out["metadata"]


def test_chat_stream_starts_with_the_role_and_adds_up(api):
    ref = chat(api)["choices"][0]["message"]["content"]
    chunks = api.stream(
        "/v1/chat/completions",
        {
            "model": api.model_name(),
            "messages": MESSAGES,
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        },
    )
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == ref
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_openai_errors_have_the_openai_shape(api):
    r = api.post(
        "/v1/chat/completions", {"model": api.model_name(), "messages": MESSAGES, "top_logprobs": 99, "logprobs": True}
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["object"] == "error" and body["code"] == 400 and "top_logprobs" in body["message"]
