"""Scheduler state (``/v1/loads``), health, model info and the weight version."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # an HTTP server

LOAD_FIELDS = {
    "dp_rank",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_used_tokens",
    "max_total_num_tokens",
    "max_running_requests",
    "token_usage",
    "gen_throughput",
}


def test_loads_has_sglangs_fields(api):
    body = api.loads()
    assert {"timestamp", "version", "loads"} <= set(body)
    load = body["loads"][0]
    assert LOAD_FIELDS <= set(load), sorted(LOAD_FIELDS - set(load))
    assert {"waiting", "paused", "retracted"} <= set(load["queues"])


def test_loads_counts_a_running_request(api):
    seen = []
    req = {"text": "Hi", "stream": True, "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}}
    for payload in api.stream_lines("/generate", req):
        if payload != "[DONE]" and len(seen) < 1 and json.loads(payload)["meta_info"]["finish_reason"] is None:
            load = api.loads()["loads"][0]
            seen.append((load["num_running_reqs"], load["num_used_tokens"]))
    assert seen and seen[0][0] >= 1 and seen[0][1] > 0


def test_health_and_model_info(api):
    assert api.http.get("/health").status_code == 200
    assert api.http.get("/health_generate").status_code == 200
    info = api.http.get("/model_info").json()
    assert "model_path" in info and "weight_version" in info


@pytest.mark.weight_routes
def test_update_weight_version_shows_in_outputs(api):
    before = api.http.get("/model_info").json()["weight_version"]
    try:
        r = api.post("/update_weight_version", {"new_version": "conformance-7", "abort_all_requests": False})
        assert r.status_code == 200, r.text
        assert api.http.get("/model_info").json()["weight_version"] == "conformance-7"
        out = api.generate({"text": "Hi", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
        assert out["meta_info"]["weight_version"] == "conformance-7"
        spans = out["meta_info"]["weight_versions"]
        assert spans[-1]["version"] == "conformance-7" and spans[-1]["end"] == 2
    finally:
        api.post("/update_weight_version", {"new_version": before or "default", "abort_all_requests": False})
