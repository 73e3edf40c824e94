"""Upstream Miles end to end on the CPU servers with the recorder installed by its flags.

``run_recorded(E2EConfig(...), record_dir)`` is ``harness.serve.upstream_e2e``'s run
(upstream's ``train_async.py`` and orchestration, real HTTP through ``MilesRouter`` to the
CPU servers, the torch trainer as the train actor's leaf) with the recorder's flags set on
upstream's ``args`` (``harness.record.recorder_flags``), what a Miles user would do:
upstream's ``RolloutManager`` builds the data source and rollout function from them
(``rollout_manager.py:L69-L80``) and calls the log and conversion functions they name
after each rollout (``L156-L163``).

Each server's trace is written into the record directory as a process file of role
``server-N`` when the servers stop (what ``miles-harness serve --trace`` writes, on the
same host's clocks), then ``harness.record.merge`` merges everything into one trace.
"""

from __future__ import annotations

import json
import argparse
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.serve import upstream_e2e

from . import recorder_flags
from miles_async_core.errors import ConfigError

from .writer import DIR_ENV, close_all, write_foreign_trace

if TYPE_CHECKING:
    from miles_async_core.config import AsyncConfig

    from .merge import Merged, Verdict


def async_config(cfg: upstream_e2e.E2EConfig) -> AsyncConfig:
    """The run's config as the checkers read it (the fields ``upstream_e2e`` sets)."""
    from miles_async_core.config import AsyncConfig

    return AsyncConfig(
        rollout_batch_size=cfg.rollout_batch_size,
        n_samples_per_prompt=cfg.n_samples_per_prompt,
        fully_async=cfg.fully_async,
        pause_generation_mode=cfg.pause_mode,
        num_rollout=cfg.steps,
        max_weight_staleness=cfg.max_weight_staleness,
        seed=cfg.seed,
        async_unused_samples_handler=cfg.unused_samples_handler,
        over_sampling_batch_size=cfg.over_sampling_batch_size,
        async_max_concurrent_samples=cfg.max_concurrent_samples,
    )


class _RecordedRun(upstream_e2e._Run):
    """The served run with the recorder's flags on upstream's ``args``: upstream's own
    ``RolloutManager`` builds the data source and rollout function from them and calls the
    log and conversion functions they name, as on a cluster."""

    record_dir: Path
    extra_flags: dict[str, object] = {}
    install_recorder = True  # False: only extra_flags (a command line's) name the recorder's wrappers

    def configure_args(self, args: Any) -> None:
        flags = recorder_flags(fully_async=bool(args.fully_async)) if self.install_recorder else {}
        vars(args).update(flags, **self.extra_flags)

    def _check(self) -> None:
        offset = time.time() - time.monotonic()
        for n, s in enumerate(self.served):
            write_foreign_trace(self.record_dir, f"server-{n}", list(s.trace.events), mono_to_wall=offset)
        super()._check()


@dataclass
class RecordedResult:
    e2e: upstream_e2e.E2EResult
    record_dir: Path
    merged: Merged
    verdict: Verdict


def run_recorded(
    cfg: upstream_e2e.E2EConfig,
    record_dir: str | Path,
    *,
    miles_src: str | None = None,
    extra_flags: Mapping[str, object] | None = None,
    inner: dict[str, str] | None = None,
    install_recorder: bool = True,
    run_class: type | None = None,
    incomplete: bool = False,
) -> RecordedResult:
    """One recorded run; ``inner``: ``MILES_HARNESS_RECORD_INNER_<NAME>`` settings (the
    user's originals) for the run's duration; ``extra_flags``: more Miles ``args`` fields
    (e.g. ``async_data_buffer_capacity_factor``), set on the run and on the checkers' config.
    ``install_recorder=False``: the recorder's flags are not added, so only those in
    ``extra_flags`` are set (``main``: the flags of its command line). ``run_class``: a
    subclass of the recorded run (``harness.record.resume_run``: one life with
    checkpoints); ``incomplete``: merge process files whose last line was cut short (an
    earlier life killed mid-line in the same directory)."""
    import tempfile
    import shutil

    from harness.upstream import source

    from .merge import MERGED_NAME, merge_dir, verdict

    record_dir = Path(record_dir)
    record_dir.mkdir(parents=True, exist_ok=True)
    path, how = source.find_miles_src(miles_src)
    if path is None:
        raise source.UpstreamUnavailable(how)
    source.activate(path)
    env = {DIR_ENV: str(record_dir), **{f"MILES_HARNESS_RECORD_INNER_{k.upper()}": v for k, v in (inner or {}).items()}}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    workdir = Path(tempfile.mkdtemp(prefix="miles-harness-recorded-"))
    from .wrappers import reset_state

    reset_state()
    try:
        run = (run_class or _RecordedRun)(cfg, workdir)
        run.record_dir, run.extra_flags = record_dir, dict(extra_flags or {})
        run.install_recorder = install_recorder
        res = run.execute()
    finally:
        close_all()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(workdir, ignore_errors=True)
    config = async_config(cfg)
    overrides = {k: v for k, v in (extra_flags or {}).items() if k in config.to_dict()}
    if overrides:
        from miles_async_core.config import AsyncConfig

        config = AsyncConfig.from_dict({**config.to_dict(), **overrides})
    (record_dir / "merged.config.json").write_text(json.dumps({"config": config.to_dict(), "complete": True}))
    merged = merge_dir(record_dir, incomplete=incomplete)
    from harness.trace import write_jsonl

    write_jsonl(merged.events, record_dir / MERGED_NAME)
    return RecordedResult(e2e=res, record_dir=record_dir, merged=merged, verdict=verdict(merged, config, complete=True))


def _path_flags(rest: list[str]) -> dict[str, str]:
    """``--name-path VALUE`` pairs of a Miles command line as ``args`` fields
    (``name_path``); any other leftover argument is refused, naming it."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(rest):
        flag = rest[i]
        if not (flag.startswith("--") and flag.endswith("-path")) or i + 1 >= len(rest):
            raise ConfigError(
                f"python -m harness.record.served_run: argument {flag!r} is not understood. Allowed: "
                "the flags of --help and Miles' extension flags --<name>-path VALUE (the recorder's, "
                "docs/record.md). Fix: drop it or give the flag its value"
            )
        flags[flag[2:].replace("-", "_")] = rest[i + 1]
        i += 2
    return flags


def main(argv: list[str] | None = None) -> int:
    """A Miles command line that runs on the CPU: upstream's ``train_async.py`` loop (the
    served run of ``harness.serve.upstream_e2e``: the tiny model behind CPU servers, real
    HTTP) with the extension flags of its command line (``--<name>-path VALUE``) set on
    Miles' ``args``, recording into ``$MILES_HARNESS_RECORD_DIR``, as a GPU Miles command
    with the recorder's flags would. Exit 0 when every step trained."""

    p = argparse.ArgumentParser(prog="python -m harness.record.served_run", description=main.__doc__)
    p.add_argument("--num-rollout", type=int, default=2, help="training steps")
    p.add_argument("--rollout-batch-size", type=int, default=2)
    p.add_argument("--n-samples-per-prompt", type=int, default=2)
    p.add_argument("--rollout-max-response-len", type=int, default=8, help="max new tokens per sample")
    p.add_argument("--fully-async", action="store_true")
    p.add_argument("--servers", type=int, default=1, help="CPU servers behind the router")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--miles-src", default=None, help="the upstream Miles tree (default: $MILES_SRC)")
    ns, rest = p.parse_known_args(argv)
    try:
        flags = _path_flags(rest)
        record_dir = os.environ.get(DIR_ENV)
        if not record_dir:
            raise ConfigError(
                f"{DIR_ENV} is not set: the recorder writes nowhere. Allowed: a directory path. Fix: "
                f"{DIR_ENV}=DIR python -m harness.record.served_run ..."
            )
        cfg = upstream_e2e.E2EConfig(
            name="fully-async" if ns.fully_async else "one-step",
            fully_async=ns.fully_async,
            servers=ns.servers,
            steps=ns.num_rollout,
            rollout_batch_size=ns.rollout_batch_size,
            n_samples_per_prompt=ns.n_samples_per_prompt,
            max_new_tokens=ns.rollout_max_response_len,
            seed=ns.seed,
        )
        res = run_recorded(cfg, record_dir, miles_src=ns.miles_src, extra_flags=flags, install_recorder=False)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    e2e = res.e2e
    print(
        f"served Miles run ({cfg.name}): {e2e.steps_trained}/{cfg.steps} steps trained, error {e2e.error}; "
        f"recorded into {record_dir}"
    )
    return 0 if e2e.error is None and e2e.steps_trained == cfg.steps else 1


if __name__ == "__main__":
    sys.exit(main())
