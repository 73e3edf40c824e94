"""Throughput of the EngineCore's continuous batching vs transformers' ``generate``.

Same model object (a ``LlamaForCausalLM`` shaped like the tiny model, seeded random
weights), same batch of prompts of varying lengths, same number of new tokens per
prompt (sampling at temperature 1, no EOS stop), measured side by side in one run:
one warm-up round each, then ``ROUNDS`` alternating rounds; every sample is kept. The
native ``TinyLM`` path (same sizes, own weights) is reported for reference. Prints a
table, then one JSON document on the last line. Asserts only the token counts.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time

import pytest
import torch

from harness.backends.torch_engine import EngineCore
from harness.backends.torch_models import TinyLM, TinyLMConfig, build_hf_tiny_llama

pytest.importorskip("transformers", reason="the bench compares against transformers' generate")

CFG = TinyLMConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, max_seq_len=128, seed=0)
BATCH = 16
NEW_TOKENS = 64
ROUNDS = 5
PROMPT_LENS = [4 + (7 * i) % 29 for i in range(BATCH)]  # 4..32 tokens


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, CFG.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def run_engine(model, batch: list[list[int]]) -> int:
    core = EngineCore(model, max_running=len(batch))
    for i, p in enumerate(batch):
        core.add_request(i, p, NEW_TOKENS, 1.0, seed=i)
    produced = 0
    while core.has_work():
        produced += sum(len(done.output_tokens) for done in core.step())
    return produced


def run_hf_generate(hf, batch: list[list[int]]) -> int:
    width = max(len(p) for p in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for row, p in enumerate(batch):  # left padding, as generate expects for decoder-only models
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    torch.manual_seed(0)
    out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                      max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0)
    return (out.shape[1] - width) * out.shape[0]


def git_state() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def timed(fn, *args) -> tuple[float, int]:
    t0 = time.perf_counter()
    produced = fn(*args)
    return time.perf_counter() - t0, produced


@pytest.mark.bench
def test_engine_continuous_batching_vs_hf_generate_tokens_per_s(capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # both sides alike; tiny matmuls do not benefit from threads
    try:
        hf_model = build_hf_tiny_llama(CFG)
        native = TinyLM(CFG)
        batch = prompts()
        expected = BATCH * NEW_TOKENS
        runners = {
            "engine(hf model)": lambda: run_engine(hf_model, batch),
            "hf generate": lambda: run_hf_generate(hf_model.hf, batch),
            "engine(native TinyLM)": lambda: run_engine(native, batch),
        }
        samples: dict[str, list[float]] = {name: [] for name in runners}
        with torch.no_grad():
            for name, fn in runners.items():  # warm-up
                assert timed(fn)[1] == expected, name
            for _ in range(ROUNDS):
                for name, fn in runners.items():
                    wall_s, produced = timed(fn)
                    assert produced == expected, f"{name} produced {produced} tokens, expected {expected}"
                    samples[name].append(wall_s)
    finally:
        torch.set_num_threads(threads)

    tokens_per_s = {name: expected / statistics.median(w) for name, w in samples.items()}
    ratio = tokens_per_s["engine(hf model)"] / tokens_per_s["hf generate"]
    doc = {
        "schema_version": 1,
        "bench": "engine_throughput",
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "torch_threads": 1},
        "git": git_state(),
        "config": {"model": {"vocab_size": CFG.vocab_size, "d_model": CFG.d_model, "n_layers": CFG.n_layers,
                             "n_heads": CFG.n_heads, "attn_impl": CFG.attn_impl, "dtype": CFG.dtype},
                   "batch": BATCH, "prompt_lens": PROMPT_LENS, "new_tokens": NEW_TOKENS, "rounds": ROUNDS},
        "wall_s_samples": samples,
        "tokens_per_s_median": tokens_per_s,
        "ratio_engine_over_hf_generate": ratio,
    }
    with capsys.disabled():
        print(f"\n{'runner':<24}{'median wall_s':>14}{'tokens_per_s':>14}")
        for name, w in samples.items():
            print(f"{name:<24}{statistics.median(w):>14.4f}{tokens_per_s[name]:>14.0f}")
        print(f"ratio engine(hf model) / hf generate = {ratio:.2f}x")
        print(json.dumps(doc))
