"""Upstream Miles end to end on the CPU servers with the recorder installed by its flags.

``run_recorded(E2EConfig(...), record_dir)`` is ``harness.serve.upstream_e2e``'s run
(upstream's ``train_async.py`` loop, real HTTP through ``MilesRouter`` to the CPU
servers, the torch trainer) with two changes, both what a Miles user would do:

* the recorder's flags are set on ``args`` (``harness.record.recorder_flags``), and the
  data source and rollout function are built from them as upstream's rollout manager
  builds them (``load_function(args.data_source_path)(args)`` and
  ``load_rollout_function(..., args.rollout_function_path)``,
  ``ray/rollout/rollout_manager.py:L69-L79``);
* after each rollout, the rollout manager's two calls that read flags:
  ``log_rollout_data`` (``--custom-rollout-log-function-path``, ``rollout_manager.py:L156``)
  and ``convert_samples_to_train_data`` (``--custom-convert-samples-to-train-data-path``,
  ``L157``); training itself is the harness's ``TorchTrainer``, as in the served run.

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
from miles_async_core.errors import ConfigError

from . import recorder_flags
from .writer import DIR_ENV, close_all, write_foreign_trace

if TYPE_CHECKING:
    from miles_async_core.config import AsyncConfig

    from .merge import Merged, Verdict
    from .miles_shapes import Sample


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
    record_dir: Path
    extra_flags: dict[str, object] = {}
    install_recorder = True  # False: only extra_flags (a command line's) name the recorder's wrappers

    def driver(self) -> Any:
        from miles.rollout.base_types import RolloutFnConstructorInput
        from miles.rollout.inference_rollout.compatibility import load_rollout_function
        from miles.utils.misc import load_function

        args = getattr(self.rollout_fn, "args", None) or self.rollout_fn.state.args
        flags = recorder_flags(fully_async=bool(args.fully_async)) if self.install_recorder else {}
        vars(args).update(flags, **self.extra_flags)
        self.args = args
        data_source = load_function(args.data_source_path)(args)
        self.rollout_fn = load_rollout_function(
            RolloutFnConstructorInput(args=args, data_source=data_source), args.rollout_function_path
        )
        return self._driver_module()

    def _driver_module(self) -> Any:
        """Upstream's ``train_async.py`` as the served run loads it (``host.load_driver``: the
        tree's file, or the patched text a seeded driver bug put in ``host.DRIVER_SOURCES``),
        with its Ray names rebound to this run."""
        return super().driver()

    async def generate(self, rollout_id: int) -> dict[str, Any]:
        import asyncio

        from miles.ray.rollout.metrics import log_rollout_data
        from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data
        from miles.rollout.base_types import RolloutFnTrainInput
        from miles.rollout.inference_rollout.compatibility import call_rollout_function
        from miles.utils.misc import load_function

        t0 = time.time()
        version = self.manager_version
        out = await asyncio.to_thread(
            call_rollout_function, self.rollout_fn, RolloutFnTrainInput(rollout_id=rollout_id, weight_version=version)
        )
        args = self.args
        log_rollout_data(rollout_id, args, out.samples, out.metrics, time.time() - t0)
        flat = [s for g in out.samples for s in (g if isinstance(g, list) else [g])]
        convert_samples_to_train_data(
            args,
            flat,
            metadata={},
            custom_reward_post_process_func=None,
            custom_convert_samples_to_train_data_func=load_function(args.custom_convert_samples_to_train_data_path),
        )
        groups = [[upstream_e2e._core_sample(s) for s in g] for g in out.samples]
        for g in out.samples:
            for s in g:
                self.trained_rows.append(self._row(rollout_id, version, s))
        return {"groups": groups, "metrics": dict(out.metrics or {})}

    def _check(self) -> None:
        offset = time.time() - time.monotonic()
        for n, s in enumerate(self.served):
            write_foreign_trace(self.record_dir, f"server-{n}", list(s.trace.events), mono_to_wall=offset)
        super()._check()


def skip_default_logging(
    rollout_id: int, args: argparse.Namespace, samples: object, metrics: object, rollout_time: float
) -> bool:
    """A user's ``--custom-rollout-log-function-path`` that turns upstream's logging off."""
    return True


def copy_to_train_data(args: argparse.Namespace, samples: list[Sample]) -> dict[str, list[object]]:
    """A user's ``--custom-convert-samples-to-train-data-path``: tokens, response lengths,
    rollout log-probs and rewards, copied."""
    return {
        "tokens": [list(s.tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rollout_log_probs": [list(s.rollout_log_probs or []) for s in samples],
        "rewards": [s.reward for s in samples],
        "sample_indices": [s.index for s in samples],
    }


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
    # upstream's default rollout logging reads Miles' full argument set, which the served
    # run's args do not carry: the run keeps a user log function of its own, one that skips it
    # (and the same for the default conversion: the served run's conversion copies tokens,
    # log-probs and rewards, as harness.serve.upstream_e2e does)
    inner = {
        "log": "harness.record.served_run.skip_default_logging",
        "convert": "harness.record.served_run.copy_to_train_data",
        **(inner or {}),
    }
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
