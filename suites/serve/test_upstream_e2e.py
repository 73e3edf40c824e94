"""Upstream Miles end to end through the served CPU engine.

``harness.serve.upstream_e2e`` runs upstream's own ``train_async.py`` loop, rollout
functions (one-step ``InferenceRolloutFn``, ``FullyAsyncRolloutFn``), data source,
``DefaultDataBuffer``, ``MilesRouter`` and ``SGLangEngine`` HTTP client against two
real servers on 127.0.0.1, with ``TorchTrainer`` producing each new version. The three
standard runs (one-step retract with disk updates; fully async retract and in_place
with tensor updates; 5 steps each) run once per module; the tests read what they left.

Every test that runs upstream code needs an upstream Miles tree (``--miles-src``,
``$MILES_SRC`` or the pinned tree beside the repository); without one the ``miles_src``
fixture skips it and says why. Which request lands on which server, and so when an
update meets a request in flight, depends on timing: the assertions hold for every
interleaving, except that a fully-async run must see at least one trained request span
one of its updates (eight runs of each mode measured 7-13 of 80 trained samples here).
"""

from __future__ import annotations

import json

import pytest

from harness.serve.upstream_e2e import STANDARD_RUNS, E2EConfig, age_summary, write_tiny_assets

pytestmark = [pytest.mark.http, pytest.mark.model]

RUNS = {c.name: c for c in STANDARD_RUNS}
ENGINE_CHECKS = {
    "no_generation_while_paused",
    "abort_semantics",
    "kv_versions",
    "token_versions",
    "version_steps",
    "update_outside_generate",
    "conservation_prefix",
}


@pytest.fixture(scope="module")
def runs(miles_src):
    import torch

    from harness.serve.upstream_e2e import run_upstream_e2e

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: run_upstream_e2e(cfg, miles_src=str(miles_src)) for name, cfg in RUNS.items()}
    finally:
        torch.set_num_threads(before)


def test_standard_runs_cover_both_rollout_kinds_both_pause_modes_and_both_transfers():
    assert {(c.fully_async, c.pause_mode) for c in STANDARD_RUNS} == {
        (False, "retract"),
        (True, "retract"),
        (True, "in_place"),
    }
    assert {c.transfer for c in STANDARD_RUNS} == {"disk", "tensor"}
    assert all(c.steps >= 5 and c.servers == 2 for c in STANDARD_RUNS)
    with pytest.raises(Exception, match="refused by upstream"):
        E2EConfig(fully_async=True, pause_mode="abort")


def test_tiny_assets_are_the_char_tokenizer_and_a_llama_config(tmp_path):
    pytest.importorskip("tokenizers", reason="the upstream extra (pip install -e '.[upstream]') is not installed")
    transformers = pytest.importorskip("transformers", reason="the upstream extra is not installed")
    AutoConfig, AutoTokenizer = transformers.AutoConfig, transformers.AutoTokenizer

    from harness.backends.tasks import TINY_TOKENIZER

    hf_dir, prompts = write_tiny_assets(tmp_path, n_prompts=8)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    for text in ("^ab=", "a b?", "12+3: ", "^ccc="):
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == TINY_TOKENIZER.encode(text)
        assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    config = AutoConfig.from_pretrained(hf_dir)
    assert (config.model_type, config.vocab_size) == ("llama", TINY_TOKENIZER.vocab_size)
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    assert len(rows) == 8 and all(r["text"] == f"^{r['label']}=" for r in rows)


def test_age_summary_counts_a_request_spanning_an_update_as_recorded_younger():
    def row(index, group, recorded, versions, current=3):
        return {
            "rollout_id": 0,
            "current_version": current,
            "index": index,
            "group_index": group,
            "recorded": [str(recorded)],
            "recorded_oldest": recorded,
            "true_oldest": min(versions),
            "true_newest": max(versions),
            "tokens": len(versions),
            "calls_matched": True,
            "recorded_matches_calls": True,
            "kv_older_tokens": 0,
            "tokens_older_than_recorded": sum(1 for v in versions if v < recorded),
        }

    rows = [
        row(0, 0, 3, [3, 3, 3]),
        row(1, 0, 3, [2, 2, 3]),  # spans 2 -> 3, recorded 3
        row(2, 1, 3, [1, 2, 3]),
    ]  # spans two updates, recorded 3
    out = age_summary(rows, max_weight_staleness=1)
    assert out["samples_spanning_an_update"] == 2
    assert out["samples_recorded_younger_than_oldest_token"] == 2
    assert out["tokens_older_than_recorded"] == 4
    assert out["max_understatement"] == 2
    # group 1 passes a staleness-1 filter on its recorded version (3 - 3 = 0) but is truly 2 old
    assert (out["groups_trained"], out["groups_truly_staler_than_limit"]) == (2, 1)


def test_the_shard_upstream_hands_the_train_actor_becomes_the_trainers_groups_with_raw_rewards():
    from harness.serve.upstream_e2e import train_groups

    data = {  # what process_rollout_data gives a train actor: per sample, flat, groups consecutive
        "tokens": [[5, 6, 7, 8], [5, 6, 9], [4, 7], [4, 8, 8]],
        "response_lengths": [2, 1, 1, 2],
        "rewards": [1.0, -1.0, -1.0, 1.0],  # upstream's, normalized per group
        "raw_reward": [0.75, 0.25, 0.0, 0.5],
        "rollout_log_probs": [[-0.1, -0.2], [-0.3], [-0.4], [-0.5, -0.6]],
        "sample_indices": [10, 11, 12, 13],
    }
    groups = train_groups(data, 2)
    assert [[s.index for s in g] for g in groups] == [[10, 11], [12, 13]]
    first = groups[0][0]
    assert (first.prompt_tokens, first.response_tokens, first.reward) == ([5, 6], [7, 8], 0.75)
    assert first.rollout_log_probs == [-0.1, -0.2]
    del data["raw_reward"]  # a custom conversion may give only its rewards: those are trained on
    assert [s.reward for g in train_groups(data, 2) for s in g] == [1.0, -1.0, -1.0, 1.0]


@pytest.mark.slow  # starts the router and upstream's orchestration up to the engines' start
def test_a_leaf_gap_inside_an_upstream_actors_constructor_is_a_harness_error_naming_it(miles_src, monkeypatch):
    """Upstream reading a Megatron flag the served run's ``args`` lack (the trainer's parser is
    a leaf) inside ``RolloutManager.__init__``: Ray reports the actor dead, the run reports
    the harness' gap by name and line, not upstream's failure."""
    from harness.serve import upstream_e2e

    real_args = upstream_e2e._args

    def args_without_fp16(*a, **k):
        args = real_args(*a, **k)
        del args.fp16
        return args

    monkeypatch.setattr(upstream_e2e, "_args", args_without_fp16)
    res = upstream_e2e.run_upstream_e2e(E2EConfig(steps=1, servers=1), miles_src=str(miles_src))
    assert res.error is not None and res.error.startswith("harness_error: LeafMissing"), res.error
    assert "`fp16`" in res.error and "sglang_engine.py:L" in res.error
    assert res.steps_trained == 0


@pytest.mark.slow  # upstream training through two HTTP servers
@pytest.mark.parametrize("name", list(RUNS))
def test_upstream_trains_five_steps_through_the_servers(runs, name):
    res = runs[name]
    assert res.error is None, res.error
    assert res.steps_trained == res.config.steps == 5
    # train_async updates once before the first rollout, then after every step
    assert [u["version"] for u in res.updates] == [str(v) for v in range(1, 7)]
    for u in res.updates:
        assert u["read_back"] == [u["version"]] * 2, u  # SGLangEngine.get_weight_version on each server
    assert all(u["max_abs_weight_change"] > 0 for u in res.updates[1:]), res.updates
    for server in res.servers:
        assert server["requests"].get("/generate", 0) > 0, "the router sent this server nothing"


@pytest.mark.slow  # upstream training through two HTTP servers
@pytest.mark.parametrize("name", list(RUNS))
def test_trace_invariants_hold_on_every_server(runs, name):
    for server in runs[name].servers:
        report = server["invariants"]
        assert report["violations"] == [], report["violations"]
        assert ENGINE_CHECKS <= set(report["checkers"]), sorted(report["checkers"])


@pytest.mark.slow  # upstream training through two HTTP servers
@pytest.mark.parametrize("name", list(RUNS))
def test_weight_update_order_in_the_request_log(runs, name):
    cfg = RUNS[name]
    flush = [] if cfg.pause_mode == "in_place" else ["/flush_cache"]
    if cfg.transfer == "disk":
        expected = ["/pause_generation", *flush, "/update_weights_from_disk", "/continue_generation"]
    else:
        expected = [
            "/pause_generation",
            *flush,
            "/begin_weight_update",
            *["/update_weights_from_tensor"] * cfg.buckets,
            "/update_weight_version",
            "/end_weight_update",
            "/continue_generation",
        ]
    for server in runs[name].servers:
        order, calls = server["update_order"], server["requests"]
        assert order["problems"] == []
        assert (order["episodes"], order["modes"]) == (6, [cfg.pause_mode])
        assert order["calls_first_episode"] == expected
        assert calls.get("/flush_cache", 0) == (0 if cfg.pause_mode == "in_place" else 6)
        if not cfg.fully_async:  # one abort_all per rollout to every worker the router lists
            assert calls.get("/abort_request") == cfg.steps


@pytest.mark.slow  # upstream training through two HTTP servers
@pytest.mark.parametrize("name", list(RUNS))
def test_recorded_weight_versions_next_to_per_token_truth(runs, name):
    res = runs[name]
    ages = res.ages
    n = res.config.steps * res.config.rollout_batch_size * res.config.n_samples_per_prompt
    assert ages["samples_trained"] == ages["samples_matched"] == ages["recorded_equals_calls"] == n
    # Miles appends the version at completion: never older than a token, and it is the newest one
    assert ages["samples_recorded_older_than_oldest_token"] == 0
    assert all(r["recorded_oldest"] == r["true_newest"] for r in res.trained)
    if not res.config.fully_async:
        # train_async awaits the next generate before updating: no one-step request spans an update
        assert ages["samples_spanning_an_update"] == 0 and ages["tokens_older_than_recorded"] == 0
    else:
        assert ages["samples_spanning_an_update"] >= 1, "no request was in flight at any of the six updates"
        assert ages["samples_recorded_younger_than_oldest_token"] == ages["samples_spanning_an_update"]
        assert ages["tokens_older_than_recorded"] >= 1 and ages["max_understatement"] >= 1


@pytest.mark.slow  # upstream training through two HTTP servers
@pytest.mark.parametrize("name", list(RUNS))
def test_retract_reprefills_and_in_place_keeps_old_kv(runs, name):
    res = runs[name]
    lp = res.engine["log_probs"]
    own, older = lp["kv_of_own_version"], lp["kv_of_older_version"]
    # a token sampled on KV of its own version equals a fresh forward pass under that version
    assert own["tokens"] > 0 and own["match"] == own["tokens"], lp
    if res.config.pause_mode == "retract":
        assert res.engine["paused_in_place"] == 0 and older["tokens"] == 0
        assert res.ages["tokens_on_older_kv"] == 0
        if res.ages["samples_spanning_an_update"]:
            assert res.engine["retracted"] >= 1
    else:
        assert res.engine["retracted"] == 0 and res.engine["paused_in_place"] >= 1
        assert older["tokens"] == res.ages["tokens_on_older_kv"] >= 1
        assert older["max_abs_diff"] > lp["tolerance"], lp  # old KV under new weights: not a fresh forward
