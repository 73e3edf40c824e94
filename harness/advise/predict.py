"""Predict a layout and a Miles command line on virtual time from calibrated costs.

Layout. ``engines`` rollout engines of ``gpus_per_engine`` GPUs each, and a trainer on
``trainer_gpus`` GPUs. The costs file describes one engine and one trainer of the
calibrated layout (``CostModel.reference``); an engine on g times the GPUs has its step
costs divided by g and its batch width (``max_running``) multiplied by g, a trainer on t
times the GPUs its per-token cost divided by t (ideal tensor / data parallel scaling;
real scaling is sublinear, so predictions for bigger engines are optimistic).

Several engines. ``SimEngine`` is one engine, so N engines are N ``SimEngine``s behind a
router that sends each request to the engine with the fewest outstanding requests
(running + waiting; ties to the lowest index), as SGLang's router does with its
least-load policy. Modelled this way rather than as one engine with N times the
throughput because the split matters: each engine fills and drains its own batch (so
the tail of a step is per engine), and a pause waits for every engine's step boundary.
A weight update pauses every engine, waits ``weight_sync_s`` (a broadcast) plus
``weight_sync_per_engine_s`` for each engine past the first (0 unless a run with several
engines calibrated it, ``fit_engine_sharing``), loads the version into each, and resumes them; a pause that interrupts running
requests costs ``pause_resume_s`` more. The rollout side counts as busy while any
engine is.

Contention. Costs fitted on a machine where the engine and the trainer share hardware
(the 2-core CPU main job) carry contention factors (``harness.sim.contention``): while
the trainer trains every engine step is slower, while an engine decodes training is
slower. They apply to layouts whose engines and trainer have the calibrated sizes
(``calibrated_units``: any number of such engines), i.e. the calibrated kind of
machine; a layout of bigger engines or trainers is another machine and gets none.
Likewise ``engine_slots`` (engines of the calibrated size sharing that host: several
decoding at once decode together as fast as ``engine_slots`` of them alone), which only
a calibration with several engines on one host sets; with it, in an overlapped mode the
main process's demand on the host's cores makes the engines share more than in sync
(``harness.advise.host_share``).

``predict`` simulates the given flags and, for the speedup, the same flags as sync
(``train.py``: no overlap). Sync steps are independent of each other, so the sync
baseline simulates at most ``SYNC_BASELINE_STEPS`` steps and uses their mean step time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from miles_async_core.contracts import NullSink
from miles_async_core.errors import ConfigError
from miles_async_core.rules import validate
from harness.advise import host_share
from harness.advise.cost_model import CostModel, mode_of
from harness.backends.router import LeastOutstandingRouter
from harness.measure.overlap import ideal_speedup
from harness.sim.contention import Contention
from harness.sim.engine import _DONE, SimEngine, SimEngineConfig
from harness.sim.scenario import Scenario
from harness.sim.run_scenario import simulate, summarize
from harness.sim.trainer import SimTrainer, SimTrainerConfig

SYNC_BASELINE_STEPS = 10
TP_SIZES = (1, 2, 4, 8)  # one node; larger engines span whole nodes (multiples of 8)

# The learning-rate rule and what the study (harness.advise.lr_study) found about it.
LR_RULE = (
    "rule of thumb (the seed's): lr / k for update interval k, lr / (s + 1) for max staleness s, "
    "relative to the settings' base lr"
)
LR_STUDY_NOTE = (
    "the study (results/lr_study, tiny model, copy task, 3 seeds) found the rule's lr gives a higher "
    "area under the reward curve at s=1, s=2, k=2 and k=4 (+5% to +13%) and fewer loss spikes, with "
    "final rewards within seed noise, and no gain at s=4: so the rule is recommended as stated, "
    "as a stability measure rather than a speed-up"
)


@dataclass(frozen=True, kw_only=True)
class Layout:
    engines: int = 1
    gpus_per_engine: int = 1
    trainer_gpus: int = 1

    @property
    def total_gpus(self) -> int:
        return self.trainer_gpus + self.engines * self.gpus_per_engine


def check_layout(layout: Layout, config: AsyncConfig, profile: str = "manual") -> None:
    """Refuse an impossible layout or flag combination: the error names the flag, the
    value, what is allowed and the fix."""
    for flag, value in (
        ("--engines", layout.engines),
        ("--gpus-per-engine", layout.gpus_per_engine),
        ("--trainer-gpus", layout.trainer_gpus),
    ):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{flag} {value}: must be an integer >= 1 (a layout needs at least one of each); fix: {flag} 1"
            )
    g = layout.gpus_per_engine
    if g not in TP_SIZES and g % 8 != 0:
        raise ConfigError(
            f"--gpus-per-engine {g}: an engine's tensor-parallel size must be one of "
            f"{', '.join(map(str, TP_SIZES))} (within a node) or a multiple of 8 (whole nodes); "
            f"fix: --gpus-per-engine {max(t for t in TP_SIZES if t <= g) if g < 8 else 8 * (g // 8)}"
        )
    samples = config.rollout_batch_size * config.n_samples_per_prompt
    if samples % layout.trainer_gpus != 0:
        divisors = [d for d in range(1, samples + 1) if samples % d == 0 and d <= max(layout.trainer_gpus * 2, 8)]
        raise ConfigError(
            f"--trainer-gpus {layout.trainer_gpus}: the {samples} samples of a step "
            f"(--rollout-batch-size {config.rollout_batch_size} x --n-samples-per-prompt "
            f"{config.n_samples_per_prompt}) must split evenly over the data-parallel trainer ranks; "
            f"allowed: a divisor of {samples} (e.g. {', '.join(map(str, divisors[-4:]))}); "
            f"fix: change --trainer-gpus or the batch"
        )
    if config.colocate and layout.trainer_gpus != layout.engines * layout.gpus_per_engine:
        raise ConfigError(
            f"--trainer-gpus {layout.trainer_gpus} with --colocate: colocated engines and trainer "
            f"share the same GPUs, so the trainer must have --engines x --gpus-per-engine = "
            f"{layout.engines * layout.gpus_per_engine}; fix: --trainer-gpus "
            f"{layout.engines * layout.gpus_per_engine}, or drop --colocate"
        )
    errors = [v for v in validate(config, profile) if v.severity == "error"]
    if errors:
        raise ConfigError(
            "the Miles flags are refused by rule profile "
            f"{profile!r}: " + "; ".join(f"[{v.rule_id}] {v.message}" for v in errors)
        )


# --- several engines behind a router ----------------------------------------------------------


class _Busy:
    """Rollout side busy while any engine is: one PHASE_START/END pair on the run's sink;
    the count of busy engines goes to the contention model, if any."""

    def __init__(self, sink: Any, contention: Contention | None = None) -> None:
        self.sink, self.count, self.contention = sink, 0, contention

    def set(self, busy: bool) -> None:
        before = self.count
        self.count += 1 if busy else -1
        if self.sink.enabled and (before == 0) != (self.count == 0):
            self.sink.emit(ev.PHASE_START if self.count else ev.PHASE_END, side="rollout", phase="generating")
        if self.contention is not None:
            self.contention.engine_busy(self.count)


class _EngineSink:
    """An engine's sink: its own busy phase goes to ``_Busy`` (via ``_RoutedEngine``);
    with ``detail`` its per-request events go to the run's sink, else they are not made."""

    def __init__(self, sink: Any, detail: bool) -> None:
        self.sink, self.enabled = sink, bool(detail and sink.enabled)

    def emit(self, kind: str, /, **fields: Any) -> None:
        if kind in (ev.PHASE_START, ev.PHASE_END) and fields.get("side") == "rollout":
            return
        self.sink.emit(kind, **fields)


class _RoutedEngine(SimEngine):
    """A ``SimEngine`` that tells the router when it turns busy or idle and when one of its
    requests leaves (finished, aborted or cancelled): no callback per request."""

    def __init__(
        self, config: SimEngineConfig, *, sink: Any, busy: _Busy, router: LeastOutstandingRouter, index: int
    ) -> None:
        super().__init__(config, sink=sink)
        self._router_busy = busy
        self._was_busy = False
        self._router, self._index = router, index

    def _finish(self, req: Any, *, aborted: bool) -> None:
        super()._finish(req, aborted=aborted)
        self._router.done(self._index)

    def _on_cancel(self, req: Any) -> None:
        if req.state != _DONE:
            self._router.done(self._index)
        super()._on_cancel(req)

    def _set_busy(self, busy: bool) -> None:  # the engine's own busy edge, reported to the router
        super()._set_busy(busy)
        if busy != self._was_busy:
            self._was_busy = busy
            self._router_busy.set(busy)


class RoutedEngines:
    """N ``SimEngine``s behind Miles' least-outstanding-requests router
    (``harness.backends.router``, the one the Ray layout uses), as one engine."""

    def __init__(
        self,
        config: SimEngineConfig,
        n: int,
        *,
        sink: Any = None,
        weight_sync_s: float = 0.0,
        pause_resume_s: float = 0.0,
        detail: bool = False,
        contention: Contention | None = None,
    ) -> None:
        sink = sink or NullSink()
        busy = _Busy(sink, contention)
        inner = _EngineSink(sink, detail)
        self.router = LeastOutstandingRouter(n)
        self.engines = [_RoutedEngine(config, sink=inner, busy=busy, router=self.router, index=i) for i in range(n)]
        if contention is not None:
            for e in self.engines:
                contention.attach(e)
        self.weight_sync_s, self.pause_resume_s = weight_sync_s, pause_resume_s
        self.sink = sink

    @property
    def weight_version(self) -> int:
        return self.engines[0].weight_version

    @property
    def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.engines:
            for k, v in e.stats.items():
                out[k] = out.get(k, 0) + v
        return out

    def generate(self, sample: Any, sampling: Any) -> asyncio.Future:
        return self.engines[self.router.pick()].generate(sample, sampling)

    async def pause_generation(self, mode: str) -> None:
        interrupted = any(e.running and not e.paused for e in self.engines)
        await asyncio.gather(*(e.pause_generation(mode) for e in self.engines))
        if interrupted and self.pause_resume_s > 0:
            await asyncio.sleep(self.pause_resume_s)

    async def update_weights(self, version: int, weights: Any) -> None:
        if self.weight_sync_s > 0:
            await asyncio.sleep(self.weight_sync_s)
        for e in self.engines:
            await e.update_weights(version, weights)

    async def continue_generation(self) -> None:
        for e in self.engines:
            await e.continue_generation()


# --- prediction -----------------------------------------------------------------------------------


def scenario_for(costs: CostModel, config: AsyncConfig, layout: Layout) -> Scenario:
    return Scenario(
        name="advise",
        config=config,
        engine=costs.engine_config(layout.gpus_per_engine, seed=config.seed),
        trainer=costs.trainer_config(layout.trainer_gpus),
        max_new_tokens=costs.max_new_tokens,
    )


def calibrated_units(costs: CostModel, layout: Layout) -> bool:
    """Whether the layout's engines and trainer are the calibrated ones (``reference``):
    then they run on the machine the costs were measured on, and slow each other as they
    did there (contention); engines or a trainer of another size are another machine,
    where the model keeps them independent."""
    ref = costs.reference
    return layout.gpus_per_engine == ref.get("engine_gpus", 1) and layout.trainer_gpus == ref.get("trainer_gpus", 1)


def simulate_layout(costs: CostModel, config: AsyncConfig, layout: Layout, *, detail: bool = False) -> Any:
    """One simulated run; with a contention factor above 0 in ``costs`` the engines and the
    trainer slow each other (``harness.sim.contention``), else they run independently."""
    contention = None
    shared = costs.engine_slots if layout.engines > 1 else 0.0
    engine_c, trainer_c = costs.contention_for(config)
    if (engine_c or trainer_c or shared) and calibrated_units(costs, layout):
        cores = host_share.figures(costs, mode_of(config)) if shared else {}
        contention = Contention(engine=engine_c, trainer=trainer_c, engine_slots=shared, **cores)
    weight_sync_s = costs.weight_sync_s + (layout.engines - 1) * costs.weight_sync_per_engine_s

    def factory(cfg: SimEngineConfig, sink: Any) -> RoutedEngines:
        return RoutedEngines(
            cfg,
            layout.engines,
            sink=sink,
            weight_sync_s=weight_sync_s,
            pause_resume_s=costs.pause_resume_s,
            detail=detail,
            contention=contention,
        )

    def trainer_factory(cfg: SimTrainerConfig) -> SimTrainer:
        trainer = SimTrainer(cfg)
        trainer.contention = contention
        return trainer

    return simulate(
        scenario_for(costs, config, layout),
        engine_factory=factory,
        trainer_factory=trainer_factory if contention is not None else None,
    )


def sync_config(config: AsyncConfig) -> AsyncConfig:
    """The same flags as ``train.py`` (no overlap): the speedup's baseline."""
    return dataclasses.replace(
        config,
        driver="train",
        fully_async=False,
        update_weights_interval=1,
        max_weight_staleness=None,
        over_sampling_batch_size=None,
        rollout_submission_granularity=None,
        async_max_concurrent_samples=None,
    )


def is_sync(config: AsyncConfig) -> bool:
    return config.driver == "train"


def _stats(hist: dict[int, int]) -> dict[str, Any]:
    n = sum(hist.values())
    if not n:
        return {"mean": None, "max": None, "hist": {}}
    return {
        "mean": sum(k * v for k, v in hist.items()) / n,
        "max": max(hist),
        "hist": {int(k): v for k, v in hist.items()},
    }


def predict(
    costs: CostModel,
    config: AsyncConfig,
    layout: Layout,
    *,
    profile: str = "manual",
    sync_steps: int = SYNC_BASELINE_STEPS,
    baseline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Predicted figures for ``config`` on ``layout``; ``baseline`` reuses a sync prediction."""
    check_layout(layout, config, profile)
    cpu0 = time.process_time()
    res = simulate_layout(costs, config, layout)
    if res.error is not None:
        raise RuntimeError(f"the simulated run failed: {res.error!r}")
    s = summarize(res)
    steps = s["steps"]
    step_s = s["window_s"] / steps
    if baseline is None:
        if is_sync(config):
            baseline = {
                "step_s": step_s,
                "rollout_s": s["rollout_generating_s"] / steps,
                "train_s": (s["train_training_s"] + s["weight_sync_s"]) / steps,
                "steps": steps,
            }
        else:
            baseline = predict_sync(costs, config, layout, sync_steps)
    speedup = baseline["step_s"] / step_s
    ideal = ideal_speedup(baseline["rollout_s"], baseline["train_s"])
    samples = sum(len(r.get("age_versions", [])) for r in res.history) * config.n_samples_per_prompt
    cpu = time.process_time() - cpu0
    return {
        "layout": dataclasses.asdict(layout),
        "steps": steps,
        "step_s": step_s,
        "wall_s": s["window_s"],
        "sync_step_s": baseline["step_s"],
        "speedup": speedup,
        "ideal_speedup": ideal,
        "overlap_efficiency": speedup / ideal if ideal else None,
        "age_recorded": _stats(s["age_versions"]),
        "age_true": _stats(s["token_age_versions"]),
        "lag_steps": _stats(s["lag_steps"]),
        "dropped_share": s["dropped_share"],
        "retried_share": s["retried_share"],
        "queue_size_mean": s["queue_size_mean"],
        "queue_size_max": s["queue_size_max"],
        "capacity": config.capacity if config.fully_async else None,
        "both_busy_fraction": s["both_busy_fraction"],
        "rollout_idle_ratio": s["rollout_idle_ratio"],
        "busy_per_step_s": {
            "generating": s["rollout_generating_s"] / steps,
            "training": s["train_training_s"] / steps,
            "weight_sync": s["weight_sync_s"] / steps,
        },
        "train_idle_ratio": s["train_idle_ratio"],
        "samples_trained": samples,
        "cpu_s": cpu,
        # the engines' steps that admitted requests (a prefill batch before the decode), of all their steps
        "admitting_share": (
            res.engine_stats.get("admitting_steps", 0) / res.engine_stats["steps"]
            if res.engine_stats.get("steps")
            else None
        ),
        "samples_per_cpu_s": samples / cpu if cpu > 0 else None,
    }


def predict_sync(
    costs: CostModel, config: AsyncConfig, layout: Layout, steps: int = SYNC_BASELINE_STEPS
) -> dict[str, Any]:
    cfg = dataclasses.replace(sync_config(config), num_rollout=min(config.num_rollout, steps))
    res = simulate_layout(costs, cfg, layout)
    if res.error is not None:
        raise RuntimeError(f"the simulated sync baseline failed: {res.error!r}")
    s = summarize(res)
    n = s["steps"]
    return {
        "step_s": s["window_s"] / n,
        "rollout_s": s["rollout_generating_s"] / n,
        "train_s": (s["train_training_s"] + s["weight_sync_s"]) / n,
        "steps": n,
    }


# --- recommendation ---------------------------------------------------------------------------


def lr_for(config: AsyncConfig, base_lr: float) -> tuple[float, int, str]:
    """(lr, factor, how): the rule's learning rate for these flags."""
    if is_sync(config):
        factor = 1
    elif config.fully_async:
        factor = (config.max_weight_staleness or 0) + 1
    else:
        factor = config.update_weights_interval
    return base_lr / factor, factor, f"{LR_RULE}; {LR_STUDY_NOTE}"


def parse_target(target: str) -> int | None:
    """``"fastest"`` -> None (no age bound); ``"fastest with age <= s"`` -> s, a bound on
    the largest policy lag (optimizer steps between the weights that sampled a token and
    those it trains) and true sample age (oldest token, weight versions)."""
    t = target.strip().lower()
    m = re.fullmatch(r"fastest(?:\s+with\s+age\s*<=\s*(\d+))?", t)
    if not m:
        raise ConfigError(
            f"--target {target!r}: allowed 'fastest' or 'fastest with age <= S' (S an integer, the "
            'largest true sample age in weight versions); fix: e.g. --target "fastest with age <= 2"'
        )
    return int(m.group(1)) if m.group(1) is not None else None


def candidates(config: AsyncConfig, max_age: int | None) -> list[tuple[str, AsyncConfig]]:
    bound = 4 if max_age is None else max_age
    out = [("sync (train.py)", sync_config(config))]
    for k in (1, 2, 4):
        out.append(
            (
                f"one-step, --update-weights-interval {k}",
                dataclasses.replace(sync_config(config), driver="train_async", update_weights_interval=k),
            )
        )
    for s in range(0, bound + 1):
        for handler in ("drop", "retry"):
            out.append(
                (
                    f"fully-async, --max-weight-staleness {s}, --async-unused-samples-handler {handler}",
                    dataclasses.replace(
                        config,
                        driver="train_async",
                        fully_async=True,
                        max_weight_staleness=s,
                        async_unused_samples_handler=handler,
                        pause_generation_mode="retract"
                        if config.pause_generation_mode == "abort"
                        else config.pause_generation_mode,
                    ),
                )
            )
    return out


def recommend(
    costs: CostModel,
    config: AsyncConfig,
    layout: Layout,
    target: str,
    *,
    base_lr: float,
    steps: int | None = None,
    profile: str = "manual",
) -> dict[str, Any]:
    """The fastest candidate settings whose largest true sample age is within the target."""
    max_age = parse_target(target)
    steps = steps or min(config.num_rollout, 30)
    base = dataclasses.replace(config, num_rollout=steps)
    baseline = predict_sync(costs, base, layout, steps)
    rows = []
    for name, cand in candidates(base, max_age):
        if any(v.severity == "error" for v in validate(cand, profile)):
            continue
        p = predict(costs, cand, layout, profile=profile, baseline=baseline)
        # the bound applies to the policy lag in optimizer steps (with interval k a weight
        # version spans k steps, so versions understate it) and to the true version age
        age = max(p["lag_steps"]["max"] or 0, p["age_true"]["max"] or 0)
        lr, factor, _ = lr_for(cand, base_lr)
        rows.append(
            {
                "settings": name,
                "step_s": p["step_s"],
                "speedup": p["speedup"],
                "age_true_max": age,
                "age_recorded_max": p["age_recorded"]["max"],
                "dropped_share": p["dropped_share"],
                "lr": lr,
                "lr_factor": factor,
                "ok": max_age is None or age <= max_age,
            }
        )
    ok = [r for r in rows if r["ok"]]
    best = min(ok, key=lambda r: (round(r["step_s"], 9), r["age_true_max"], r["dropped_share"])) if ok else None
    return {
        "target": target,
        "max_age": max_age,
        "steps_simulated": steps,
        "candidates": rows,
        "best": best,
        "lr_rule": LR_RULE,
        "lr_note": LR_STUDY_NOTE,
    }


# --- engines sweep and plot -----------------------------------------------------------------------


def sweep_engines(
    costs: CostModel, config: AsyncConfig, layout: Layout, counts: list[int], *, steps: int | None = None
) -> list[dict[str, Any]]:
    steps = steps or min(config.num_rollout, 30)
    cfg = dataclasses.replace(config, num_rollout=steps)
    out = []
    for n in counts:
        lay = dataclasses.replace(layout, engines=n)
        p = predict(costs, cfg, lay)
        out.append(
            {
                "engines": n,
                "speedup": p["speedup"],
                "step_s": p["step_s"],
                "sync_step_s": p["sync_step_s"],
                "age_true_mean": p["age_true"]["mean"],
                "age_true_max": p["age_true"]["max"],
                "age_recorded_mean": p["age_recorded"]["mean"],
            }
        )
    return out


def plot_sweep(rows: list[dict[str, Any]], path: Any, title: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pathlib import Path

    from harness.results.plots import DPI

    xs = [r["engines"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(xs, [r["speedup"] for r in rows], "o-", color="#4C72B0", label="speedup over sync (same engines)")
    ax.set_xlabel("rollout engines")
    ax.set_ylabel("predicted speedup over sync (x)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax2 = ax.twinx()
    ax2.plot(xs, [r["age_true_mean"] or 0 for r in rows], "s--", color="#DD8452", label="mean true sample age")
    ax2.plot(xs, [r["age_true_max"] or 0 for r in rows], "^:", color="#C44E52", label="max true sample age")
    ax2.set_ylabel("sample age (weight versions)")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], loc="best", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def engine_counts(n: int) -> list[int]:
    top = max(n, 8)
    out = [2**i for i in range(int(math.log2(top)) + 1)]
    if n not in out:
        out.append(n)
    return sorted(out)
