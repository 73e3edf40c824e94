"""Causal language models the torch engine and trainer run, behind one narrow interface.

Two kinds of model implement ``EngineModel``:

* ``TinyLM``: a Llama-style decoder in plain torch (token embedding, N blocks of
  RMSNorm + causal self-attention with RoPE + SwiGLU MLP, final RMSNorm, LM head tied
  to the embedding), built from a ``TinyLMConfig`` with seeded random weights.
* ``HFCausalLM``: any transformers causal LM (SmolLM2 from its GGUF file, a local HF
  directory, or a ``LlamaForCausalLM`` built from a small config), driven through
  ``past_key_values`` with ``SlotCache``.

Both have two forward paths:

* ``logits(input_ids, attention_mask)``: the full-sequence forward of right-padded
  rows (trainer path, and the reference the engine is tested against);
* ``prefill(slot, tokens)`` + ``decode(slots, positions, tokens)``: incremental decode
  over a slot pool of per-request KV (engine path). A slot is one request's KV; a
  decode step feeds one token per request at its own position (ragged lengths are
  handled by a key mask), writes that token's K/V into the slot and returns the
  next-token logits.

Invariant: for the same weights, ``decode`` after ``prefill`` gives the same logits (to
floating-point tolerance) as ``logits`` over the whole prefix, whatever the other rows
of the batch are.
"""

from __future__ import annotations

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
            f"{field_name}={name!r} is not supported; allowed: {sorted(DTYPES)}. "
            f"Fix: pass one of those names."
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

    def alloc_cache(self, n_slots: int) -> None:
        raise NotImplementedError

    def prefill(self, slot: int, tokens: list[int]) -> None:
        raise NotImplementedError

    def decode(self, slots: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            missing, unexpected = self.module.load_state_dict(state_dict, strict=False)
        bad = [k for k in missing if not _is_tied_alias(k)]
        if bad or unexpected:
            raise ValueError(f"weights do not match the model: missing={bad} unexpected={list(unexpected)}")

    def weights_copy(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}


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
            for name, p in self.named_parameters():
                if p.dim() == 2:  # seeded init, independent of torch's global RNG
                    p.copy_(torch.randn(p.shape, generator=gen) * cfg.init_std)
        cos, sin = rope_tables(cfg.d_model // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.to(device=self.device, dtype=resolve_dtype(cfg.dtype))
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    @property
    def module(self) -> nn.Module:  # type: ignore[override]
        return self

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.embed.weight).float()

    def _rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                *, return_kv: bool = False):
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
    def alloc_cache(self, n_slots: int) -> None:
        cfg = self.cfg
        shape = (cfg.n_layers, n_slots, cfg.n_heads, cfg.max_seq_len, cfg.d_model // cfg.n_heads)
        dtype = resolve_dtype(cfg.dtype)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=self.device)

    @torch.no_grad()
    def prefill(self, slot: int, tokens: list[int]) -> None:
        if not tokens:
            return
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        _, kvs = self.forward(ids, return_kv=True)
        n = len(tokens)
        for layer, (k, v) in enumerate(kvs):
            self.k_cache[layer, slot, :, :n] = k[0]
            self.v_cache[layer, slot, :, :n] = v[0]

    @torch.no_grad()
    def decode(self, slots: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One token per row at ``positions`` (= tokens already in the slot's KV)."""
        span = int(positions.max()) + 1
        cos, sin = self._rope_at(positions.view(-1, 1))
        keep = torch.arange(span, device=self.device).view(1, -1) <= positions.view(-1, 1)
        mask = keep.view(-1, 1, 1, span)
        x = self.embed(tokens.view(-1, 1))
        for layer, blk in enumerate(self.blocks):
            q, k, v = blk.qkv(x, cos, sin)
            kc, vc = self.k_cache[layer], self.v_cache[layer]
            kc[slots, :, positions] = k[:, :, 0]
            vc[slots, :, positions] = v[:, :, 0]
            out = attention(q, kc[slots, :, :span], vc[slots, :, :span], mask, self.cfg.attn_impl)
            x = blk.finish(x, out)
        return self.head(x)[:, 0]


def build_tiny_lm(cfg: TinyLMConfig | None = None, *, device: str | torch.device = "cpu") -> TinyLM:
    return TinyLM(cfg or TinyLMConfig(), device=device)
