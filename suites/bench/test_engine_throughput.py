"""Throughput of the EngineCore's continuous batching vs transformers' ``generate``.

Two request mixes, run on the same model object (a ``LlamaForCausalLM`` shaped like the
tiny model, seeded random weights), side by side in one run:

* ``mixed`` (what continuous batching is for): 48 requests, prompts of 4-32 tokens,
  output budgets of 16-128 tokens, sampling at temperature 1 with an EOS token, so
  outputs end at EOS or at their budget. The engine keeps 16 running and admits a
  waiting request as soon as one finishes. ``generate`` runs the same requests as
  static batches of 16 in arrival order, each padded to its longest prompt and run to
  its largest budget (rows that hit EOS keep padding until the whole batch is done).
* ``uniform`` (the old row, kept for reference): 16 requests, 64 new tokens each, no
  EOS, so both sides do the same decode steps and the ratio measures only the decode
  loop against transformers' module stack.

Both count **useful tokens**: each request's output up to and including its EOS,
capped at its own budget. Sampling draws differ between the two sides, so the useful
token counts differ slightly; tokens/s of each side is its own useful tokens over its
wall time. One warm-up round each, then ``ROUNDS`` alternating rounds; every sample is
kept; medians and the ratio come from this one run. Prints a table, then one JSON
document on the last line; with ``MILES_HARNESS_WRITE_RESULTS=1`` the document is also
written to ``results/bench/engine_throughput.json``. Asserts only token accounting.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import pytest
import torch

from harness.backends.torch_engine import EngineCore
from harness.backends.torch_models import TinyLMConfig, build_hf_tiny_llama
from harness.results.schema import git_info, machine_info, utc_now

pytest.importorskip("transformers", reason="the bench compares against transformers' generate")

ROOT = Path(__file__).resolve().parents[2]
CFG = TinyLMConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, max_seq_len=160, seed=0)
MAX_RUNNING = 16
EOS = 2  # with these seeded weights, outputs end at EOS after 2-80 tokens (median ~31)
ROUNDS = 5


def requests(mix: str) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    n = 48 if mix == "mixed" else 16
    out = []
    for i in range(n):
        plen = 4 + (7 * i) % 29
        budget = 16 + (37 * i) % 113 if mix == "mixed" else 64
        out.append({"prompt": torch.randint(3, CFG.vocab_size, (plen,), generator=gen).tolist(), "budget": budget})
    return out


def useful(tokens: list[int], budget: int, eos: int | None) -> int:
    """Output tokens a user keeps: up to and including the first EOS, at most the budget."""
    tokens = tokens[:budget]
    if eos is not None and eos in tokens:
        return tokens.index(eos) + 1
    return len(tokens)


def run_engine(model, reqs: list[dict], eos: int | None) -> int:
    core = EngineCore(model, max_running=MAX_RUNNING, eos_token_id=eos)
    for i, r in enumerate(reqs):
        core.add_request(i, r["prompt"], r["budget"], 1.0, seed=i)
    produced = 0
    while core.has_work():
        produced += sum(useful(done.output_tokens, reqs[done.req_id]["budget"], eos) for done in core.step())
    return produced


def run_hf_generate(hf, reqs: list[dict], eos: int | None) -> int:
    produced = 0
    torch.manual_seed(0)
    for lo in range(0, len(reqs), MAX_RUNNING):  # static batches in arrival order
        batch = reqs[lo : lo + MAX_RUNNING]
        width = max(len(r["prompt"]) for r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, r in enumerate(batch):  # left padding, as generate expects for decoder-only models
            ids[row, width - len(r["prompt"]) :] = torch.tensor(r["prompt"])
            mask[row, width - len(r["prompt"]) :] = 1
        longest = max(r["budget"] for r in batch)
        kw = {"eos_token_id": eos} if eos is not None else {"eos_token_id": None, "min_new_tokens": longest}
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=longest,
            pad_token_id=0,
            **kw,
        )
        produced += sum(useful(out[row, width:].tolist(), r["budget"], eos) for row, r in enumerate(batch))
    return produced


def timed(fn) -> tuple[float, int]:
    t0 = time.perf_counter()
    produced = fn()
    return time.perf_counter() - t0, produced


@pytest.mark.bench
def test_engine_continuous_batching_vs_hf_generate_useful_tokens_per_s(capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # both sides alike; tiny matmuls do not benefit from threads
    try:
        hf_model = build_hf_tiny_llama(CFG)
        mixes = {"mixed": (requests("mixed"), EOS), "uniform": (requests("uniform"), None)}
        runners = {
            (mix, side): (lambda fn=fn, r=r, e=e: fn(hf_model if fn is run_engine else hf_model.hf, r, e))
            for mix, (r, e) in mixes.items()
            for side, fn in (("engine", run_engine), ("hf generate", run_hf_generate))
        }
        walls: dict = {key: [] for key in runners}
        tokens: dict = {key: [] for key in runners}
        with torch.no_grad():
            for fn in runners.values():  # warm-up
                fn()
            for _ in range(ROUNDS):
                for key, fn in runners.items():
                    wall_s, produced = timed(fn)
                    walls[key].append(wall_s)
                    tokens[key].append(produced)
    finally:
        torch.set_num_threads(threads)

    rows = {}
    for mix, (reqs, eos) in mixes.items():
        budget = sum(r["budget"] for r in reqs)
        row = {}
        for side in ("engine", "hf generate"):
            toks, w = tokens[(mix, side)], walls[(mix, side)]
            assert all(0 < t <= budget for t in toks), (mix, side, toks)
            if eos is None:  # no EOS: every request decodes exactly its budget on both sides
                assert toks == [budget] * ROUNDS, (mix, side, toks)
            row[side] = {
                "useful_tokens": toks,
                "wall_s": w,
                "tokens_per_s_median": statistics.median(t / s for t, s in zip(toks, w)),
            }
        row["ratio_engine_over_hf_generate"] = (
            row["engine"]["tokens_per_s_median"] / row["hf generate"]["tokens_per_s_median"]
        )
        rows[mix] = row
    doc = {
        "schema_version": 2,
        "bench": "engine_throughput",
        "machine": {
            **machine_info(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": 1,
        },
        "git": git_info(),
        "recorded_utc": utc_now(),
        "config": {
            "model": {
                "vocab_size": CFG.vocab_size,
                "d_model": CFG.d_model,
                "n_layers": CFG.n_layers,
                "n_heads": CFG.n_heads,
                "attn_impl": CFG.attn_impl,
                "dtype": CFG.dtype,
            },
            "max_running": MAX_RUNNING,
            "eos_token_id": EOS,
            "rounds": ROUNDS,
            "mixes": {
                m: {
                    "requests": len(r),
                    "prompt_lens": [len(x["prompt"]) for x in r],
                    "budgets": [x["budget"] for x in r],
                    "eos": e is not None,
                }
                for m, (r, e) in mixes.items()
            },
        },
        "rows": rows,
    }
    if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1":
        out = ROOT / "results" / "bench" / "engine_throughput.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    with capsys.disabled():
        print(f"\n{'mix':<9}{'side':<13}{'useful tokens':>14}{'median wall_s':>14}{'tokens_per_s':>13}")
        for mix, row in rows.items():
            for side in ("engine", "hf generate"):
                r = row[side]
                print(
                    f"{mix:<9}{side:<13}{statistics.median(r['useful_tokens']):>14.0f}"
                    f"{statistics.median(r['wall_s']):>14.4f}{r['tokens_per_s_median']:>13.0f}"
                )
            print(f"{mix:<9}ratio engine / hf generate = {row['ratio_engine_over_hf_generate']:.2f}x")
        print(json.dumps(doc))
