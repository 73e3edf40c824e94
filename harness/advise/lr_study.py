"""The learning-rate-vs-staleness study behind ``advise``'s learning-rate advice.

    python -m harness.advise.lr_study --out results/lr_study [--seeds 0,1,2] [--steps 40]
        [--staleness 0,1,2,4] [--intervals 1,2,4] [--lr 1e-3]

On the CPU main job (tiny model, copy task, ``harness.main_job.job.run_mode`` with the
gap decomposition off, split layout), runs fully-async with ``--max-weight-staleness s``
for each s and one-step with ``--update-weights-interval k`` for each k, each with the
base learning rate and with the seed's rule (lr / (s + 1), lr / k), for every seed.
Where the rule's factor is 1 (s = 0, k = 1) the two arms are the same run, made once.

Per run: final reward (mean of the last 5 steps), area under the reward curve (mean
reward over all steps), loss spikes (steps whose loss is more than 4 MADs above the
run's median loss), gradient-norm outliers (same rule on ``train/grad_norm``), and
trainer-engine gap growth (least-squares slope per step of
``train/train_rollout_logprob_abs_diff``, nats/token/step). Runs append to
``runs.jsonl`` as they finish (an interrupted study resumes where it stopped); the
summary (``summary.json``, ``table.md``) and ``lr_study.png`` are rewritten from it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BASE_MILES_ARGS = ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8"]


def plan(staleness: list[int], intervals: list[int], seeds: list[int], lr: float) -> list[dict[str, Any]]:
    runs = []
    for seed in seeds:
        for s in staleness:
            for arm in ("base", "rule"):
                if arm == "rule" and s == 0:
                    continue
                runs.append(
                    {
                        "family": "fully-async",
                        "knob": "s",
                        "value": s,
                        "arm": arm,
                        "seed": seed,
                        "lr": lr if arm == "base" else lr / (s + 1),
                        "mode": "fully-async",
                        "miles_args": BASE_MILES_ARGS + ["--max-weight-staleness", str(s)],
                    }
                )
        for k in intervals:
            for arm in ("base", "rule"):
                if arm == "rule" and k == 1:
                    continue
                runs.append(
                    {
                        "family": "one-step",
                        "knob": "k",
                        "value": k,
                        "arm": arm,
                        "seed": seed,
                        "lr": lr if arm == "base" else lr / k,
                        "mode": "one-step",
                        "miles_args": BASE_MILES_ARGS + ["--update-weights-interval", str(k)],
                    }
                )
    return runs


def key(run: dict[str, Any]) -> str:
    return f"{run['family']}:{run['knob']}={run['value']}:{run['arm']}:seed={run['seed']}"


def _mad_outliers(xs: list[float], k: float = 4.0) -> int:
    if len(xs) < 5:
        return 0
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs) or 1e-12
    return sum(1 for x in xs if x - med > k * mad)


def _slope(ys: list[float]) -> float | None:
    n = len(ys)
    if n < 3:
        return None
    mx, my = (n - 1) / 2, sum(ys) / n
    den = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / den


def metrics(history: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [h["train/reward_mean"] for h in history if "train/reward_mean" in h]
    losses = [h["train/loss"] for h in history if "train/loss" in h]
    grads = [h["train/grad_norm"] for h in history if "train/grad_norm" in h]
    gap = [h["train/train_rollout_logprob_abs_diff"] for h in history if "train/train_rollout_logprob_abs_diff" in h]
    return {
        "steps": len(history),
        "final_reward": sum(rewards[-5:]) / len(rewards[-5:]) if rewards else None,
        "auc_reward": sum(rewards) / len(rewards) if rewards else None,
        "loss_spikes": _mad_outliers(losses),
        "grad_norm_outliers": _mad_outliers(grads),
        "gap_slope": _slope(gap),
        "gap_last": sum(gap[-5:]) / len(gap[-5:]) if gap else None,
        "rewards": rewards,
        "gap": gap,
    }


def run_one(run: dict[str, Any], steps: int) -> dict[str, Any]:
    from harness.main_job.job import run_mode
    from harness.main_job.spec import RunSpec
    from miles_async_core.config import parse_miles_args

    base, _ = parse_miles_args(run["miles_args"])
    spec = RunSpec(lr=run["lr"], seed=run["seed"], steps=steps, gap_decomposition=False, repeats=1)
    t0 = time.perf_counter()
    r = run_mode(run["mode"], base, spec, measure=False)
    out = {
        **run,
        "key": key(run),
        "error": r.error,
        "wall_s": time.perf_counter() - t0,
        **metrics(r.history),
        "spec": {
            "task": spec.task,
            "task_length": spec.task_length,
            "task_symbols": spec.task_symbols,
            "model": spec.model,
            "steps": steps,
            "layout": spec.layout,
        },
    }
    return out


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["family"], r["knob"], r["value"], r["arm"]), []).append(r)
    out = []
    for (family, knob, value, arm), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][3])):

        def mean(name: str, rs: list[dict[str, Any]] = rs) -> float | None:
            xs = [r[name] for r in rs if r.get(name) is not None]
            return sum(xs) / len(xs) if xs else None

        def sd(name: str, rs: list[dict[str, Any]] = rs) -> float | None:
            xs = [r[name] for r in rs if r.get(name) is not None]
            return statistics.stdev(xs) if len(xs) > 1 else None

        out.append(
            {
                "family": family,
                "knob": knob,
                "value": value,
                "arm": arm,
                "lr": rs[0]["lr"],
                "seeds": len(rs),
                "final_reward": mean("final_reward"),
                "final_reward_sd": sd("final_reward"),
                "auc_reward": mean("auc_reward"),
                "auc_reward_sd": sd("auc_reward"),
                "loss_spikes": mean("loss_spikes"),
                "grad_norm_outliers": mean("grad_norm_outliers"),
                "gap_slope": mean("gap_slope"),
                "errors": sum(1 for r in rs if r.get("error")),
            }
        )
    return out


def table(rows: list[dict[str, Any]], chance: float) -> str:
    f = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = [
        f"Chance level: {chance:.3f}. Mean over seeds (sd).",
        "",
        "| family | knob | arm | lr | seeds | final reward | AUC reward | loss spikes | grad-norm outliers | "
        "gap slope (nats/token/step) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['knob']}={r['value']} | {r['arm']} | {r['lr']:.2e} | {r['seeds']} | "
            f"{f(r['final_reward'])} ({f(r['final_reward_sd'])}) | {f(r['auc_reward'])} "
            f"({f(r['auc_reward_sd'])}) | {f(r['loss_spikes'], 1)} | {f(r['grad_norm_outliers'], 1)} | "
            f"{'-' if r['gap_slope'] is None else format(r['gap_slope'], '.2e')} |"
        )
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], rows: list[dict[str, Any]], path: Path, chance: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.results.plots import DPI

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, family in zip(axes[:2], ("fully-async", "one-step")):
        curves: dict[tuple, list[list[float]]] = {}
        for r in records:
            if r["family"] == family and r["rewards"]:
                curves.setdefault((r["value"], r["arm"]), []).append(r["rewards"])
        for (value, arm), cs in sorted(curves.items()):
            n = min(len(c) for c in cs)
            mean = [sum(c[j] for c in cs) / len(cs) for j in range(n)]
            ax.plot(
                range(n),
                mean,
                "-" if arm == "base" else "--",
                color=f"C{sorted({v for v, _ in curves}).index(value)}",
                label=f"{'s' if family == 'fully-async' else 'k'}={value} {arm}",
            )
        ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
        ax.set_title(f"{family}: reward (mean over seeds)", fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel("mean reward")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    ax = axes[2]
    labels = [f"{r['family'][:5]} {r['knob']}={r['value']} {r['arm']}" for r in rows]
    ax.barh(
        range(len(rows)),
        [r["final_reward"] or 0 for r in rows],
        xerr=[r["final_reward_sd"] or 0 for r in rows],
        color=["C0" if r["arm"] == "base" else "C1" for r in rows],
    )
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.axvline(chance, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("final reward (mean of last 5 steps)")
    ax.set_title("final reward: base lr (blue) vs rule-scaled lr (orange)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.advise.lr_study", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/lr_study")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--staleness", default="0,1,2,4")
    p.add_argument("--intervals", default="1,2,4")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs (resume later)")
    args = p.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    done = {json.loads(line)["key"]: json.loads(line) for line in log.read_text().splitlines()} if log.exists() else {}
    todo = [
        r for r in plan(ints(args.staleness), ints(args.intervals), ints(args.seeds), args.lr) if key(r) not in done
    ]
    if args.max_runs is not None:
        todo = todo[: args.max_runs]
    for i, run in enumerate(todo):
        rec = run_one(run, args.steps)
        with log.open("a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
        print(
            f"[{i + 1}/{len(todo)}] {rec['key']}: final {rec['final_reward']:.3f} auc {rec['auc_reward']:.3f} "
            f"({rec['wall_s']:.0f} s){' ERROR ' + rec['error'] if rec['error'] else ''}",
            flush=True,
        )
        done[rec["key"]] = rec
    records = list(done.values())
    rows = summarize(records)
    from harness.backends.tasks import get_task
    from harness.main_job.spec import RunSpec

    spec = RunSpec()
    task = get_task(spec.task, **spec.task_kwargs())
    chance = 1.0 / getattr(task, "n_symbols", 4)
    command = "python -m harness.advise.lr_study " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    (out / "summary.json").write_text(
        json.dumps({"command": command, "chance": chance, "rows": rows}, indent=1, sort_keys=True) + "\n"
    )
    (out / "table.md").write_text(f"# lr vs staleness study\n\nMade by: `{command}`\n\n" + table(rows, chance))
    plot(records, rows, out / "lr_study.png", chance)
    print(table(rows, chance))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
