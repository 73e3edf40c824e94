"""`miles-harness serve [--model tiny|smollm2|DIR] [--port 0] [--host 127.0.0.1]
[--context-length N] [--pace-decode-tokens-per-s R]`: an SGLang-compatible HTTP server on
the CPU (``harness.serve``; ``docs/serve.md``).

Prints ``serving http://HOST:PORT`` once it answers (with ``--port 0``, the port the
system chose), then serves until interrupted (Ctrl-C / SIGTERM). ``--trace PATH``
writes on exit the trace (JSONL), ``PATH.requests.json`` (the HTTP request log) and
``PATH.config.json``, the config it is checked under, so that ``miles-harness check-trace
PATH`` gives the verdict the server's own ``/harness/check`` gives
(``harness.serve.check.write_served_trace``).
"""

from __future__ import annotations

import argparse
import functools
import signal
import threading
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="tiny",
        help="tiny (default: a seeded two-layer model over a character vocabulary with a byte fallback, so any text works), smollm2, or a local HF model directory",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: a free one, printed at start)")
    parser.add_argument("--seed", type=int, default=0, help="tiny-model weights and default sampling seeds")
    parser.add_argument("--max-running", type=int, default=16, help="continuous-batching slots (default 16)")
    parser.add_argument("--weight-version", default="default", help="initial weight version (SGLang: default)")
    parser.add_argument("--no-eos", action="store_true", help="never stop at EOS (requests run to max_new_tokens)")
    parser.add_argument("--trace", default=None, help="write the trace JSONL here on exit")
    parser.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="prompt plus output tokens a request may use (SGLang's flag; default: the model's own, "
        "4096 for tiny, max_position_embeddings otherwise)",
    )
    parser.add_argument(
        "--pace-decode-tokens-per-s",
        type=float,
        default=None,
        help="hold decoding to this many tokens per second per request, as a GPU server "
        "(default: unpaced; docs/serve.md lists rates measured on GPUs)",
    )
    parser.add_argument(
        "--pace-prefill-tokens-per-s",
        type=float,
        default=None,
        help="with pacing, a step that prefills k prompt tokens lasts k / this longer",
    )


def _validate(args: argparse.Namespace) -> None:
    """Every option checked before the model loads or a port is bound."""
    from pathlib import Path

    from miles_async_core.errors import ConfigError

    if not 0 <= args.port <= 65535:
        raise ConfigError(
            f"--port {args.port}: a TCP port is 0..65535 (0: a free one the system picks). Fix: e.g. --port 30000"
        )
    for flag, value in (("--max-running", args.max_running), ("--context-length", args.context_length)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: must be at least 1. Fix: leave it out for the default")
    for flag, rate in (
        ("--pace-decode-tokens-per-s", args.pace_decode_tokens_per_s),
        ("--pace-prefill-tokens-per-s", args.pace_prefill_tokens_per_s),
    ):
        if rate is not None and not (rate > 0 and rate != float("inf")):
            raise ConfigError(f"{flag} {rate}: must be a finite rate above 0. Fix: e.g. {flag} 300")
    if args.model not in ("tiny", "smollm2") and not Path(args.model).is_dir():
        raise ConfigError(
            f"--model {args.model!r}: no such directory. Allowed: tiny, smollm2 or a local Hugging Face "
            "model directory. Fix: pass an existing path or --model tiny"
        )
    if args.trace is not None and not Path(args.trace).resolve().parent.is_dir():
        raise ConfigError(
            f"--trace {args.trace}: its folder does not exist, so the trace could not be written on exit. "
            "Fix: create the folder or pass another path"
        )


def main(args: argparse.Namespace) -> int:
    _validate(args)
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    from harness.serve.pacing import Pacing
    from harness.serve.server import RunningServer, build_engine

    pacing = Pacing(
        decode_tokens_per_s=args.pace_decode_tokens_per_s, prefill_tokens_per_s=args.pace_prefill_tokens_per_s
    )
    build = functools.partial(
        build_engine,
        args.model,
        seed=args.seed,
        max_running=args.max_running,
        weight_version=args.weight_version,
        context_length=args.context_length,
        pacing=pacing,
    )
    engine = build(eos_token_id=None) if args.no_eos else build()
    served = RunningServer(engine, bind=args.host, port=args.port).start()
    paced = (
        f", paced: {pacing.decode_tokens_per_s} decode / {pacing.prefill_tokens_per_s} prefill tokens/s"
        if pacing.enabled
        else ""
    )
    print(
        f"serving {served.url} (model={args.model}, context_length={engine.context_length}, "
        f"weight_version={engine.weight_version}{paced}, started in {time.perf_counter() - t0:.2f} s)",
        flush=True,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(1.0):
            if served.thread is None or not served.thread.is_alive():
                break
    except KeyboardInterrupt:
        pass
    finally:
        served.stop()
        if args.trace:
            from harness.serve.check import write_served_trace
            from harness.trace import config_path

            write_served_trace(engine, args.trace)
            print(
                f"trace: {args.trace} ({len(engine.trace.events)} events; its config: {config_path(args.trace)}; "
                f"check it with `miles-harness check-trace {args.trace}`)",
                flush=True,
            )
    return 0
