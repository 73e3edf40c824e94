"""The served engine's pieces without HTTP: SGLang's sampling fields, stop conditions,
abort of one request with its tokens, the byte-fallback tokenizer, output text trimming.
References are computed here from the same seeded tiny model (``EngineCore`` and plain
torch)."""

from __future__ import annotations

import pytest
import torch

from miles_async_core.types import Status

from harness.backends.torch_engine import EngineCore
from harness.backends.torch_models import TinyLMConfig, build_tiny_lm
from harness.serve.responses import output_text, stop_prefix_pending
from harness.serve.sampling import SamplingOptions, choose_tokens, parse_sampling
from harness.serve.served_core import ServedCore
from harness.serve.served_errors import ServeError
from harness.serve.tokenizer import TINY_SERVE_TOKENIZER as TOK

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = TOK.vocab_size
PROMPT = TOK.encode("abc=")


def model(seed: int = 0):
    return build_tiny_lm(TinyLMConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2, d_ff=64, seed=seed))


def run(core, req_id="r", prompt=PROMPT, max_new=12, temperature=1.0, seed=3, **params):
    opts = parse_sampling(
        dict(params, max_new_tokens=max_new, temperature=temperature), eos_token_id=core.eos_token_id, vocab_size=VOCAB
    )
    core.add_request(req_id, prompt, max_new, temperature, seed, options=opts)
    done = []
    while core.has_work():
        done += core.step()
    return done[0]


def test_neutral_options_sample_exactly_what_the_harness_engine_samples():
    m = model()
    ref_core = EngineCore(m, max_running=2)
    ref_core.add_request("r", PROMPT, 12, 1.0, 3)
    ref = []
    while ref_core.has_work():
        ref += ref_core.step()
    out = run(ServedCore(m, max_running=2))
    assert out.output_tokens == ref[0].output_tokens
    assert out.log_probs == pytest.approx(ref[0].log_probs, abs=1e-6)


def test_top_k_one_is_greedy_and_top_p_min_p_keep_only_likely_tokens():
    m = model()
    greedy = run(ServedCore(m), temperature=0.0).output_tokens
    assert run(ServedCore(m), top_k=1).output_tokens == greedy
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))

    class R:  # one request row
        prompt_tokens, output_tokens = [0], []

    for params, allowed in (({"top_p": 0.7}, {0, 1}), ({"min_p": 0.5}, {0, 1}), ({"top_k": 3}, {0, 1, 2})):
        R.options = parse_sampling(params, eos_token_id=None, vocab_size=4)
        seen = {
            choose_tokens(logits, [R], [torch.Generator().manual_seed(s)], eos_token_id=None)[0][0] for s in range(200)
        }
        assert seen == allowed, params


def test_penalties_move_the_logits_as_sglang_defines_them():
    class R:
        prompt_tokens, output_tokens = [0], [1, 1, 2]

    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5]])
    R.options = parse_sampling({"temperature": 0, "repetition_penalty": 2.0}, eos_token_id=None, vocab_size=4)
    _, _, logp = choose_tokens(logits, [R], [torch.Generator()], eos_token_id=None)
    assert torch.allclose(logp[0], torch.log_softmax(torch.tensor([1.0, 0.5, -2.0, 0.5]), -1))
    R.options = parse_sampling(
        {"temperature": 0, "frequency_penalty": 1.0, "presence_penalty": 0.5}, eos_token_id=None, vocab_size=4
    )
    _, _, logp = choose_tokens(logits, [R], [torch.Generator()], eos_token_id=None)
    assert torch.allclose(logp[0], torch.log_softmax(torch.tensor([2.0, -1.5, -2.5, 0.5]), -1))
    assert torch.equal(logits, torch.tensor([[2.0, 1.0, -1.0, 0.5]]))  # the model's output is untouched


def test_min_new_tokens_masks_eos_and_stop_tokens_until_reached():
    class R:
        prompt_tokens, output_tokens = [0], [3]

    logits = torch.tensor([[0.0, 0.0, 9.0, 0.0]])
    R.options = parse_sampling({"temperature": 0, "min_new_tokens": 2}, eos_token_id=2, vocab_size=4)
    assert choose_tokens(logits, [R], [torch.Generator()], eos_token_id=2)[0] != [2]
    R.output_tokens = [3, 3]
    assert choose_tokens(logits, [R], [torch.Generator()], eos_token_id=2)[0] == [2]


def test_stop_token_ids_ignore_eos_and_stop_strings():
    m = model()
    greedy = run(ServedCore(m), temperature=0.0, max_new=16).output_tokens
    tok = greedy[4]
    core = ServedCore(m)
    out = run(core, temperature=0.0, max_new=16, stop_token_ids=[tok])
    assert out.output_tokens == greedy[: greedy.index(tok) + 1] and out.status is Status.COMPLETED
    assert core.matched["r"] == tok
    eos_core = ServedCore(m, eos_token_id=tok)
    assert run(eos_core, temperature=0.0, max_new=16).status is Status.COMPLETED
    assert (
        run(eos_core, "x", temperature=0.0, max_new=16, ignore_eos=True, stop_token_ids=[tok]).output_tokens == greedy
    )
    text = TOK.decode(greedy)
    stop = text[5:7]
    core = ServedCore(m, decode_text=TOK.decode)
    out = run(core, temperature=0.0, max_new=16, stop=[stop])
    assert stop in TOK.decode(out.output_tokens) and core.matched["r"] == stop
    assert stop not in TOK.decode(out.output_tokens[:-1])


def test_abort_one_returns_the_tokens_so_far_running_or_waiting():
    core = ServedCore(model(), max_running=1)
    for rid in ("a", "b"):
        core.add_request(rid, PROMPT, 50, 1.0, 1, options=SamplingOptions(max_new_tokens=50))
    for _ in range(3):
        core.step()
    done, where = core.abort_one("a")
    assert (where, len(done.output_tokens), done.status) == ("running", 3, Status.ABORTED)
    core.pause("retract")  # nothing runs; "b" waits with no tokens
    done, where = core.abort_one("b")
    assert (where, done.output_tokens) == ("waiting", [])
    assert core.abort_one("a") is None and not core.has_work()


def test_a_retracted_request_aborts_from_the_waiting_queue_with_its_tokens():
    core = ServedCore(model(), max_running=2)
    core.add_request("r", PROMPT, 50, 1.0, 1, options=SamplingOptions(max_new_tokens=50))
    for _ in range(4):
        core.step()
    core.pause("retract")
    done, where = core.abort_one("r")
    assert where == "waiting" and len(done.output_tokens) == 4 and done.token_versions.runs == [[0, 0, 4]]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"top_q": 1}, "top_q"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"min_new_tokens": 9, "max_new_tokens": 2}, "min_new_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"stop_token_ids": [VOCAB]}, "stop_token_ids"),
        ({"stop": 3}, "stop"),
        ({"regex": "a+"}, "regex"),
        ({"n": 0}, "n"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
    ],
)
def test_refused_sampling_fields_name_the_field(params, field):
    with pytest.raises(ServeError, match=field):
        parse_sampling(params, eos_token_id=2, vocab_size=VOCAB)


def test_the_tokenizer_takes_any_text_and_keeps_the_character_ids():
    from harness.backends.tasks import TINY_TOKENIZER

    assert TOK.encode("abc=12") == TINY_TOKENIZER.encode("abc=12")
    for text in ("Hello, wörld! 你好 🙂", "", "\n\t\x00"):
        assert TOK.decode(TOK.encode(text)) == text
    assert all(0 <= t < VOCAB for t in TOK.encode("🙂"))
    assert TOK.decode([1, 5, 2], skip_special_tokens=False) == "<bos>c<eos>"
    assert TOK.apply_chat_template([{"role": "user", "content": "hi"}]) == "user: hi\nassistant: "


def test_output_text_cuts_stop_strings_and_tokens_unless_no_stop_trim():
    ids = TOK.encode("abc=12")
    opts = SamplingOptions()
    assert output_text(TOK.decode, ids, opts, matched="c=") == "ab"
    assert output_text(TOK.decode, ids, SamplingOptions(no_stop_trim=True), matched="c=") == "abc="
    assert output_text(TOK.decode, ids, opts, matched=ids[-1]) == "abc=1"
    assert stop_prefix_pending("abc=", ("=12",)) and not stop_prefix_pending("abc", ("=12",))


# --- /generate's request expansion (the route's logic on a real engine, no HTTP) ---------------------
@pytest.fixture(scope="module")
def engine():
    from harness.serve.server import build_engine

    return build_engine("tiny", eos_token_id=None)


def expand(engine, **body):
    from harness.serve.generate_routes import GenerateReq, expand as expand_request

    return expand_request(engine, GenerateReq(**body))


def test_one_prompt_is_one_output_without_index(engine):
    params, listed = expand(engine, text="hi", rid="a", sampling_params={"max_new_tokens": 3})
    assert not listed and [(p.rid, p.index, p.input_ids) for p in params] == [("a", None, TOK.encode("hi"))]


def test_n_and_batches_are_prompt_major_with_sglangs_rids(engine):
    params, listed = expand(engine, text=["a", "b"], rid="x", sampling_params={"max_new_tokens": 2})
    assert listed and [(p.rid, p.index) for p in params] == [("x_0", 0), ("x_1", 1)]
    params, _ = expand(engine, input_ids=[[5, 6], [7]], rid=["p", "q"], sampling_params={"n": 2, "max_new_tokens": 2})
    assert [p.index for p in params] == [0, 1, 2, 3]
    assert [p.input_ids for p in params] == [[5, 6], [5, 6], [7], [7]]
    assert len({p.rid for p in params}) == 4 and all(len(p.rid) == 32 for p in params)  # fresh uuid4 hex each
    assert len({p.seed for p in params}) == 4  # no sampling_seed: each sample its own


def test_max_new_tokens_is_clamped_only_when_not_given(engine):
    long_prompt = [5] * (engine.context_length - 10)
    params, _ = expand(engine, input_ids=long_prompt)
    assert params[0].options.max_new_tokens == 9  # SGLang: prompt + max_new_tokens < context length
    assert (
        expand(engine, input_ids=long_prompt, sampling_params={"max_new_tokens": 9})[0][0].options.max_new_tokens == 9
    )
    with pytest.raises(ServeError, match="max_new_tokens"):
        expand(engine, input_ids=long_prompt, sampling_params={"max_new_tokens": 10})


@pytest.mark.parametrize(
    "body, words",
    [
        ({}, "text or input_ids"),
        ({"input_ids": [[1], [2]], "rid": ["a"]}, "rid"),
        ({"input_ids": [[1], [2]], "sampling_params": [{"n": 1}, {"n": 2}]}, "n differs"),
        ({"input_ids": [1, 10_000]}, "outside the vocabulary"),
        ({"input_ids": [1], "lora_path": "x"}, "lora_path"),
        ({"input_ids": [[1], [2]], "rid": ["a", "a"]}, "rid repeats"),
    ],
)
def test_refused_generate_requests_say_why(engine, body, words):
    with pytest.raises(ServeError, match=words):
        expand(engine, **body)


# --- incremental stream text and the stop-string window (what the server decodes per step) -----------
def _random_outputs(seed: int, count: int = 60) -> list[list[int]]:
    """Token lists over the byte-fallback tokenizer: vocabulary characters, multi-byte
    characters as byte tokens, special tokens (which decode to nothing) and stray bytes."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        ids: list[int] = []
        for _ in range(rng.randint(1, 120)):
            kind = rng.random()
            if kind < 0.55:
                ids.append(rng.randint(3, 29))
            elif kind < 0.85:
                ids += TOK.encode(rng.choice("éß→中😀"))
            elif kind < 0.95:
                ids.append(rng.randint(0, 2))
            else:
                ids.append(TOK.byte_offset + rng.randint(128, 255))
        out.append(ids)
    return out


def test_incremental_stream_text_is_always_a_prefix_and_ends_as_the_whole_decode():
    from harness.serve.responses import IncrementalText

    for ids in _random_outputs(1):
        detok, shown = IncrementalText(TOK.decode), ""
        for k in range(1, len(ids) + 1):
            text = detok.update(ids[:k])
            assert text.startswith(shown) and TOK.decode(ids[:k]).startswith(text)
            shown = text
        whole = TOK.decode(ids)
        assert shown == whole.rstrip("\ufffd")


def test_the_stop_window_finds_a_stop_string_at_the_same_token_as_the_whole_text():
    from harness.serve.responses import stop_window_text

    import random

    rng = random.Random(7)
    for ids in _random_outputs(2):
        whole = TOK.decode(ids)
        picks = [whole[i : i + n] for n in (1, 2, 5) for i in [rng.randrange(max(1, len(whole)))]]
        stops = tuple(s for s in picks if s and "\ufffd" not in s) or ("zz",)
        first_whole = next((k for k in range(1, len(ids) + 1) if any(s in TOK.decode(ids[:k]) for s in stops)), None)
        first_window = next(
            (
                k
                for k in range(1, len(ids) + 1)
                if any(s in stop_window_text(TOK.decode, ids[:k], max(map(len, stops))) for s in stops)
            ),
            None,
        )
        assert first_window == first_whole, (ids, stops)
