"""``ServedCore``: the harness's ``EngineCore`` with SGLang's per-request sampling
options, stop conditions and single-request abort.

What it adds to ``harness.backends.torch_engine.EngineCore`` (continuous batching, the
pause modes and per-token weight versions are the base class's, unchanged):

* each request carries ``SamplingOptions`` (``sampling.py``); a decode step samples
  every running request with its own options (``sampling.choose_tokens``);
* stop conditions, checked after every token in SGLang's order (``schedule_batch.py``
  ``Req.check_finished``): a stop string in the decoded output (its last tokens only,
  ``responses.stop_window_text``, as SGLang checks the tail), a stop token (the EOS
  and ``stop_token_ids``, none when ``ignore_eos``), then the length. A request that
  stops records what matched in ``matched[req_id]`` (a token id or the string); the
  matched token stays in the output, as in SGLang;
* ``abort_one(req_id)``: ends one request now, running or waiting (a retracted request
  waits), with the tokens it generated so far; SGLang's abort by ``rid``;
* ``live()`` and ``kv_tokens()`` for the scheduler state the server reports;
* per-token top log-probs (``top_logprobs_num``), kept on the request until
  ``top_logprobs.pop(req_id)`` after it finished;
* a KV pool that grows with the requests: it starts ``KV_CHUNK`` positions wide per
  slot and widens (in ``KV_CHUNK`` steps, up to the context length) before a step
  whose requests need more, so a long context costs memory only when a request uses
  it. SGLang sizes its pool from free GPU memory instead; what the server reports as
  the pool (``kv_tokens``) is the slots times the context length either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, cast

import torch

from miles_async_core.types import Status

from harness.backends.torch_engine import EngineCore, FinishedRequest, Request

from .responses import stop_window_text
from .sampling import SamplingOptions, choose_tokens

KV_CHUNK = 512  # positions per slot the KV pool starts with and widens by


@dataclass(eq=False)
class ServedRequest(Request):
    """A request with SGLang's sampling options and, when asked, the top log-probs of
    each token it chose: ``[(logprob, token id)]`` of the most likely."""

    options: SamplingOptions = field(default_factory=SamplingOptions)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)


def _served(req: Request) -> ServedRequest:
    # every request a ServedCore holds is made by its _new_request
    return cast(ServedRequest, req)


class ServedCore(EngineCore):
    def __init__(self, model: Any, *, decode_text: Callable[[list[int]], str] | None = None, **kwargs: Any) -> None:
        super().__init__(model, kv_seq_len=KV_CHUNK, **kwargs)
        self.decode_text = decode_text
        self.matched: dict[Any, Any] = {}
        self.top_logprobs: dict[Any, list] = {}
        self._kv_bound = 0  # the most positions any request added so far can need

    def add_request(
        self,
        req_id: Any,
        prompt_tokens: list[int],
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int = 0,
        options: SamplingOptions | None = None,
    ) -> None:
        super().add_request(req_id, prompt_tokens, max_new_tokens, temperature, seed)
        self._kv_bound = max(self._kv_bound, len(prompt_tokens) + max_new_tokens)
        req = _served(self._waiting[-1])
        req.options = options or SamplingOptions(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_ids=frozenset([self.eos_token_id]) if self.eos_token_id is not None else frozenset(),
        )

    def _new_request(
        self, req_id: Any, prompt_tokens: list[int], max_new_tokens: int, temperature: float, gen: torch.Generator
    ) -> ServedRequest:
        return ServedRequest(req_id, prompt_tokens, max_new_tokens, temperature, gen)

    def live(self) -> Iterator[tuple[Request, str]]:
        """Every request in the engine, with ``"running"`` or ``"waiting"``."""
        for req in self._running:
            yield req, "running"
        for req in self._waiting:
            yield req, "waiting"

    def kv_tokens(self) -> tuple[int, int]:
        """(tokens held in the KV cache now, tokens it can hold)."""
        return sum(r.kv_len for r in self._running), self.max_running * self.model.max_seq_len

    def step(self) -> list[FinishedRequest]:
        if self._kv_bound > self.model.cache_len() and self.can_step():  # else every request fits already
            self._fit_kv()
        return super().step()

    def _fit_kv(self) -> None:
        """Widen the KV pool to the longest sequence this step can hold: a running
        request's next position, or a waiting request's prefill, prompt and output so far."""
        need = max((len(r.prompt_tokens) + len(r.output_tokens) for r, _ in self.live()), default=0)
        if need > self.model.cache_len():
            self.model.grow_cache(-(-need // KV_CHUNK) * KV_CHUNK)

    def abort_one(self, req_id: Any) -> tuple[FinishedRequest, str] | None:
        """End one request now with its partial output; ``(result, "running" | "waiting")``,
        or ``None`` when no such request is in the engine."""
        for req, where in list(self.live()):
            if req.req_id == req_id:
                self.cancel(req_id)
                return self._finish(req, Status.ABORTED), where
        return None

    def _finish(self, req: Request, status: Status) -> FinishedRequest:
        served = _served(req)
        if served.options.top_logprobs_num > 0:
            self.top_logprobs[req.req_id] = served.top_logprobs
        return super()._finish(req, status)

    def _choose(self, logits: torch.Tensor, reqs: list[Request]) -> tuple[list[int], list[float]]:
        tokens, logps, all_logp = choose_tokens(
            logits, reqs, [r.generator for r in reqs], eos_token_id=self.eos_token_id
        )
        for i, req in enumerate(map(_served, reqs)):
            if req.options.top_logprobs_num > 0:
                top = torch.topk(all_logp[i], min(req.options.top_logprobs_num, all_logp.shape[-1]))
                req.top_logprobs.append(list(zip(top.values.tolist(), top.indices.tolist())))
        return tokens, logps

    def _stop_status(self, req: Request, tok: int) -> Status | None:
        """A stop string (matched on the text so far), a stop token id, then the length cap;
        what matched is kept in ``matched`` for the answer's ``finish_reason.matched``."""
        opts = _served(req).options
        if opts.stop and self.decode_text is not None:
            text = stop_window_text(self.decode_text, req.output_tokens, max(len(s) for s in opts.stop))
            for s in opts.stop:
                if s in text:
                    self.matched[req.req_id] = s
                    return Status.COMPLETED
        if tok in opts.stop_ids:
            self.matched[req.req_id] = tok
            return Status.COMPLETED
        if len(req.output_tokens) >= req.max_new_tokens:
            self.matched[req.req_id] = None
            return Status.TRUNCATED
        return None
