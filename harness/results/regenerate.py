"""``make results``: regenerate every committed result file, in one go, at a clean HEAD.

Each step is a committed command that writes committed files. The run refuses a dirty
tree (``--allow-dirty`` overrides, and the manifest then says so), runs the steps in
order, and writes ``results/MANIFEST.json``: the commit, the dirty flag, and per step its
command, outputs, wall time and exit code. A failing step stops the run (exit 1); its
outputs are whatever the command left. ``results/README.md`` cites these files by named
keys (``harness.results.figures``; ``suites/harness/test_results_figures.py`` checks it).

    python -m harness.results.regenerate [--only NAME,...] [--allow-dirty] [--list]

A step marked optional runs only when ``--only`` names it (a cheaper remake of an output
another step makes: the Ray validation's report from its kept pairs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results.schema import git_info, machine_info, portable, utc_now

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
CLI = [PY, "-m", "harness.cli"]
BENCH = [PY, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", "bench"]
# the Ray layout's main-job runs, as the advisor's Ray validation calibrates and predicts them
# (harness.advise.validate_runs makes its fresh pairs with the same flags)
RAY_RUN = ["run", "--layout", "ray", "--repeats", "4", "--no-plots", "--modes", "sync,one-step,fully-async"]
WRITE = {"MILES_HARNESS_WRITE_RESULTS": "1"}
# the trees of Miles' orchestration refactor beside the repository (../shared/third_party): its base,
# step #2649 of the stack and the tip (#2542)
REFACTOR = {
    "1200fca8f": "../shared/third_party/miles-1200fca8f",
    "pr2649": "../shared/third_party/miles-pr2649-48920692a",
    "pr2542": "../shared/third_party/miles-pr2542-688cf82b9",
}
TIP = REFACTOR["pr2542"]
# the simulator's baseline for the side-by-side files: the version before its speed work, so
# sim_speed_ab and sim_instructions say what that work gains on the same host in one session
SIM_BASELINE = "d7779bb"
# the simulator with every speed trick, before those that gained under 10% on their own were removed
SIM_ALL_TRICKS = "4329a67"
# the orchestration refactor's tip, beside the checkout as the pinned tree is (../shared/third_party)
REFACTOR_TIP = "../shared/third_party/miles-pr2542-688cf82b9"
PR2661 = "../shared/third_party/miles-pr2661-01cdd291b"


def _diff_upstream(name: str, out: str, *flags: str) -> Step:
    """``diff-upstream`` over its whole matrix, its table on stdout and its per-case JSON; exit 1
    (a case differs or breaks an invariant) is the finding the file records, not a failed step."""
    argv = CLI + ["diff-upstream", *flags, "--json", f"{out}.json", "--log", os.devnull]  # logs: megabytes
    return Step(name, argv, [f"{out}.json", f"{out}.txt"], stdout=f"{out}.txt", optional=True, ok_exits=(0, 1))


@dataclass(frozen=True)
class Step:
    name: str
    argv: list[str]
    outputs: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stdout: str | None = None  # a file that receives the command's standard output
    optional: bool = False  # run only when named (--only), not by make results
    ok_exits: tuple[int, ...] = (0,)  # exits that still made the file (1: the command reports findings)


STEPS: list[Step] = [
    Step("sim_speed", BENCH + ["suites/bench/test_sim_speed.py"], ["results/bench/sim_speed.json"], WRITE),
    # the simulator against its baseline, side by side
    Step(
        "sim_speed_ab",
        [PY, "-m", "harness.results.sim_ab", "--base", SIM_BASELINE, "--pairs", "8"],
        ["results/bench/sim_speed_ab.json"],
    ),
    # the simulator against the version that still had every speed trick the plain-code rule removed
    # (each gained under 10% on its own): what the rule costs, measured in the same session
    Step(
        "sim_speed_ab_tricks",
        [
            PY,
            "-m",
            "harness.results.sim_ab",
            "--base",
            SIM_ALL_TRICKS,
            "--pairs",
            "8",
            "--out",
            "results/bench/sim_speed_ab_tricks.json",
        ],
        ["results/bench/sim_speed_ab_tricks.json"],
    ),
    # the speed path's tricks against the plain reference loop, in one run: samples per CPU-second
    # and cachegrind instructions per sample of each variant
    Step(
        "sim_paths_ab",
        [PY, "-m", "harness.results.sim_paths_ab", "--rounds", "4", "--steps", "200", "--instructions"],
        ["results/bench/sim_paths_ab.json"],
    ),
    # each remaining speed trick against its plain version (harness/results/tricks/*.diff), in one run:
    # samples per CPU-second and cachegrind instructions per sample, and byte-identical traces
    Step(
        "sim_tricks_ab",
        [PY, "-m", "harness.results.sim_tricks_ab", "--rounds", "5", "--steps", "200", "--instructions"],
        ["results/bench/sim_tricks_ab.json"],
    ),
    Step("sim_profile", BENCH + ["suites/bench/test_sim_profile.py"], ["results/bench/sim_profile.json"], WRITE),
    # the same comparison in instructions and cache misses per sample (cachegrind): counts the host's load leaves alone
    Step(
        "sim_instructions",
        [PY, "-m", "harness.results.sim_instructions", "--base", SIM_BASELINE],
        ["results/bench/sim_instructions.json"],
    ),
    Step(
        "engine_throughput",
        BENCH + ["suites/bench/test_engine_throughput.py"],
        ["results/bench/engine_throughput.json"],
        WRITE,
    ),
    Step("ray_layout", BENCH + ["suites/bench/test_ray_layout.py"], ["results/bench/ray_layout.json"], WRITE),
    Step(
        "measurement_cost",
        BENCH + ["suites/bench/test_measurement_cost.py"],
        ["results/bench/measurement_cost.json"],
        WRITE,
    ),
    Step("main_job_a", CLI + ["run", "--out", "results/cpu/run-a"], ["results/cpu/run-a"]),
    Step("main_job_b", CLI + ["run", "--out", "results/cpu/run-b"], ["results/cpu/run-b"]),
    Step(
        "main_job_colocate",
        CLI
        + [
            "run",
            "--layout",
            "colocate",
            "--repeats",
            "1",
            "--no-plots",
            "--modes",
            "sync,fully-async",
            "--out",
            "results/cpu/colocate",
            "--",
            "--allow-async-colocate",
        ],
        ["results/cpu/colocate"],
    ),
    # the Ray layout with one engine and with two, back to back (the advisor's Ray validation
    # calibrates on ray-1, and on ray-2's sync mode for how two engines share the host); 4 repeats:
    # with 2, two runs at clean commits put the worst held-out row at -12.5% s/step (fully-async)
    # and at -14.3% speedup (one-step), the host's run-to-run spread being about the 10% target
    Step(
        "main_job_ray1",
        CLI + RAY_RUN + ["--num-engines", "1", "--out", "results/advise/runs/ray-1"],
        ["results/advise/runs/ray-1"],
    ),
    Step("main_job_ray2", CLI + RAY_RUN + ["--num-engines", "2", "--out", "results/cpu/ray-2"], ["results/cpu/ray-2"]),
    # held-out runs for the advisor's validation: another batch size and update interval
    Step(
        "main_job_b8",
        CLI
        + [
            "run",
            "--repeats",
            "1",
            "--no-plots",
            "--modes",
            "sync,one-step,fully-async",
            "--out",
            "results/advise/runs/b8",
            "--",
            "--rollout-batch-size",
            "8",
        ],
        ["results/advise/runs/b8"],
    ),
    Step(
        "main_job_k2",
        CLI
        + [
            "run",
            "--repeats",
            "1",
            "--no-plots",
            "--modes",
            "sync,one-step",
            "--out",
            "results/advise/runs/k2",
            "--",
            "--update-weights-interval",
            "2",
        ],
        ["results/advise/runs/k2"],
    ),
    Step(
        "advise_validation",
        [
            PY,
            "-m",
            "harness.advise.validate",
            "--calibrate",
            "results/cpu/run-a/results.json",
            "--predict",
            "results/cpu/run-b/results.json",
            "results/advise/runs/b8/results.json",
            "results/advise/runs/k2/results.json",
            "--out",
            "results/advise",
        ],
        ["results/advise/cpu_costs.json", "results/advise/validation.json", "results/advise/validation.md"],
    ),
    Step(
        "advise_validation_ray",
        [
            PY,
            "-m",
            "harness.advise.validate",
            "--calibrate",
            "results/advise/runs/ray-1/results.json",
            "--engines-from",
            "results/cpu/ray-2/results.json",
            "--out",
            "results/advise",
            "--name",
            "_ray",
        ],
        ["results/advise/cpu_costs_ray.json", "results/advise/validation_ray.json", "results/advise/validation_ray.md"],
    ),
    # the same validation on 3 fresh pairs of Ray runs: how far its verdict moves run to run (about 30 min);
    # the pairs are kept after the ones already kept, and the report covers them all (a later model is
    # judged on every pair with --rescore)
    Step(
        "advise_validation_ray_runs",
        [
            PY,
            "-m",
            "harness.advise.validate_runs",
            "--runs",
            "3",
            "--keep",
            "results/advise/ray_pairs",
            "--out",
            "results/advise/validation_ray_runs.json",
        ],
        ["results/advise/validation_ray_runs.json", "results/advise/ray_pairs"],
    ),
    # the same report from the kept pairs alone, after a change of the model or of the report (seconds)
    Step(
        "advise_validation_ray_rescore",
        [
            PY,
            "-m",
            "harness.advise.validate_runs",
            "--rescore",
            "results/advise/ray_pairs",
            "--out",
            "results/advise/validation_ray_runs.json",
        ],
        ["results/advise/validation_ray_runs.json"],
        optional=True,
    ),
    Step(
        "advise_scale",
        CLI
        + [
            "advise",
            "--costs",
            "results/advise/cpu_costs.json",
            "--engines",
            "16",
            "--gpus-per-engine",
            "8",
            "--trainer-gpus",
            "64",
            "--json",
            "--",
            "--fully-async",
            "--rollout-batch-size",
            "512",
            "--n-samples-per-prompt",
            "16",
            "--num-rollout",
            "200",
        ],
        ["results/advise/scale_128gpu.json"],
        stdout="results/advise/scale_128gpu.json",
    ),
    # an example of what the advisor prints for a user (with its target and learning rate), and its plot
    Step(
        "advise_example",
        CLI
        + [
            "advise",
            "--costs",
            "results/advise/cpu_costs.json",
            "--engines",
            "4",
            "--target",
            "fastest with age <= 2",
            "--plot",
            "results/advise/engines_cpu.png",
            "--",
            "--fully-async",
            "--rollout-batch-size",
            "16",
            "--n-samples-per-prompt",
            "8",
            "--num-rollout",
            "30",
        ],
        ["results/advise/advise_example.txt", "results/advise/engines_cpu.png"],
        stdout="results/advise/advise_example.txt",
    ),
    Step(
        "report",
        CLI
        + ["report", "results/cpu/run-a/results.json", "results/cpu/run-b/results.json", "--out", "results/cpu/report"],
        ["results/cpu/report"],
    ),
    Step(
        "gap_tiny",
        CLI
        + [
            "gap",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--dtypes",
            "fp32,bf16,fp16",
            "--num-seqs",
            "16",
            "--max-new-tokens",
            "32",
            "--seed",
            "0",
            "--threads",
            "1",
            "--out",
            "results/gap/tiny-cpu",
        ],
        ["results/gap/tiny-cpu"],
    ),
    Step(
        "gap_smollm2",
        CLI
        + [
            "gap",
            "--model",
            "smollm2",
            "--device",
            "cpu",
            "--dtypes",
            "fp32,bf16,fp16",
            "--num-seqs",
            "4",
            "--max-new-tokens",
            "16",
            "--seed",
            "0",
            "--threads",
            "1",
            "--out",
            "results/gap/smollm2-cpu",
        ],
        ["results/gap/smollm2-cpu"],
    ),
    # peak resident memory of the main job on SmolLM2 with the gap decomposition on
    Step(
        "memory_smollm2",
        CLI
        + [
            "run",
            "--model",
            "smollm2",
            "--modes",
            "one-step,fully-async",
            "--steps",
            "4",
            "--repeats",
            "1",
            "--no-plots",
            "--out",
            "results/gap/smollm2-run-memory",
        ],
        ["results/gap/smollm2-run-memory"],
    ),
    Step(
        "upstream_faults",
        [PY, "-m", "harness.upstream.fault_sweep", "sweep", "--runs", "10000", "--jobs", "2", "--write"],
        ["results/upstream/fault_findings.json", "results/upstream/fault_findings.md"],
    ),
    # upstream's train_async.py on the CPU servers, SIGKILLed after a checkpoint and resumed with --load, checked
    Step(
        "record_kill_resume_one_step",
        [
            PY,
            "-m",
            "harness.record.resume_run",
            "--kill-and-resume",
            "--steps",
            "6",
            "--save-interval",
            "2",
            "--train-extra-s",
            "0.3",
            "--out",
            "results/record/kill_resume_one_step.json",
        ],
        ["results/record/kill_resume_one_step.json"],
    ),
    Step(
        "record_kill_resume_fully_async",
        [
            PY,
            "-m",
            "harness.record.resume_run",
            "--kill-and-resume",
            "--fully-async",
            "--steps",
            "6",
            "--save-interval",
            "2",
            "--train-extra-s",
            "0.3",
            "--out",
            "results/record/kill_resume_fully_async.json",
        ],
        ["results/record/kill_resume_fully_async.json"],
    ),
    # the differential on the pinned tree and on the refactor's tip
    _diff_upstream("diff_pinned_upstream", "results/upstream/diff_pinned_upstream"),
    _diff_upstream("diff_tip_upstream", "results/upstream/diff_tip_upstream", "--miles-src", REFACTOR_TIP),
    # the tip of Miles' orchestration refactor (controller-executor shape, its own orchestration): the resume
    # sweep (fast, beside the pinned tree's, and whole) and the fault schedules; and the gate across its stack
    Step(
        "resume_sweep_tip_fast",
        CLI
        + [
            "resume-sweep",
            "--host",
            "upstream",
            "--miles-src",
            TIP,
            "--fast",
            "--json",
            "results/resume/tip_fast.json",
        ],
        ["results/resume/tip_fast.json", "results/resume/tip_fast.txt"],
        stdout="results/resume/tip_fast.txt",
        optional=True,
    ),
    Step(
        "resume_sweep_tip",
        CLI + ["resume-sweep", "--host", "upstream", "--miles-src", TIP, "--json", "results/resume/tip.json"],
        ["results/resume/tip.json", "results/resume/tip.txt"],
        stdout="results/resume/tip.txt",
        optional=True,
    ),
    Step(
        "upstream_faults_tip",
        [PY, "-m", "harness.upstream.fault_sweep", "--miles-src", TIP, "sweep"]
        + ["--runs", "1000", "--jobs", "2", "--known", "results/upstream/fault_findings_tip.json"]
        + ["--out", "results/upstream/fault_findings_tip"],
        ["results/upstream/fault_findings_tip.json", "results/upstream/fault_findings_tip.md"],
    ),
    *(
        Step(
            f"gate_{head}_{base}",
            [PY, "-m", "harness.upstream.gate_digest", "--miles-src", REFACTOR[head], "--base", REFACTOR[base]]
            + ["--out", f"results/upstream/gate_{head}_{base}"],
            [f"results/upstream/gate_{head}_{base}.json", f"results/upstream/gate_{head}_{base}.md"],
        )
        for head, base in (("pr2649", "1200fca8f"), ("pr2542", "pr2649"), ("pr2542", "1200fca8f"))
    ),
    Step(
        "serve_upstream_e2e",
        [PY, "-m", "harness.serve.upstream_e2e", "--out", "results/serve/upstream_e2e.json"],
        ["results/serve/upstream_e2e.json"],
    ),
    # upstream's loop on the CPU servers with the recorder: clean runs and each seeded bug in real time
    Step(
        "record_mutant_runs",
        [PY, "-m", "harness.record.mutant_runs", "--steps", "4", "--out", "results/record/mutant_runs.json"],
        ["results/record/mutant_runs.json"],
    ),
    # the recorder's cost: upstream's loop on the CPU servers with and without it, in pairs
    Step("record_cost", BENCH + ["suites/bench/test_record_cost.py"], ["results/bench/record_cost.json"], WRITE),
    # the resume sweep on a tree that repairs upstream's resume (Miles pull request 2661: the data source is
    # snapshotted when rollout N's generation returns and saved under N), against the pinned tree's rows
    Step(
        "resume_sweep_pr2661",
        CLI
        + ["resume-sweep", "--host", "upstream", "--miles-src", PR2661, "--fast"]
        + ["--json", "results/resume/pr2661_fast.json"],
        ["results/resume/pr2661_fast.json", "results/resume/pr2661_fast.txt"],
        stdout="results/resume/pr2661_fast.txt",
        optional=True,
    ),
    Step(
        "resume_sweep_pinned_fast",
        CLI + ["resume-sweep", "--host", "upstream", "--fast", "--json", "results/resume/pinned_fast.json"],
        ["results/resume/pinned_fast.json", "results/resume/pinned_fast.txt"],
        stdout="results/resume/pinned_fast.txt",
        optional=True,
    ),
    # the resume sweep, one table: the core's drivers and upstream's own (pinned tree), same cases, row by row
    Step(
        "resume_sweep",
        CLI + ["resume-sweep", "--host", "core,upstream", "--json", "results/resume/sweep.json"],
        ["results/resume/sweep.json", "results/resume/sweep.txt"],
        stdout="results/resume/sweep.txt",
    ),
    # the core with the harness extension exactly_once_resume
    Step(
        "resume_sweep_core_exactly_once",
        CLI + ["resume-sweep", "--exactly-once", "--json", "results/resume/core_exactly_once.json"],
        ["results/resume/core_exactly_once.json", "results/resume/core_exactly_once.txt"],
        stdout="results/resume/core_exactly_once.txt",
    ),
]


def select(only: str | None) -> list[Step]:
    if not only:
        return [s for s in STEPS if not s.optional]
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {s.name for s in STEPS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(
            f"--only {only!r}: unknown step(s) {unknown}; allowed: {', '.join(sorted(known))}. "
            "Fix: name steps from --list."
        )
    return [s for s in STEPS if s.name in names]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.results.regenerate", description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma list of step names (default: all)")
    p.add_argument("--allow-dirty", action="store_true", help="run on a tree with uncommitted changes")
    p.add_argument("--list", action="store_true", help="print the steps and exit")
    args = p.parse_args(argv)
    steps = select(args.only)
    if args.list:
        for s in STEPS if not args.only else steps:  # the optional steps too, marked
            print(
                f"{s.name:<18} {' '.join(s.argv[1:] if s.argv[0] == PY else s.argv)}  ->  {', '.join(s.outputs)}"
                + ("  (optional: only with --only)" if s.optional else "")
            )
        return 0
    git = git_info() or {}
    if git.get("dirty") and not args.allow_dirty:
        print(
            "make results: the tree has uncommitted changes, so the files would not match a commit. "
            "Fix: commit or stash first, or pass --allow-dirty (recorded in results/MANIFEST.json)."
        )
        return 2
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "started_utc": utc_now(),
        "git": git,
        "machine": machine_info(),
        "steps": [],
    }
    rc = 0
    for step in steps:
        print(f"== {step.name}: {' '.join(step.argv)}", flush=True)
        t0 = time.perf_counter()
        if step.stdout:
            with open(ROOT / step.stdout, "w") as out:
                rc = subprocess.run(
                    step.argv, cwd=ROOT, env={**os.environ, **step.env}, stdout=out, check=False
                ).returncode
            # a command's output quotes paths (the tree, upstream's log lines): written as a reader follows them
            stdout = ROOT / step.stdout
            stdout.write_text(portable(stdout.read_text()))
        else:
            rc = subprocess.run(step.argv, cwd=ROOT, env={**os.environ, **step.env}, check=False).returncode
        manifest["steps"].append(
            {
                "name": step.name,
                "argv": step.argv[1:] if step.argv[0] == PY else step.argv,
                "env": step.env,
                "outputs": step.outputs,
                "wall_s": round(time.perf_counter() - t0, 1),
                "rc": rc,
            }
        )
        if rc not in step.ok_exits:
            print(f"make results: step {step.name} failed with exit {rc}; stopping")
            break
        rc = 0
    _merge_manifest(manifest)
    return 1 if rc else 0


def _merge_manifest(manifest: dict, path: Path = ROOT / "results" / "MANIFEST.json") -> None:
    """Keep earlier entries for steps not rerun (``--only``) that are still steps, so the file
    covers every output and names no output a removed step made.
    Each step records the commit and the machine it ran at (``git``, ``machine``); the
    top-level ``git`` and ``machine`` are those of the latest run. A kept step without its
    own ``git`` takes the earlier top-level one; one without ``machine`` (recorded before
    steps had it) gets none: which machine made it is then in its output files, where they
    record one."""
    earlier = json.loads(path.read_text()) if path.exists() else {}
    ran = {s["name"] for s in manifest["steps"]}
    kept = [
        dict(s, git=earlier.get("git")) if "git" not in s else s
        for s in earlier.get("steps", [])
        if s["name"] not in ran and s["name"] in {step.name for step in STEPS}
    ]
    for s in manifest["steps"]:
        s["git"], s["machine"] = manifest["git"], manifest["machine"]
    manifest["steps"] = kept + manifest["steps"]
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
