"""The resume sweep on upstream Miles' own drivers: stop a run at every save boundary and
at seeded points between them, resume it as Miles resumes (``harness.upstream.lives``),
and count per resume the source groups lost and trained twice, by mechanism, with the
response-length bias of what was lost.

A source group is a line of the prompt file in an epoch (``taken``'s ``source_index``,
``epoch``). Training counts where the model kept it: a life's ``trained`` rollouts up to
the checkpoint the next life loaded (later ones were trained on weights the resume threw
away), and the last life's all. Per resume (life L -> L+1, loading the data source of
rollout S):

* **lost**: a source group taken before that save and not trained by it, never trained
  in any life and not dropped by upstream's design (a ``dropped`` or filter-rejected
  group: those are upstream's counted drops, not the resume's); its mechanism is where
  upstream held it at the save (``checkpoint_saved.held``): ``look_ahead`` (taken for a
  later rollout than the one saved), ``in_flight``, ``buffered`` (fully-async buffer),
  ``recycled`` (a partial group in the data source's recycle buffer), ``leftover`` (one
  put back with no response: over-sampling or a retry), or ``not_held`` (taken after
  the save: lost though the cursor saved was behind it, which names a broken load);
* **duplicated**: a source group trained (where the model kept it) both before and
  after the resume: the cursor restored behind what training had consumed.

The length bias: the mean response length of the lost groups' samples (what the engine
returned, or for a sample that never finished the length the simulated engine draws for
it) over that of all trained samples. A resume whose next life fails (upstream raised:
e.g. a half-written state file loaded) is counted as ``resume_failed``.

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

from miles_async_core import events as ev
from harness.sim.scenario import Scenario, scenario_from_dict
from harness.upstream.lives import CHECKPOINT_LOADED, CHECKPOINT_SAVED, LIFE_END, LivesResult, Stop, run_lives

MECHANISMS = ("look_ahead", "in_flight", "buffered", "recycled", "leftover", "not_held")

BASE_ENGINE = {"max_running": 8, "decode_base_s": 0.05, "decode_per_seq_s": 0.0002, "prefill_per_token_s": 2e-05,
               "prompt_tokens": 32, "response_length": {"kind": "lognormal", "median": 12.0, "sigma": 0.6, "low": 2,
                                                        "high": 64}, "seed": 7}


@dataclass(frozen=True)
class Setting:
    name: str
    driver: str
    config: dict[str, Any]

    def scenario(self, num_rollout: int, seed: int) -> Scenario:
        cfg = {"rollout_batch_size": 4, "n_samples_per_prompt": 2, "num_rollout": num_rollout, "seed": seed,
               "driver": self.driver, **self.config}
        return scenario_from_dict({"name": f"resume-{self.name}", "config": cfg, "engine": BASE_ENGINE,
                                   "trainer": {"step_base_s": 1.0, "per_token_s": 0.0}, "max_new_tokens": 48})


SETTINGS: tuple[Setting, ...] = (
    Setting("sync", "train", {}),
    Setting("one-step", "train_async", {}),
    Setting("one-step+over-sampling", "train_async", {"over_sampling_batch_size": 8}),
    Setting("one-step+over-sampling+partial", "train_async", {"over_sampling_batch_size": 8,
                                                              "partial_rollout": True}),
    Setting("fully-async retract drop", "train_async", {"fully_async": True, "pause_generation_mode": "retract",
                                                        "max_weight_staleness": 1,
                                                        "async_unused_samples_handler": "drop"}),
    Setting("fully-async retract retry", "train_async", {"fully_async": True, "pause_generation_mode": "retract",
                                                         "max_weight_staleness": 1,
                                                         "async_unused_samples_handler": "retry"}),
    Setting("fully-async in_place retry+partial", "train_async",
            {"fully_async": True, "pause_generation_mode": "in_place", "max_weight_staleness": 1,
             "async_unused_samples_handler": "retry", "partial_rollout": True}),
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

def _lengths(res: LivesResult) -> dict[tuple[int, int], int]:
    """Response length per (life, sample index): the last ``finished`` of the sample, else
    the simulated engine's draw for its first attempt (what it would have returned)."""
    from harness.sim.engine import _uniform

    out: dict[tuple[int, int], int] = {}
    for e in res.events:
        if e.kind == ev.FINISHED:
            out[(e["life"], e["index"])] = int(e["response_length"])
    eng = res.scenario.engine
    cap = res.scenario.max_new_tokens
    for e in res.events:
        if e.kind == ev.TAKEN:
            for i in e["indices"]:
                out.setdefault((e["life"], i), min(cap, eng.response_length.draw(_uniform(eng.seed, i, 0))))
    return out


def account(res: LivesResult) -> dict[str, Any]:
    """Lost and duplicated source groups per resume, by mechanism, with the length bias."""
    lives = max((e["life"] for e in res.events), default=-1) + 1
    key: dict[tuple[int, int], tuple[int, int]] = {}  # (life, group) -> (source_index, epoch)
    samples: dict[tuple[int, int], list[int]] = {}
    taken_at: dict[tuple[int, int], float] = {}
    loaded_model: dict[int, int] = {}  # life -> rollout of the model it loaded (-1: none)
    loaded_data: dict[int, int] = {}
    saves: dict[tuple[int, int], Any] = {}  # (life, rollout) -> the data-source save event
    dropped: set[tuple[int, int]] = set()
    ended: dict[int, str] = {}
    for e in res.events:
        life = e["life"]
        if e.kind == ev.TAKEN and "source_index" in e.fields:
            key[(life, e["group_index"])] = (e["source_index"], e["epoch"])
            samples[(life, e["group_index"])] = list(e["indices"])
            taken_at.setdefault((life, e["group_index"]), e.t)
        elif e.kind == CHECKPOINT_LOADED:
            (loaded_model if e["part"] == "model" else loaded_data)[life] = e["rollout_id"]
        elif e.kind == CHECKPOINT_SAVED and e["part"] == "data_source":
            saves[(life, e["rollout_id"])] = e
        elif e.kind == ev.DROPPED or (e.kind == ev.PUT_REJECTED and str(e["reason"]).startswith("dynamic_filter")):
            dropped.add((life, e["group_index"]))
        elif e.kind == LIFE_END:
            ended[life] = f"{e['how']}" + (f":{e['at']}" if e["at"] else "")
    kept: dict[tuple[int, int], list[tuple[int, int]]] = {}  # source -> [(life, rollout)] trained and kept
    trained_groups: list[tuple[int, int]] = []
    for e in res.events:
        if e.kind != ev.TRAINED:
            continue
        life = e["life"]
        upto = loaded_model.get(life + 1, -1) if life + 1 < lives else None
        if upto is not None and e["rollout_id"] > upto:
            continue
        for gi in e["group_indices"]:
            if (life, gi) in key:
                kept.setdefault(key[(life, gi)], []).append((life, e["rollout_id"]))
                trained_groups.append((life, gi))
    dropped_sources = {key[g] for g in dropped if g in key}
    final_pending = {key[(lives - 1, gi)] for e in res.events if e.kind == LIFE_END and e["life"] == lives - 1
                     for gi in e["pending_groups"] if (lives - 1, gi) in key}
    lengths = _lengths(res)
    trained_len = [lengths[(life, i)] for life, gi in trained_groups for i in samples[(life, gi)]
                   if (life, i) in lengths]
    resumes = []
    all_lost: list[tuple[int, int]] = []
    for life in range(1, lives):
        if ended.get(life, "").startswith("crash:error"):  # the resumed life raised: no resume to count
            resumes.append({"resume": life, "after_life_ended": ended.get(life - 1, "?"), "failed": ended.get(life),
                            "lost": None, "duplicated": None, "lost_by_mechanism": {}, "lost_groups": []})
            continue
        found = life in loaded_data
        rollout = loaded_data.get(life, loaded_model.get(life, -1))
        save = saves.get((life - 1, rollout)) if found else None
        lost_by: Counter[str] = Counter()
        lost_groups: list[tuple[int, int]] = []
        held = {gi: m for m, gis in (save["held"].items() if save is not None else ()) for gi in gis}
        for (lf, gi), src in key.items():
            if lf != life - 1 or src in kept or src in dropped_sources or src in final_pending:
                continue
            if any(s == src for s in (key.get(g) for g in lost_groups)):
                continue
            lost_groups.append((lf, gi))
            lost_by[held.get(gi, "not_held")] += 1
        dup = sum(1 for src, where in kept.items()
                  if any(lf < life for lf, _ in where) and any(lf >= life for lf, _ in where))
        all_lost += lost_groups
        resumes.append({"resume": life, "after_life_ended": ended.get(life - 1, "?"),
                        "loaded_model_rollout": loaded_model.get(life), "loaded_data_rollout": rollout if found else None,
                        "data_state_found": found, "lost": len(lost_groups), "duplicated": dup,
                        "lost_by_mechanism": dict(sorted(lost_by.items())),
                        "lost_groups": sorted(key[g] for g in lost_groups)})
    lost_len = [lengths[(life, i)] for life, gi in all_lost for i in samples[(life, gi)] if (life, i) in lengths]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    lm, tm = mean(lost_len), mean(trained_len)
    return {"lives": lives, "ended": res.ended, "error": None if res.error is None else repr(res.error)[:300],
            "resume_failed": res.error is not None, "resumes": resumes,
            "lost": sum(r["lost"] or 0 for r in resumes), "duplicated": sum(r["duplicated"] or 0 for r in resumes),
            "trained_sources": len(kept), "trained_twice": sum(1 for w in kept.values() if len(w) > 1),
            "mean_len_lost": lm, "mean_len_trained": tm,
            "length_bias": None if lm is None or not tm else round(lm / tm, 3)}


# --------------------------------------------------------------------------- the sweep

def sweep(*, fast: bool = False, seed: int = 0, save_interval: int = 2, num_rollout: int = 8,
          settings: tuple[Setting, ...] = SETTINGS) -> list[dict[str, Any]]:
    """One row per (setting, stop plan). The tree must be activated first."""
    from harness.upstream import source

    rows = []
    for st in settings:
        reason = source.refused_reason(st.scenario(num_rollout, seed).config)
        for label, stops in stops_for(st, save_interval=save_interval, num_rollout=num_rollout, fast=fast):
            row: dict[str, Any] = {"setting": st.name, "driver": st.driver, "stop": label}
            if reason:
                rows.append({**row, "refused": reason})
                continue
            t0 = time.monotonic()
            res = run_lives(st.scenario(num_rollout, seed), stops, save_interval=save_interval)
            rows.append({**row, **account(res), "wall_s": round(time.monotonic() - t0, 2)})
    return rows


LEGEND = """Each row: one run of upstream's own driver in virtual time (`harness.upstream.lives`), B=4 groups
of 2 per rollout, 8 rollouts, `--save-interval 2` (saves after rollouts 1, 3, 5, 7), stopped where
`stop` says and resumed through upstream's `--load` path. `lost` / `duplicated`: source groups (prompt
line, epoch) per resume, separated by ` / ` when a run resumes several times; `lost by mechanism`: where
upstream held each lost group at the save the resume loaded; length bias: mean response length of the
lost groups' samples over that of all trained samples. `n/a`: the resume itself failed (upstream raised).
"""


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| setting | stop | lives ended | lost | duplicated | lost by mechanism | length bias (lost/trained) |\n"
            "|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        if "refused" in r:
            out.append(f"| {r['setting']} | {r['stop']} | refused: {r['refused']} | | | | |")
            continue
        mech = Counter[str]()
        for x in r["resumes"]:
            mech.update(x["lost_by_mechanism"])
        per = " / ".join("n/a" if x["lost"] is None else f"{x['lost']}" for x in r["resumes"])
        dper = " / ".join("n/a" if x["duplicated"] is None else f"{x['duplicated']}" for x in r["resumes"])
        bias = "-" if r["length_bias"] is None else f"{r['length_bias']:.2f} ({r['mean_len_lost']:.1f}/{r['mean_len_trained']:.1f})"
        ended = ", ".join(e.split(":")[0] + (f" ({e.split(':')[1]})" if e.startswith("crash") else "")
                          for e in r["ended"])
        if r["resume_failed"]:
            ended += f"; resume failed: {r['error'][:90]}"
        out.append(f"| {r['setting']} | {r['stop']} | {ended} | {per} | {dper} | "
                   f"{', '.join(f'{k} {v}' for k, v in sorted(mech.items())) or '-'} | {bias} |")
    return head + "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.upstream.resume_sweep", description=__doc__.split("\n")[0])
    p.add_argument("--miles-src", default=None, help="the Miles tree (default: $MILES_SRC)")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md (e.g. results/upstream/resume_sweep)")
    p.add_argument("--fast", action="store_true", help="the upstream tier's subset")
    p.add_argument("--seed", type=int, default=0)
    ns = p.parse_args(argv)
    from harness.upstream import source

    path, how = source.find_miles_src(ns.miles_src)
    if path is None:
        print(f"--miles-src: {how}", file=sys.stderr)
        return 2
    source.activate(path)
    rows = sweep(fast=ns.fast, seed=ns.seed)
    md = table(rows)
    print(md)
    if ns.out:
        from harness.results.schema import git_info, machine_info

        out = Path(ns.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = "python -m harness.upstream.resume_sweep " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:]))
        doc = {"command": cmd, "git": git_info(), "machine": machine_info(), "miles_tree": path.name,
               "rows": rows}
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        out.with_suffix(".md").write_text(f"# Resume sweep on upstream Miles ({path.name})\n\n`{cmd}`\n\n" + LEGEND
                                          + "\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
