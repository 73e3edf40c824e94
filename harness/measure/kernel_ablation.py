"""Kernel-level ablation of the trainer-engine gap with identical weights.

Contract. Every row compares two log-probs of the same tokens under the same weights:
the *engine path* (``EngineCore``: one-shot prefill of the prompt, then incremental
decode over the slot KV cache, continuously batched with requests of other lengths;
log-probs recorded at sampling time) and the *trainer path* (``response_log_probs``:
one padded full forward). Rows switch one factor at a time away from the baseline
(fp32, the model's default attention, batched, one-shot prefill):

* ``dtype``: engine and trainer both in bf16 / fp16 (what an RL system that runs both
  sides in that dtype sees), and the engine in that dtype against an fp32 trainer;
* ``attention``: eager instead of SDPA on both sides; on CUDA also every
  ``torch.nn.attention.SDPBackend`` (math / efficient / flash) forced on both sides,
  once per requested dtype; a backend that refuses the inputs is reported, not hidden;
* ``batch``: each sequence decoded alone (``max_running=1``): batch invariance;
* ``prefill``: the prompt fed through the decode path one token at a time (the
  ``EngineModel`` interface prefills from position 0 only, so chunk size 1 is the one
  chunking it can express), batch of one: compare with the ``batch/alone`` row;
* ``matmul``: TF32 matmuls on both sides (CUDA, fp32); ``n/a (CPU)`` on the CPU;
* ``true_on_policy``: the trainer recomputes through the engine's own incremental
  decode, batch of one, same dtype, same order of operations: the gap must be exactly
  zero (``torch.equal`` on the float32 log-probs).

Each row reports ``abs_diff_mean``/``abs_diff_max`` (pooled over tokens),
``train_rollout_logprob_abs_diff`` and ``train_rollout_kl`` (Miles' k3, sample-mean
reduced), ``tis_p99``/``tis_max``, the fraction of bitwise-equal tokens, and what a
MIS correction (``examples/train_infer_mismatch_helper/mis.py`` with its ``mis.yaml``
defaults: token-level TIS truncated at 2, rejection outside [0.5, 2], veto below 1e-4)
would make of this gap: ``mis_rs_mask_fraction`` (share of tokens its rejection sampling
masks; table column "MIS rejected"), ``mis_rs_catastrophic_seq_fraction`` (share of
sequences its veto drops; "MIS vetoed") and, in the rows only, ``mis_chi2_token``
(mis.py's per-sequence mean rho^2 - 1, an estimate that can dip below 0 at float-noise gaps);
the per-sequence mean |Δlogp| list is the raw sample set for ``harness.results.schema``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.measure.logprob_metrics import gap_report
from harness.backends.torch_engine import EngineCore
from harness.backends.torch_models import EngineModel
from harness.backends.torch_trainer import response_log_probs
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DEVICES = ("cpu", "cuda")
SDPA_BACKENDS = ("math", "efficient", "flash")


@dataclass(frozen=True, kw_only=True)
class AblationConfig:
    model: str = "tiny"
    device: str = "cpu"
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    num_seqs: int = 16
    max_new_tokens: int = 32
    temperature: float = 1.0
    seed: int = 0
    tiny_d_model: int = 128
    tiny_layers: int = 4

    def __post_init__(self) -> None:
        bad = [d for d in self.dtypes if d not in DTYPES]
        if bad or not self.dtypes:
            raise ConfigError(
                f"--dtypes {','.join(self.dtypes)!r}: allowed {', '.join(DTYPES)} (comma list); "
                f"fix: e.g. --dtypes fp32,bf16"
            )
        if self.device not in DEVICES:
            raise ConfigError(f"--device {self.device!r}: allowed {', '.join(DEVICES)}; fix: --device cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                "--device cuda: torch sees no CUDA device here (CPU build or no GPU); "
                "fix: run with --device cpu or on a GPU machine with a CUDA torch"
            )
        if self.num_seqs < 2 or self.max_new_tokens < 2:
            raise ConfigError(
                f"--num-seqs {self.num_seqs} / --max-new-tokens {self.max_new_tokens}: both must be "
                ">= 2 (batching needs two requests, a gap needs tokens); fix: e.g. --num-seqs 8"
            )
        if self.temperature <= 0:
            raise ConfigError(f"temperature={self.temperature}: must be > 0 to score sampled tokens")


# --- models with identical weights ------------------------------------------------------


class ModelSource:
    """Builds the same weights in any dtype / attention implementation, and the prompts."""

    default_attn = "sdpa"
    name: str  # shown in the gap table and stored in the results file

    def build(self, dtype: str, attn_impl: str) -> EngineModel:
        raise NotImplementedError

    def prompts(self, rng: random.Random, n: int) -> list[list[int]]:
        raise NotImplementedError


class TinySource(ModelSource):
    def __init__(self, cfg: AblationConfig) -> None:
        from harness.backends.tasks import TINY_TOKENIZER

        self.cfg, self.vocab_size = cfg, TINY_TOKENIZER.vocab_size
        self.name = f"tiny(d_model={cfg.tiny_d_model},layers={cfg.tiny_layers})"

    def build(self, dtype: str, attn_impl: str) -> EngineModel:
        from harness.backends.torch_models import TinyLM, TinyLMConfig

        c = self.cfg
        return TinyLM(
            TinyLMConfig(
                vocab_size=self.vocab_size,
                d_model=c.tiny_d_model,
                n_layers=c.tiny_layers,
                d_ff=c.tiny_d_model * 11 // 4,
                max_seq_len=16 + c.max_new_tokens,
                attn_impl=attn_impl,
                dtype=DTYPES[dtype],
                seed=c.seed,
            ),
            device=c.device,
        )

    def prompts(self, rng: random.Random, n: int) -> list[list[int]]:
        return [[rng.randrange(3, self.vocab_size) for _ in range(rng.randint(2, 16))] for _ in range(n)]


class HFSource(ModelSource):
    """SmolLM2 (``smollm2``) or a local HF directory, loaded once in fp32 on the CPU."""

    def __init__(self, cfg: AblationConfig) -> None:
        from harness.backends import torch_models as tm

        self.cfg, self.name = cfg, cfg.model
        base = tm.load_smollm2() if cfg.model == "smollm2" else tm.load_hf_dir(cfg.model)
        self.base_hf = base.hf
        self.tokenizer = tm.load_smollm2_tokenizer() if cfg.model == "smollm2" else _hf_tokenizer(cfg.model)

    def build(self, dtype: str, attn_impl: str) -> EngineModel:
        from harness.backends.torch_models import HFCausalLM, resolve_dtype

        hf = copy.deepcopy(self.base_hf).to(device=self.cfg.device, dtype=resolve_dtype(DTYPES[dtype]))
        hf.set_attn_implementation(attn_impl)
        # The direct decode always calls SDPA; eager needs transformers' own attention.
        fast = None if attn_impl == "sdpa" else False
        return HFCausalLM(hf, max_seq_len=128 + self.cfg.max_new_tokens, fast_decode=fast)

    def prompts(self, rng: random.Random, n: int) -> list[list[int]]:
        from harness.backends.tasks import ArithmeticTask

        task = ArithmeticTask(tokenizer=self.tokenizer, max_operand=999)
        return [s.prompt_tokens for s in task.sample_prompts(rng, n)]


def _hf_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def make_source(cfg: AblationConfig) -> ModelSource:
    return TinySource(cfg) if cfg.model == "tiny" else HFSource(cfg)


# --- the two paths ----------------------------------------------------------------------


def engine_generate(
    model: EngineModel, prompts: list[list[int]], budgets: list[int], *, max_running: int, temperature: float, seed: int
) -> list[Sample]:
    """Sample continuations through ``EngineCore``; rollout log-probs as the engine reports them."""
    core = EngineCore(model, max_running=max_running, eos_token_id=None)
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        core.add_request(i, p, b, temperature, seed=seed * 1_000_003 + i)
    samples = [Sample(prompt_tokens=list(p), index=i) for i, p in enumerate(prompts)]
    while core.has_work():
        for done in core.step():
            s = samples[done.req_id]
            s.response_tokens, s.rollout_log_probs = list(done.output_tokens), list(done.log_probs)
    return samples


def trainer_log_probs(model: EngineModel, samples: list[Sample], temperature: float) -> list[torch.Tensor]:
    with torch.no_grad():
        return [lp.float().cpu() for lp in response_log_probs(model, samples, temperature)]


@torch.no_grad()
def replay_log_probs(
    model: EngineModel,
    sample: Sample,
    temperature: float,
    *,
    token_prefill: bool = False,
) -> torch.Tensor:
    """Teacher-forced engine path, batch of one: prefill ``prompt[:-1]`` (in one go, or
    token by token through ``decode`` with ``token_prefill``), then decode every response
    token, with the engine's own log-prob arithmetic (``torch_engine.sample_tokens``)."""
    model.alloc_cache(1)
    seq = list(sample.prompt_tokens) + list(sample.response_tokens)
    n_prefix, dev = len(sample.prompt_tokens) - 1, model.device

    def decode(pos: int) -> torch.Tensor:
        return model.decode(torch.tensor([pos], device=dev), torch.tensor([seq[pos]], device=dev))

    if token_prefill and n_prefix > 0:
        model.prefill([0], [seq[:1]])
        for pos in range(1, n_prefix):
            decode(pos)
    else:
        model.prefill([0], [seq[:n_prefix]])
    temps = torch.tensor([temperature], dtype=torch.float32)
    out = []
    for j, target in enumerate(sample.response_tokens):
        logp = torch.log_softmax(decode(n_prefix + j).float() / temps.to(dev).view(-1, 1), dim=-1)
        out.append(logp[0, target])
    return torch.stack(out).float().cpu()


# --- rows -------------------------------------------------------------------------------


def gap_row(
    factor: str,
    setting: str,
    engine: str,
    trainer: str,
    samples: list[Sample],
    train: list[torch.Tensor],
    note: str = "",
) -> dict[str, Any]:
    rollout = [torch.tensor(s.rollout_log_probs, dtype=torch.float32) for s in samples]
    rep = gap_report(train, rollout)
    equal = sum(int((t == r).sum()) for t, r in zip(train, rollout))
    n_tokens = sum(r.numel() for r in rollout)
    return {
        "factor": factor,
        "setting": setting,
        "engine": engine,
        "trainer": trainer,
        "note": note,
        "num_seqs": len(samples),
        "num_tokens": n_tokens,
        "abs_diff_mean": rep.abs_diff_mean,
        "abs_diff_max": rep.abs_diff_max,
        "train_rollout_logprob_abs_diff": rep.train_rollout_logprob_abs_diff,
        "train_rollout_kl": rep.train_rollout_kl,
        "tis_p99": rep.tis_p99,
        "tis_max": rep.tis_max,
        "mis_chi2_token": rep.mis.get("mis_chi2_token", 0.0),
        "mis_rs_mask_fraction": (
            rep.mis.get("mis_rs_mask_fraction_low", 0.0) + rep.mis.get("mis_rs_mask_fraction_high", 0.0)
        ),
        "mis_rs_catastrophic_seq_fraction": rep.mis.get("mis_rs_catastrophic_seq_fraction", 0.0),
        "bitwise_equal_fraction": equal / n_tokens if n_tokens else 1.0,
        "all_bitwise_equal": all(torch.equal(t, r) for t, r in zip(train, rollout)),
        "per_seq_abs_diff": [float((t.double() - r.double()).abs().mean()) for t, r in zip(train, rollout)],
    }


def na_row(factor: str, setting: str, note: str) -> dict[str, Any]:
    keys = (
        "abs_diff_mean",
        "abs_diff_max",
        "train_rollout_logprob_abs_diff",
        "train_rollout_kl",
        "tis_p99",
        "tis_max",
        "mis_chi2_token",
        "mis_rs_mask_fraction",
        "mis_rs_catastrophic_seq_fraction",
        "bitwise_equal_fraction",
        "all_bitwise_equal",
    )
    return {
        "factor": factor,
        "setting": setting,
        "engine": "-",
        "trainer": "-",
        "note": note,
        "num_seqs": 0,
        "num_tokens": 0,
        **dict.fromkeys(keys),
        "per_seq_abs_diff": [],
    }


@contextlib.contextmanager
def _sdpa_backend(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "math": SDPBackend.MATH,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
    }[name]
    with sdpa_kernel(backend):
        yield


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class Ablation:
    """Runs the rows of one ``AblationConfig``; ``on_row(label)`` is told each row's name."""

    def __init__(
        self, cfg: AblationConfig, source: ModelSource | None = None, on_row: Callable[[str], None] | None = None
    ) -> None:
        self.cfg, self.source = cfg, source or make_source(cfg)
        self.on_row = on_row or (lambda _label: None)
        rng = random.Random(cfg.seed)
        self.prompts = self.source.prompts(rng, cfg.num_seqs)
        step = max(1, cfg.max_new_tokens // 8)
        self.budgets = [cfg.max_new_tokens - (i % 4) * step for i in range(cfg.num_seqs)]

    def _generate(self, model: EngineModel, *, alone: bool) -> list[Sample]:
        c = self.cfg
        max_running = 1 if alone else max(2, c.num_seqs // 2)  # requests join as others leave
        return engine_generate(
            model, self.prompts, self.budgets, max_running=max_running, temperature=c.temperature, seed=c.seed
        )

    def paired(
        self,
        factor: str,
        setting: str,
        *,
        dtype: str = "fp32",
        attn: str | None = None,
        trainer_dtype: str | None = None,
        trainer_attn: str | None = None,
        alone: bool = False,
    ) -> dict[str, Any]:
        """Engine (batched or alone) vs trainer full forward; same weights (a trainer in
        another dtype holds the same fp32 weights cast to its dtype)."""
        self.on_row(f"{factor}/{setting}")
        attn = attn or self.source.default_attn
        t_dtype, t_attn = trainer_dtype or dtype, trainer_attn or attn
        engine_model = self.source.build(dtype, attn)
        samples = self._generate(engine_model, alone=alone)
        same = (t_dtype, t_attn) == (dtype, attn)
        trainer_model = engine_model if same else self.source.build(t_dtype, t_attn)
        train = trainer_log_probs(trainer_model, samples, self.cfg.temperature)
        batch = "alone" if alone else "batched"
        return gap_row(factor, setting, f"{dtype} {attn} {batch}", f"{t_dtype} {t_attn} full forward", samples, train)

    def replayed(self, factor: str, setting: str, *, dtype: str, token_prefill: bool) -> dict[str, Any]:
        """Alone-generated samples; ``token_prefill``: the engine side is the replay with
        token-by-token prefill vs the trainer's full forward; else the true on-policy
        check (engine log-probs vs the trainer's replay through the same decode path)."""
        self.on_row(f"{factor}/{setting}")
        model = self.source.build(dtype, self.source.default_attn)
        samples = self._generate(model, alone=True)
        replay = [replay_log_probs(model, s, self.cfg.temperature, token_prefill=token_prefill) for s in samples]
        if token_prefill:
            chunked = [
                Sample(
                    prompt_tokens=s.prompt_tokens,
                    response_tokens=s.response_tokens,
                    rollout_log_probs=r.tolist(),
                    index=s.index,
                )
                for s, r in zip(samples, replay)
            ]
            train = trainer_log_probs(model, chunked, self.cfg.temperature)
            return gap_row(
                factor, setting, f"{dtype} token-by-token prefill, alone", f"{dtype} full forward", chunked, train
            )
        return gap_row(factor, setting, f"{dtype} decode, alone", f"{dtype} same decode path, alone", samples, replay)

    def rows(self) -> list[dict[str, Any]]:
        c, cuda = self.cfg, self.cfg.device == "cuda"
        rows = [self.paired("baseline", "fp32")]
        for d in (d for d in c.dtypes if d != "fp32"):
            rows.append(self.paired("dtype", f"{d} (engine+trainer)", dtype=d))
            rows.append(self.paired("dtype", f"{d} engine vs fp32 trainer", dtype=d, trainer_dtype="fp32"))
        rows.append(self.paired("attention", "eager", attn="eager"))
        rows.append(self.paired("attention", "sdpa engine vs eager trainer", attn="sdpa", trainer_attn="eager"))
        for backend in SDPA_BACKENDS if cuda else ():
            for d in c.dtypes:
                rows.append(
                    self._guarded(
                        f"sdpa {backend} {d}",
                        backend,
                        functools.partial(self.paired, "attention", f"sdpa {backend} {d}", dtype=d, attn="sdpa"),
                    )
                )
        rows.append(self.paired("batch", "alone", alone=True))
        rows.append(self.replayed("prefill", "token-by-token", dtype="fp32", token_prefill=True))
        if cuda:
            with _tf32(True):
                rows.append(self.paired("matmul", "tf32 on"))
        else:
            rows.append(na_row("matmul", "tf32 on", "n/a (CPU)"))
        for d in c.dtypes:
            rows.append(self.replayed("true_on_policy", d, dtype=d, token_prefill=False))
        return rows

    def _guarded(self, setting: str, backend: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            with _sdpa_backend(backend):
                return fn()
        except RuntimeError as exc:  # e.g. flash refuses an explicit mask or fp32
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return na_row("attention", setting, f"backend refused: {first[:120]}")


# --- output -------------------------------------------------------------------------------

COLUMNS = (
    ("factor", "factor", "s"),
    ("setting", "setting", "s"),
    ("mean |dlogp|", "abs_diff_mean", ".2e"),
    ("max |dlogp|", "abs_diff_max", ".2e"),
    ("k3 KL", "train_rollout_kl", ".2e"),
    ("tis p99", "tis_p99", ".6f"),
    ("tis max", "tis_max", ".6f"),
    ("MIS rejected", "mis_rs_mask_fraction", ".2%"),
    ("MIS vetoed", "mis_rs_catastrophic_seq_fraction", ".1%"),
    ("bitwise equal", "bitwise_equal_fraction", ".1%"),
    ("note", "note", "s"),
)


def _cell(v: Any, spec: str) -> str:
    if v is None:
        return "n/a"
    return format(v, spec) if isinstance(v, float) else str(v)


def format_table(rows: list[dict[str, Any]], *, markdown: bool = False) -> str:
    header = [c[0] for c in COLUMNS]
    body = [[_cell(r.get(k), f) for _, k, f in COLUMNS] for r in rows]
    if markdown:  # a literal "|" inside a cell would split it

        def esc(cells: list[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        return "\n".join([esc(header), "|" + "---|" * len(header)] + [esc(b) for b in body])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    return "\n".join(lines + ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body])
