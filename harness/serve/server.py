"""Start and stop the server: ``build_engine`` (the model behind it), ``RunningServer``
(the routes on uvicorn in a background thread, on a free port by default) and
``serve_in_thread``.

    from harness.serve.server import serve_in_thread

    with serve_in_thread(model="tiny") as served:
        requests.post(f"{served.url}/generate", json={"text": "hello", ...})
        assert not served.check()["violations"]

``served.engine`` is the ``ServedEngine``; ``served.trace`` / ``served.request_log`` are
the live trace and HTTP log; the pytest fixture ``served_engine``
(``harness.serve.fixtures``) wraps the same.
"""

from __future__ import annotations

import asyncio
import enum
import sys
from typing import TYPE_CHECKING, Any, Literal

from miles_async_core.errors import ConfigError

from .app import create_app
from .check import check_served
from .pacing import Pacer, Pacing
from .served_core import ServedCore
from .served_engine import ServedEngine
from .uvicorn_thread import UvicornThread

if TYPE_CHECKING:
    from harness.backends.torch_models import TinyLMConfig


class _Default(enum.Enum):
    FROM_TOKENIZER = "from the tokenizer"


_DEFAULT = _Default.FROM_TOKENIZER  # eos_token_id not given: the tokenizer's
# The default model's context: SGLang's own live-server tests ask for up to 1,500 new
# tokens after a short prompt, so 4,096 leaves them room. No parameter depends on it
# (RoPE), so ``--context-length`` may set any length for the tiny model.
TINY_CONTEXT_LENGTH = 4096


def tiny_model_config(seed: int = 0, tokenizer: Any = None, context_length: int | None = None) -> TinyLMConfig:
    """The ``TinyLMConfig`` of ``--model tiny`` over ``tokenizer`` (default: the byte-fallback
    one, ``tokenizer.TINY_SERVE_TOKENIZER``), seeded by ``seed``."""
    from harness.backends import torch_models as tm

    from .tokenizer import TINY_SERVE_TOKENIZER

    vocab = (tokenizer or TINY_SERVE_TOKENIZER).vocab_size
    return tm.TinyLMConfig(vocab_size=vocab, seed=seed, max_seq_len=context_length or TINY_CONTEXT_LENGTH)


def check_context_length(context_length: int | None, own: int | None, model: str) -> None:
    """SGLang's ``--context-length`` rule: at least 2 tokens, and no longer than the model's
    own context (``max_position_embeddings``), where the model has one."""
    if context_length is None:
        return
    if context_length < 2:
        raise ConfigError(
            f"--context-length={context_length}: allowed is an integer >= 2 (a prompt token and "
            "a new token). Fix: pass a larger value, or leave it out for the model's own context."
        )
    if own is not None and context_length > own:
        raise ConfigError(
            f"--context-length={context_length} is longer than the model's own context ({own} "
            f"tokens, max_position_embeddings of --model={model!r}); allowed: 2..{own}. "
            "Fix: pass at most that, or leave it out."
        )


def build_engine(
    model: str = "tiny",
    *,
    seed: int = 0,
    max_running: int = 16,
    eos_token_id: int | None | Literal[_Default.FROM_TOKENIZER] = _DEFAULT,
    weight_version: str = "default",
    device: str = "cpu",
    tiny_config: TinyLMConfig | None = None,
    tokenizer: Any = None,
    context_length: int | None = None,
    pacing: Pacing | None = None,
) -> ServedEngine:
    """A ``ServedEngine`` over ``model``: ``tiny`` (``TinyLM`` seeded by ``seed`` over
    ``tokenizer``, by default the character vocabulary with a byte fallback, so any text
    works; pass ``harness.backends.tasks.TINY_TOKENIZER`` for the 30-id character model
    the harness's trainers use), ``smollm2`` (the packaged GGUF) or a local HF directory.
    ``eos_token_id`` defaults to the tokenizer's; pass ``None`` to never stop at EOS.
    ``context_length`` (SGLang's ``--context-length``) defaults to the model's own:
    ``TINY_CONTEXT_LENGTH`` for the tiny model, ``max_position_embeddings`` otherwise.
    ``pacing`` (``pacing.Pacing``) holds decoding to a GPU server's rate; unpaced by default."""
    from harness.backends import torch_models as tm

    check_context_length(context_length, None, model)
    engine_model: tm.EngineModel
    if model == "tiny":
        from .tokenizer import TINY_SERVE_TOKENIZER

        tokenizer = tokenizer or TINY_SERVE_TOKENIZER
        cfg = tiny_config or tiny_model_config(seed, tokenizer, context_length)
        engine_model = tm.build_tiny_lm(cfg, device=device)
    elif model == "smollm2":
        engine_model, tokenizer = (
            tm.load_smollm2(device=device, max_seq_len=None),
            tokenizer or tm.load_smollm2_tokenizer(),
        )
    else:
        engine_model = tm.load_hf_dir(model, device=device)
    if model != "tiny" and context_length is not None:
        check_context_length(context_length, engine_model.max_seq_len, model)
        engine_model.max_seq_len = context_length
        if tokenizer is None:
            try:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model)
            except Exception:  # a weights-only directory: input_ids still work, text does not
                tokenizer = None
    eos = getattr(tokenizer, "eos_token_id", None) if eos_token_id is _DEFAULT else eos_token_id
    initial = int(weight_version) if str(weight_version).isdigit() else 0
    decode = None if tokenizer is None else (lambda ids: tokenizer.decode(ids))
    core = ServedCore(engine_model, decode_text=decode, max_running=max_running, eos_token_id=eos, version=initial)
    pacer = Pacer(pacing) if pacing is not None and pacing.enabled else None
    return ServedEngine(
        core, tokenizer=tokenizer, model_path=model, weight_version=weight_version, seed=seed, pacer=pacer
    )


# The interpreter's GIL switch interval while a server runs. The engine thread gives up
# the GIL at every torch op and must win it back from the web server's thread, which
# holds it up to the switch interval (5 ms by default) while it encodes and sends stream
# chunks: a decode step of ~20 ops then waits far longer than it computes. SGLang runs
# its scheduler in a process of its own; here both share one interpreter. Measured on 2
# cores (the bench's ways, the same code with 5 ms and 0.5 ms alternating): at a load
# average of 1-2, 0.5 ms gave 1.27x the non-streaming and 1.18x the streaming tokens/s;
# with other work at a load average of 12, 1.5x streaming and 2x for 400-token streams.
SWITCH_INTERVAL_S = 0.0005


class RunningServer:
    """``create_app(engine)`` served by a ``UvicornThread``; a context manager. While it
    runs, the interpreter's GIL switch interval is ``switch_interval_s`` (restored by
    ``stop``; ``None`` leaves it alone)."""

    def __init__(
        self,
        engine: ServedEngine,
        *,
        bind: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        switch_interval_s: float | None = SWITCH_INTERVAL_S,
    ) -> None:
        self.engine = engine
        self.http = UvicornThread(create_app(engine), bind=bind, port=port, name="serve-http", log_level=log_level)
        self.switch_interval_s = switch_interval_s
        self._previous_switch: float | None = None

    @property
    def url(self) -> str:
        return self.http.url

    @property
    def port(self) -> int | None:
        return self.http.port

    @property
    def thread(self) -> Any:
        return self.http.thread

    @property
    def startup_s(self) -> float | None:
        return self.http.startup_s

    @property
    def trace(self):
        return self.engine.trace

    @property
    def request_log(self) -> list[dict[str, Any]]:
        return self.engine.request_log

    def check(self, **kwargs: Any) -> dict[str, Any]:
        return check_served(self.engine, **kwargs)

    def start(self, timeout_s: float = 30.0) -> "RunningServer":
        if self.switch_interval_s is not None and self._previous_switch is None:
            self._previous_switch = sys.getswitchinterval()
            sys.setswitchinterval(self.switch_interval_s)
        try:
            self.http.start(timeout_s)
        except BaseException:
            self._restore_switch()
            raise
        return self

    def _restore_switch(self) -> None:
        if self._previous_switch is not None:
            sys.setswitchinterval(self._previous_switch)
            self._previous_switch = None

    def stop(self) -> None:
        loop = self.engine.loop
        if self.http.started and loop is not None and self.engine.alive:
            try:  # end every request so no HTTP call hangs the shutdown
                asyncio.run_coroutine_threadsafe(self.engine.abort_everything(), loop).result(10)
            except Exception:
                pass
        self.http.stop()
        self._restore_switch()

    def __enter__(self) -> "RunningServer":
        return self.start() if self.http.thread is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_in_thread(
    model: str = "tiny", *, bind: str = "127.0.0.1", port: int = 0, **engine_kwargs: Any
) -> RunningServer:
    """A started ``RunningServer`` (use it as a context manager to stop it)."""
    return RunningServer(build_engine(model, **engine_kwargs), bind=bind, port=port).start()
