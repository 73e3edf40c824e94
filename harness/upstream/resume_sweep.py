"""The resume sweep on upstream Miles' own drivers: stop a run at every save boundary and
at seeded points between them, resume it as Miles resumes (``harness.upstream.lives``),
and count per resume the source groups lost and trained twice, by mechanism, with the
response-length bias of what was lost.

The accounting is the one the core's sweep uses (``harness.checking.invariants.resume``:
``resume_report`` and the three resume checkers), on the joined trace of the lives: a
source group is a line of the prompt file in an epoch (``taken``'s ``source_index``,
``epoch``); training counts where the model kept it (a life's steps up to the checkpoint
the next life loaded, the last life's all); a group below the final cursor never trained
and not dropped by upstream's design is lost, with its mechanism (its state when the
loaded checkpoint's data source was saved: ``look_ahead``, ``in_flight``, ``buffered``,
``recycled_partial``, ``over_sampling_leftover``, ``recycled_retry``,
``generated_not_trained``, ...); one trained twice is duplicated; the length bias is the
mean response length of the lost groups over that of the trained ones. Per resume the
table also says whether upstream found the data source's state, and a resume whose life
raised (e.g. a half-written state file loaded) is counted as failed, its losses not.
Each data-source save also lists where the lives module saw upstream hold every open
group (``checkpoint_saved.held``): a second observation the tests hold the accounting to.

``python -m harness.upstream.resume_sweep --miles-src PATH --out results/upstream/resume_sweep``
writes ``.json`` and ``.md`` (``--fast``: the upstream tier's subset). Every run is
bounded by the runner's watchdog (``harness.sim.watchdog``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.sim.scenario import Scenario, scenario_from_dict
from harness.upstream.runner import upstream_refusal
from harness.upstream.lives import (
    CHECKPOINT_LOADED,
    LIFE_END,
    LivesResult,
    Stop,
    run_lives,
)

BASE_ENGINE = {
    "max_running": 8,
    "decode_base_s": 0.05,
    "decode_per_seq_s": 0.0002,
    "prefill_per_token_s": 2e-05,
    "prompt_tokens": 32,
    "response_length": {"kind": "lognormal", "median": 12.0, "sigma": 0.6, "low": 2, "high": 64},
    "seed": 7,
}


@dataclass(frozen=True)
class Setting:
    name: str
    driver: str
    config: dict[str, Any]

    def scenario(self, num_rollout: int, seed: int) -> Scenario:
        cfg = {
            "rollout_batch_size": 4,
            "n_samples_per_prompt": 2,
            "num_rollout": num_rollout,
            "seed": seed,
            "driver": self.driver,
            **self.config,
        }
        return scenario_from_dict(
            {
                "name": f"resume-{self.name}",
                "config": cfg,
                "engine": BASE_ENGINE,
                "trainer": {"step_base_s": 1.0, "per_token_s": 0.0},
                "max_new_tokens": 48,
            }
        )


SETTINGS: tuple[Setting, ...] = (
    Setting("sync", "train", {}),
    Setting("one-step", "train_async", {}),
    Setting("one-step+over-sampling", "train_async", {"over_sampling_batch_size": 8}),
    Setting("one-step+over-sampling+partial", "train_async", {"over_sampling_batch_size": 8, "partial_rollout": True}),
    Setting(
        "fully-async retract drop",
        "train_async",
        {
            "fully_async": True,
            "pause_generation_mode": "retract",
            "max_weight_staleness": 1,
            "async_unused_samples_handler": "drop",
        },
    ),
    Setting(
        "fully-async retract retry",
        "train_async",
        {
            "fully_async": True,
            "pause_generation_mode": "retract",
            "max_weight_staleness": 1,
            "async_unused_samples_handler": "retry",
        },
    ),
    Setting(
        "fully-async in_place retry+partial",
        "train_async",
        {
            "fully_async": True,
            "pause_generation_mode": "in_place",
            "max_weight_staleness": 1,
            "async_unused_samples_handler": "retry",
            "partial_rollout": True,
        },
    ),
)


def stops_for(setting: Setting, *, save_interval: int, num_rollout: int, fast: bool) -> list[tuple[str, list[Stop]]]:
    """The stops of one setting: a crash at every save boundary (one run with all of them),
    each seeded point after the first save, and a planned stop between saves."""
    first = save_interval - 1
    boundaries = list(range(first, num_rollout - 1, save_interval))
    between = ["between_saves", "mid_data_save", "mid_generation", "during_pause", "mid_update", "after_train"]
    if setting.config.get("fully_async"):
        between.insert(3, "mid_drain")
    if fast:
        between = ["mid_generation"]
    runs: list[tuple[str, list[Stop]]] = [(f"save@{b}", [Stop(after=b)]) for b in boundaries[: 1 if fast else None]]
    if not fast:
        runs.append(("save@every", [Stop(after=b) for b in boundaries]))
    runs += [(f"{at}@{first}", [Stop(after=first, at=at)]) for at in between]
    if not fast:
        runs.append((f"planned@{first + 1}", [Stop(after=first + 1, planned=True)]))
    return runs


# --------------------------------------------------------------------------- accounting

RESUME_CHECKS = ("resume_exactly_once", "resume_rollout_once", "resume_versions")


def account(res: LivesResult) -> dict[str, Any]:
    """The run's resume accounting (``harness.checking.invariants.resume.resume_report``,
    the rule the core's sweep uses too), per resume with whether the data source's state
    was found, and each resume checker's violation count. A resume whose life raised
    (upstream failed to resume) is counted as failed, its losses not (``None``)."""
    from harness.checking.invariants.resume import (
        check_resume_exactly_once,
        check_resume_rollout_once,
        check_resume_versions,
        resume_report,
    )

    cfg = res.scenario.config
    report = resume_report(res.events, cfg)
    doc: dict[str, Any] = report.to_dict() if report is not None else {"lost": 0, "duplicated": 0, "resumes": []}
    ends = {e["life"]: e for e in res.events if e.kind == LIFE_END}
    found = {e["life"] for e in res.events if e.kind == CHECKPOINT_LOADED and e["part"] == "data_source"}
    failed = [life for life, e in ends.items() if str(e["at"]).startswith("error")]
    for row in doc["resumes"]:
        life = row["life"]
        row["data_state_found"] = life in found
        row["lost_groups"] = sorted(g.source for g in (report.lost if report else []) if g.life == life - 1)
        if life in failed:
            row.update(lost=None, duplicated=None, mechanisms={}, lost_groups=[], failed=str(ends[life]["at"]))
    fns = (check_resume_exactly_once, check_resume_rollout_once, check_resume_versions)
    checks = {name: len(fn(res.events, cfg)) for name, fn in zip(RESUME_CHECKS, fns)} if report else {}
    counted = [r for r in doc["resumes"] if r["lost"] is not None]
    doc.update(
        lives=len(ends),
        ended=res.ended,
        error=None if res.error is None else repr(res.error)[:300],
        resume_failed=bool(failed),
        checks=checks,
        lost=sum(r["lost"] for r in counted),
        duplicated=sum(r["duplicated"] for r in counted),
    )
    return doc


# --------------------------------------------------------------------------- the sweep


def sweep(
    *,
    fast: bool = False,
    seed: int = 0,
    save_interval: int = 2,
    num_rollout: int = 8,
    settings: tuple[Setting, ...] = SETTINGS,
    orchestration: str = "upstream",
) -> list[dict[str, Any]]:
    """One row per (setting, stop plan). The tree must be activated first; ``orchestration``:
    ``harness.upstream.runner.ORCHESTRATIONS``."""
    from harness.upstream import source

    rows = []
    for st in settings:
        scenario = st.scenario(num_rollout, seed)
        reason = source.refused_reason(scenario.config, orchestration) or upstream_refusal(scenario)
        for label, stops in stops_for(st, save_interval=save_interval, num_rollout=num_rollout, fast=fast):
            row: dict[str, Any] = {"setting": st.name, "driver": st.driver, "stop": label}
            if reason:
                rows.append({**row, "refused": reason})
                continue
            t0 = time.monotonic()
            res = run_lives(
                st.scenario(num_rollout, seed), stops, save_interval=save_interval, orchestration=orchestration
            )
            rows.append({**row, **account(res), "wall_s": round(time.monotonic() - t0, 2)})
    return rows


LEGEND = """Each row: one run of upstream's own driver in virtual time (`harness.upstream.lives`), B=4 groups
of 2 per rollout, 8 rollouts, `--save-interval 2` (saves after rollouts 1, 3, 5, 7), stopped where
`stop` says and resumed through upstream's `--load` path. `lost` / `duplicated`: source groups (prompt
line, epoch) per resume, separated by ` / ` when a run resumes several times; `lost by mechanism`: each
lost group's state when the data source of the checkpoint the resume loaded was saved; length bias: mean
response length of the lost groups over that of the trained ones (finished responses); the last column:
the resume checkers with violations. `n/a`: the resume itself failed (upstream raised).
"""


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| setting | stop | lives ended | lost | duplicated | lost by mechanism | length bias (lost/trained) "
        "| resume checkers failing (violations) |\n|---|---|---|---|---|---|---|---|\n"
    )
    out = []
    for r in rows:
        if "refused" in r:
            out.append(f"| {r['setting']} | {r['stop']} | refused: {r['refused']} | | | | | |")
            continue
        mech = Counter[str]()
        for x in r["resumes"]:
            mech.update(x["mechanisms"])
        per = " / ".join("n/a" if x["lost"] is None else f"{x['lost']}" for x in r["resumes"])
        dper = " / ".join("n/a" if x["duplicated"] is None else f"{x['duplicated']}" for x in r["resumes"])
        bias = (
            "-"
            if r.get("length_bias") is None or r["resume_failed"]
            else f"{r['length_bias']:.2f} ({r['lost_length_mean']:.1f}/{r['trained_length_mean']:.1f})"
        )
        failing = ", ".join(f"{k} {v}" for k, v in r["checks"].items() if v) or "-"
        ended = ", ".join(
            e.split(":")[0] + (f" ({e.split(':')[1]})" if e.startswith("crash") else "") for e in r["ended"]
        )
        if r["resume_failed"]:
            ended += f"; resume failed: {r['error'][:90]}"
        out.append(
            f"| {r['setting']} | {r['stop']} | {ended} | {per} | {dper} | "
            f"{', '.join(f'{k} {v}' for k, v in sorted(mech.items())) or '-'} | {bias} | {failing} |"
        )
    return head + "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.upstream.resume_sweep", description=__doc__.split("\n")[0])
    p.add_argument("--miles-src", default=None, help="the Miles tree (default: $MILES_SRC)")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md (e.g. results/upstream/resume_sweep)")
    p.add_argument("--fast", action="store_true", help="the upstream tier's subset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--orchestration",
        choices=("upstream", "stand-ins"),
        default="upstream",
        help="upstream's own rollout manager, placement groups, train actors, save and load (default) or the "
        "harness' stand-ins",
    )
    ns = p.parse_args(argv)
    from harness.upstream import source

    path, how = source.find_miles_src(ns.miles_src)
    if path is None:
        print(f"--miles-src: {how}", file=sys.stderr)
        return 2
    source.activate(path)
    rows = sweep(fast=ns.fast, seed=ns.seed, orchestration=ns.orchestration)
    md = table(rows)
    print(md)
    if ns.out:
        from harness.results.schema import git_info, machine_info

        out = Path(ns.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = "python -m harness.upstream.resume_sweep " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:])
        )
        doc = {"command": cmd, "git": git_info(), "machine": machine_info(), "miles_tree": path.name, "rows": rows}
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        out.with_suffix(".md").write_text(
            f"# Resume sweep on upstream Miles ({path.name})\n\n`{cmd}`\n\n" + LEGEND + "\n" + md
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
