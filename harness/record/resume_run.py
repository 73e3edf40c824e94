"""Upstream's ``train_async.py`` on the CPU servers, recorded, with checkpoints: one life of
a run that is killed and resumed through upstream's own ``--load`` path.

``python -m harness.record.resume_run --record-dir DIR --ckpt CKPT [...]`` is one life (one
process): the recorded served run of ``harness.record.served_run`` with ``--save CKPT
--load CKPT --save-interval K``, all of it upstream's but the leaves:

* the driver saves the model (``actor_model.save_model(N)``: the train actor leaf writes
  the torch trainer's weights, optimizer and step count into ``CKPT/iter_<N>/trainer.pt``,
  then Megatron's tracker ``latest_checkpointed_iteration.txt``, recorded as the model
  part of the checkpoint with the version its weights were served as) and then
  ``rollout_manager.save.remote(N)``, which saves the data source (the recorder's
  ``RecordingDataSource`` records it; upstream's ``RolloutDataSourceWithBuffer`` writes
  ``CKPT/rollout/global_dataset_state_dict_<N>.pt``);
* at start-up ``create_training_models`` (``placement_group.py``) initialises the train
  actors (the leaf loads the checkpoint the tracker names: ``start_rollout_id = loaded +
  1``, Megatron, ``actor.py:L212``) and calls ``rollout_manager.load.remote(start - 1)``;
  the driver's first ``update_weights`` pushes the loaded weights to the new servers.

Run it, SIGKILL it mid-way, run the same command again: the second life resumes from the
last checkpoint, and ``miles-harness check-trace --merge DIR`` joins the lives
(``harness.record.merge.split_lives``) and runs the resume checkers with the others.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TypedDict

from harness.serve import upstream_e2e

from . import served_run

TRACKER = "latest_checkpointed_iteration.txt"


class ResumableRun(served_run._RecordedRun):
    """The recorded served run with ``--save CKPT --load CKPT --save-interval K`` on
    upstream's ``args``: what a user adds to the command line. Upstream's validation turns
    ``--load`` without Megatron's tracker into a fresh start (``arguments.py:L3046-L3057``)."""

    ckpt: Path
    save_interval: int = 1

    def configure_args(self, args: Any) -> None:
        super().configure_args(args)
        vars(args).update(
            save=str(self.ckpt), load=str(self.ckpt), save_interval=self.save_interval, start_rollout_id=None
        )


def _life_argv(ns: argparse.Namespace) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "harness.record.resume_run",
        "--record-dir",
        str(ns.record_dir),
        "--ckpt",
        str(ns.ckpt),
        "--steps",
        str(ns.steps),
        "--save-interval",
        str(ns.save_interval),
        "--servers",
        str(ns.servers),
        "--train-extra-s",
        str(ns.train_extra_s),
        "--seed",
        str(ns.seed),
    ]
    if ns.miles_src:
        argv += ["--miles-src", str(ns.miles_src)]
    if ns.fully_async:
        argv.append("--fully-async")
    return argv


def saw_kill_point(record_dir: Path, kill_after: int) -> bool:
    """The rollout process has saved the data source of rollout ``kill_after`` and then
    handed a later rollout to training: the kill comes between two save boundaries."""
    for path in record_dir.glob("rollout-*.jsonl"):
        saved = False
        for line in path.read_text(errors="replace").splitlines():
            if not line.endswith("}"):
                continue
            d = json.loads(line)
            if d.get("kind") == "checkpoint_saved" and d.get("part") == "data_source" and d["rollout_id"] == kill_after:
                saved = True
            elif saved and d.get("kind") == "trained" and d.get("rollout_id", -1) > kill_after:
                return True
    return False


class KillResumeOutcome(TypedDict):
    killed: bool
    life0_returncode: int | None
    life1_returncode: int | None
    life1: list[str]  # life 1's last stdout line
    life1_stderr: str
    check_returncode: int
    check_output: str
    check_stderr: str
    wall_s: float


def kill_and_resume(ns: argparse.Namespace, *, timeout_s: float = 480.0) -> KillResumeOutcome:
    """Life 0 in a child process, SIGKILLed once it has saved the checkpoint of rollout
    ``ns.kill_after`` and trained a later rollout; life 1, the same command, resumes from
    that checkpoint and runs to the end; then ``miles-harness check-trace --merge``."""
    import os
    import signal
    import subprocess
    import time

    record_dir = Path(ns.record_dir)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    life0 = subprocess.Popen(_life_argv(ns), env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    killed = False
    while life0.poll() is None and time.monotonic() - t0 < timeout_s:
        if saw_kill_point(record_dir, ns.kill_after):
            os.kill(life0.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.05)
    if not killed and life0.poll() is None:
        life0.kill()
    life0.wait()
    left = max(30.0, timeout_s - (time.monotonic() - t0))
    life1 = subprocess.run(_life_argv(ns), check=False, env=env, capture_output=True, text=True, timeout=left)
    cmd = [sys.executable, "-m", "harness.cli", "check-trace", "--merge", str(record_dir)]
    if any(_cut(p) for p in record_dir.glob("*.jsonl")):  # life 0 killed mid-line: its last line is dropped
        cmd.append("--incomplete")
    check = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=300)
    return {
        "killed": killed,
        "life0_returncode": life0.returncode,
        "life1_returncode": life1.returncode,
        "life1": life1.stdout.strip().splitlines()[-1:] if life1.stdout else [],
        "life1_stderr": life1.stderr[-2000:],
        "check_returncode": check.returncode,
        "check_output": check.stdout,
        "check_stderr": check.stderr[-2000:],
        "wall_s": round(time.monotonic() - t0, 1),
    }


def _cut(path: Path) -> bool:
    data = path.read_bytes()
    return bool(data) and not data.endswith(b"\n")


def verdict_lines(check_output: str) -> dict[str, str]:
    """``check-trace --merge``'s verdict per checker (``PASS``, ``FAIL (n violations)``,
    ``NOT APPLICABLE: ...``), read from its output."""
    out = {}
    for line in check_output.splitlines():
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name and not name.startswith(("[", "t=")) and rest.startswith(("PASS", "FAIL", "NOT APPLICABLE")):
            out[name] = rest
    return out


def _kill_and_resume_main(ns: argparse.Namespace, argv: list[str] | None) -> int:
    import shutil
    import tempfile

    from harness.checking.invariants.resume import resume_report
    from harness.record.merge import MERGED_NAME
    from harness.trace import read_jsonl

    tmp = Path(tempfile.mkdtemp(prefix="miles-harness-kill-resume-"))
    ns.record_dir = Path(ns.record_dir) if ns.record_dir else tmp / "record"
    ns.ckpt = Path(ns.ckpt) if ns.ckpt else tmp / "ckpt"
    try:
        out = kill_and_resume(ns)
        print(out["check_output"])
        merged = ns.record_dir / MERGED_NAME
        events = read_jsonl(merged) if merged.exists() else []
        report = resume_report(events)
        summary = {
            **{k: v for k, v in out.items() if k not in ("check_output", "check_stderr", "life1_stderr")},
            "lives": sum(1 for e in events if e.kind == "life_start"),
            "life_starts": [
                {k: e.fields.get(k) for k in ("life", "start_rollout_id", "loaded_version")}
                for e in events
                if e.kind == "life_start"
            ],
            "verdicts": verdict_lines(out["check_output"]),
            "resume": report.to_dict() if report is not None else None,
        }
        print(json.dumps(summary, indent=1, default=str))
        if ns.out:
            from harness.results.schema import git_info, machine_info

            cmd = "python -m harness.record.resume_run " + " ".join(argv if argv is not None else sys.argv[1:])
            Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
            Path(ns.out).write_text(
                json.dumps(
                    {"command": cmd, "git": git_info(), "machine": machine_info(), "run": summary},
                    indent=1,
                    default=str,
                )
                + "\n"
            )
        return 0 if out["killed"] and out["life1_returncode"] == 0 and out["check_returncode"] in (0, 1) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.record.resume_run", description=__doc__.split("\n")[0])
    p.add_argument(
        "--record-dir",
        default=None,
        help="MILES_HARNESS_RECORD_DIR: the same for every life (--kill-and-resume: a temporary one by default)",
    )
    p.add_argument(
        "--ckpt",
        default=None,
        help="--save and --load: the same for every life (--kill-and-resume: a temporary one by default)",
    )
    p.add_argument("--out", default=None, help="--kill-and-resume: write the run's summary as JSON here")
    p.add_argument("--miles-src", default=None)
    p.add_argument("--steps", type=int, default=6, help="--num-rollout")
    p.add_argument("--save-interval", type=int, default=2)
    p.add_argument("--fully-async", action="store_true")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--train-extra-s", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--kill-and-resume",
        action="store_true",
        help="run life 0 in a child, SIGKILL it after --kill-after's checkpoint and one more trained "
        "rollout, run life 1 (the same command) and check-trace --merge the record directory",
    )
    p.add_argument("--kill-after", type=int, default=1, help="the checkpoint (rollout id) life 0 is killed after")
    ns = p.parse_args(argv)
    if ns.kill_and_resume:
        return _kill_and_resume_main(ns, argv)
    if ns.record_dir is None or ns.ckpt is None:
        p.error("one life needs --record-dir and --ckpt (the same for every life)")
    import torch

    torch.set_num_threads(1)
    cfg = upstream_e2e.E2EConfig(
        name="kill-and-resume",
        fully_async=ns.fully_async,
        pause_mode="retract",
        transfer="tensor",
        servers=ns.servers,
        steps=ns.steps,
        seed=ns.seed,
        train_extra_s=ns.train_extra_s,
        max_weight_staleness=1 if ns.fully_async else None,
        max_concurrent_samples=8 if ns.fully_async else None,
    )
    ckpt = Path(ns.ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)

    class Run(ResumableRun):
        pass

    Run.ckpt, Run.save_interval = ckpt, ns.save_interval
    res = served_run.run_recorded(cfg, ns.record_dir, miles_src=ns.miles_src, run_class=Run, incomplete=True)
    out = {
        "steps_trained": res.e2e.steps_trained,
        "error": res.e2e.error,
        "verdict": res.verdict["ran"],
        "lacking": sorted(res.verdict["lacking"]),
        "lives": sum(1 for e in res.merged.events if e.kind == "life_start"),
    }
    print(json.dumps(out))
    return 0 if res.e2e.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
