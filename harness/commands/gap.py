"""`miles-harness gap`: the kernel-level ablation of the trainer-engine gap.

    miles-harness gap [--model tiny|smollm2|PATH] [--device cpu|cuda] [--dtypes fp32,bf16,fp16]
                      [--num-seqs N] [--max-new-tokens N] [--seed S] [--out DIR] [--telemetry]

Same weights on both sides; one factor switched at a time (``harness.measure.kernel_ablation``).
Prints the table, the share of the machine the ablation had (``harness.measure.host_load``:
a busy host is said, and stored in results.json's ``host``), then one JSON line for
scripts; writes ``DIR/results.json`` (kind ``gap``), ``DIR/gap_table.md`` and, with ``--telemetry``, ``DIR/telemetry.json``.
Exit 1 when a true on-policy row is not bitwise equal (that configuration must give an
exactly zero gap), 0 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.measure import host_load
from miles_async_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.measure.kernel_ablation import AblationConfig
    from harness.measure.telemetry import TelemetrySampler


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="tiny",
        help="tiny (seeded random weights), smollm2 (needs the model extra), or a local Hugging Face model directory",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtypes", default="fp32,bf16,fp16", help="comma list of fp32, bf16, fp16")
    p.add_argument("--num-seqs", type=int, default=16, help="sequences per row")
    p.add_argument("--max-new-tokens", type=int, default=32, help="longest continuation (others are shorter)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--d-model", type=int, default=128, help="tiny model width")
    p.add_argument("--layers", type=int, default=4, help="tiny model depth")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default=None, help="output folder (default results/gap/runs/<UTC time>)")
    p.add_argument("--telemetry", action="store_true", help="sample GPU telemetry (NVML) into DIR/telemetry.json")


def _check_model(model: str) -> None:
    if model not in ("tiny", "smollm2") and not Path(model).is_dir():
        raise ConfigError(
            f"--model {model!r}: no such directory. Allowed: tiny, smollm2 or a local Hugging Face "
            "model directory (config.json + weights). Fix: pass an existing path or --model tiny"
        )


DTYPES = ("fp32", "bf16", "fp16")
DEVICES = ("cpu", "cuda")


def _validate(args: argparse.Namespace) -> tuple[str, ...]:
    """Every option checked before torch loads or a row runs; returns the dtypes."""
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ConfigError(
            f"--dtypes {args.dtypes!r}: allowed a comma list of {', '.join(DTYPES)}. Fix: e.g. --dtypes fp32,bf16"
        )
    if args.device not in DEVICES:
        raise ConfigError(f"--device {args.device!r}: allowed {', '.join(DEVICES)}. Fix: --device cpu")
    for flag, value in (
        ("--num-seqs", args.num_seqs),
        ("--max-new-tokens", args.max_new_tokens),
        ("--d-model", args.d_model),
        ("--layers", args.layers),
        ("--threads", 1 if args.threads is None else args.threads),
    ):
        if value < 1:
            raise ConfigError(f"{flag} {value}: must be at least 1. Fix: leave it out for the default")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ConfigError(
            f"--temperature {args.temperature}: must be a finite number >= 0. Fix: e.g. --temperature 1.0"
        )
    _check_model(args.model)
    return dtypes


def main(args: argparse.Namespace) -> int:
    dtypes = _validate(args)
    return _run(args, dtypes)


def _run(args: argparse.Namespace, dtypes: tuple[str, ...]) -> int:
    import torch

    from harness.measure.kernel_ablation import Ablation, AblationConfig, format_table

    cfg = AblationConfig(
        model=args.model,
        device=args.device,
        dtypes=dtypes,
        num_seqs=args.num_seqs,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        tiny_d_model=args.d_model,
        tiny_layers=args.layers,
    )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out or f"results/gap/runs/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    phase = {"row": "setup"}
    sampler = _start_telemetry(phase) if args.telemetry else None
    t0 = time.perf_counter()
    meter = host_load.Meter().start()
    try:
        torch.manual_seed(cfg.seed)
        ablation = Ablation(cfg, on_row=lambda label: phase.update(row=label))
        rows = ablation.rows()
    finally:
        if sampler is not None:
            sampler.stop()
    wall_s = time.perf_counter() - t0
    host = host_load.summary({"ablation": meter.stop()})
    paths = write_outputs(out, cfg, ablation.source.name, rows, wall_s=wall_s, host=host)
    if sampler is not None:
        paths.append(_write_telemetry(out / "telemetry.json", sampler))
    print(format_table(rows))
    print(host_load.describe(host))
    for p in paths:
        print(f"wrote {p}")
    not_zero = [r["setting"] for r in rows if r["factor"] == "true_on_policy" and not r["all_bitwise_equal"]]
    for setting in not_zero:
        print(f"true on-policy ({setting}) is not bitwise equal: engine and trainer paths diverged")
    print(
        json.dumps(
            {
                "results": str(out / "results.json"),
                "rows": len(rows),
                "wall_s": round(wall_s, 3),
                "true_on_policy_exact": not not_zero,
                "host_busy": host["busy"],
            }
        )
    )
    return 1 if not_zero else 0


def write_outputs(
    out: Path,
    cfg: AblationConfig,
    model_name: str,
    rows: list[dict[str, Any]],
    *,
    wall_s: float,
    host: dict[str, Any] | None = None,
) -> list[Path]:
    from harness.measure.kernel_ablation import format_table
    from harness.results.schema import Results
    from harness.typing_aliases import to_json

    res = Results.new(
        "gap",
        {"ablation": dataclasses.asdict(cfg), "model_name": model_name},
        definition_common={
            "model": cfg.model,
            "device": cfg.device,
            "num_seqs": cfg.num_seqs,
            "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "seed": cfg.seed,
            "metric": "per-sequence mean |logp_train - logp_rollout|",
        },
    )
    for r in rows:
        if r["per_seq_abs_diff"]:
            res.add_benchmark(
                f"{r['factor']}/{r['setting']}",
                r["per_seq_abs_diff"],
                unit="nats/token",
                higher_is_better=False,
                definition={
                    "factor": r["factor"],
                    "setting": r["setting"],
                    "engine": r["engine"],
                    "trainer": r["trainer"],
                },
            )
    res.extra["table"] = to_json(rows)
    res.extra["wall_s"] = wall_s
    if host is not None:
        res.host = host  # harness.measure.host_load.summary over the ablation
    out.mkdir(parents=True, exist_ok=True)
    table = out / "gap_table.md"
    table.write_text(
        f"Kernel-level gap, model {model_name}, device {cfg.device}, {cfg.num_seqs} sequences, "
        f"up to {cfg.max_new_tokens} new tokens, temperature {cfg.temperature}, seed {cfg.seed}\n\n"
        + format_table(rows, markdown=True)
        + "\n",
        encoding="utf-8",
    )
    return [res.write(out / "results.json"), table]


def _start_telemetry(phase: dict[str, str]) -> TelemetrySampler:
    from harness.measure.telemetry import TelemetrySampler

    return TelemetrySampler(interval_s=0.1, phase_fn=lambda: phase["row"]).start()


def _write_telemetry(path: Path, sampler: TelemetrySampler) -> Path:
    path.write_text(
        json.dumps({"summary": sampler.summary(), "records": sampler.records}, indent=1) + "\n", encoding="utf-8"
    )
    return path
