"""``harness.sim.watchdog``: a virtual-time run that stops making progress ends in seconds
with ``WatchdogTripped`` (``hang`` or ``runaway``) and a report of the last events and
every pending task's stack; a healthy run never trips it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from miles_async_core.errors import ConfigError
from harness.sim.faults import FaultSchedule
from harness.sim.scenario import DEFAULT_SCENARIO, load_scenario, scenario_from_dict
from harness.sim.run_scenario import simulate
from harness.sim.vtime import run_virtual
from harness.sim.watchdog import Watchdog, WatchdogLimits, WatchdogTripped, install, resolve
from harness.trace import TraceRecorder

ROOT = Path(__file__).resolve().parents[2]
STALL = ROOT / "fixtures/scenarios/seeded_hang_engine_stall.toml"


def _limits(**kw) -> WatchdogLimits:
    return WatchdogLimits(
        **{"hang_after_s": 100.0, "max_events": 10_000, "max_events_per_step": 1 << 40, "max_tasks": 1_000, **kw}
    )


def test_a_retry_loop_on_a_timer_with_no_event_is_a_hang_with_the_waiting_stack():
    """Upstream's drain shape: wait 30 s, warn, wait again, forever."""

    async def drain(never: asyncio.Future) -> None:
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(never), timeout=30.0)
            except TimeoutError:
                continue

    async def main():
        loop = asyncio.get_running_loop()
        sink = TraceRecorder(loop.time)
        install(Watchdog(_limits(), progress=lambda: len(sink.events), events=lambda: sink.events))
        sink.emit("run_start")
        await loop.create_task(drain(loop.create_future()), name="the-drain")

    start = time.perf_counter()
    with pytest.raises(WatchdogTripped) as info:
        run_virtual(main())
    assert time.perf_counter() - start < 2.0
    err = info.value
    assert err.kind == "hang" and "hang_after_s = 100" in err.reason
    assert '"kind": "run_start"' in err.report
    assert (
        "the-drain (test_a_retry_loop_on_a_timer_with_no_event_is_a_hang_with_the_waiting_stack.<locals>.drain)"
        in err.report
    )
    assert "await asyncio.wait_for(asyncio.shield(never), timeout=30.0)" in err.report


def test_a_loop_that_emits_forever_is_a_runaway_by_its_event_budget():
    async def main():
        loop = asyncio.get_running_loop()
        sink = TraceRecorder(loop.time)
        install(Watchdog(_limits(max_events=5_000), progress=lambda: len(sink.events), events=lambda: sink.events))
        while True:  # an endless retry: every attempt is recorded, none succeeds
            sink.emit("recycled", group_index=0)
            await asyncio.sleep(0.5)

    with pytest.raises(WatchdogTripped) as info:
        run_virtual(main())
    assert info.value.kind == "runaway" and "max_events = 5000" in info.value.reason


def _retry_loop(train_every: int | None, limits: WatchdogLimits) -> None:
    async def main():
        loop = asyncio.get_running_loop()
        sink = TraceRecorder(loop.time)
        install(Watchdog(limits, progress=lambda: len(sink.events), events=lambda: sink.events))
        for attempt in range(20_000):
            sink.emit("recycled", group_index=0)
            if train_every and attempt % train_every == train_every - 1:
                sink.emit("trained", rollout_id=attempt)
            await asyncio.sleep(0.5)

    run_virtual(main())


def test_work_that_never_reaches_the_trainer_is_a_runaway_by_the_per_step_budget():
    with pytest.raises(WatchdogTripped) as info:
        _retry_loop(None, _limits(max_events=1 << 40, max_events_per_step=2_000))
    assert info.value.kind == "runaway" and "since the last training step" in info.value.reason
    assert "max_events_per_step = 2000" in info.value.reason


def test_the_same_work_with_training_steps_between_passes_the_per_step_budget():
    _retry_loop(1_000, _limits(max_events=1 << 40, max_events_per_step=2_000))


def test_spawning_tasks_without_end_is_a_runaway_by_the_task_budget():
    async def main():
        loop = asyncio.get_running_loop()
        sink = TraceRecorder(loop.time)
        install(Watchdog(_limits(max_tasks=500), progress=lambda: len(sink.events), events=lambda: sink.events))
        never = loop.create_future()

        async def attempt():
            await never

        while True:
            loop.create_task(attempt())
            sink.emit("submitted")
            await asyncio.sleep(0)

    with pytest.raises(WatchdogTripped) as info:
        run_virtual(main())
    assert info.value.kind == "runaway" and "max_tasks = 500" in info.value.reason


def test_memory_growth_is_a_runaway_by_the_memory_budget():
    async def main():
        loop = asyncio.get_running_loop()
        sink = TraceRecorder(loop.time)
        install(
            Watchdog(_limits(max_rss_growth_mb=64.0), progress=lambda: len(sink.events), events=lambda: sink.events)
        )
        hoard = []
        while True:
            hoard.append(bytearray(32 << 10))  # zero-filled, so resident
            sink.emit("retry")
            await asyncio.sleep(0)

    with pytest.raises(WatchdogTripped) as info:
        run_virtual(main())
    assert info.value.kind == "runaway" and "max_rss_growth_mb = 64" in info.value.reason


def test_a_livelock_at_one_instant_with_no_event_is_a_hang(monkeypatch):
    from harness.sim import watchdog

    monkeypatch.setattr(watchdog, "MAX_QUIET_ITERATIONS", 50_000)

    async def main():
        loop = asyncio.get_running_loop()
        sink = TraceRecorder(loop.time)
        install(Watchdog(_limits(), progress=lambda: len(sink.events), events=lambda: sink.events))
        while True:
            await asyncio.sleep(0)

    with pytest.raises(WatchdogTripped) as info:
        run_virtual(main())
    assert info.value.kind == "hang" and "no clock movement" in info.value.reason


def test_the_seeded_engine_stall_scenario_hangs_and_simulate_reports_it():
    start = time.perf_counter()
    result = simulate(load_scenario(STALL))
    assert time.perf_counter() - start < 2.0
    assert isinstance(result.error, WatchdogTripped) and result.error.kind == "hang"
    assert any(e.kind == "fault" and e["what"] == "engine_stall" for e in result.events)
    assert "FullyAsyncRolloutFn._worker_loop" in result.error.report and "in _next_group" in result.error.report


def test_without_the_stall_the_same_scenario_runs_to_its_end():
    sc = load_scenario(STALL)
    result = simulate(dataclasses.replace(sc, faults=None))
    assert result.error is None and len(result.history) == sc.config.num_rollout


def test_the_scenario_states_its_bounds_and_the_defaults_follow_its_scale():
    sc = scenario_from_dict({"watchdog": {"hang_after_s": 50, "max_events": 1234, "max_events_per_step": 99}}, "s.toml")
    r = resolve(sc.watchdog, sc)
    assert (r.hang_after_s, r.max_events, r.max_events_per_step) == (50.0, 1234, 99)
    slow = dataclasses.replace(
        DEFAULT_SCENARIO, trainer=dataclasses.replace(DEFAULT_SCENARIO.trainer, step_base_s=600.0)
    )
    assert resolve(WatchdogLimits(), slow).hang_after_s > resolve(WatchdogLimits(), DEFAULT_SCENARIO).hang_after_s
    with pytest.raises(ConfigError, match="watchdog.*hang_after_s = -1"):
        scenario_from_dict({"watchdog": {"hang_after_s": -1}}, "s.toml")
    with pytest.raises(ConfigError, match="unknown field watchdog.hang_s"):
        scenario_from_dict({"watchdog": {"hang_s": 1}}, "s.toml")
    with pytest.raises(ConfigError, match="faults.cancel_at_s"):
        scenario_from_dict({"faults": {"cancel_at_s": 3.0}}, "s.toml")
    assert scenario_from_dict(
        {"faults": {"engine_stall_after_requests": 3}, "config": {"fully_async": True}}, "s.toml"
    ).faults == FaultSchedule(engine_stall_after_requests=3)


def test_a_healthy_run_with_a_tight_bound_still_passes():
    """The derived bound is far above the longest quiet stretch: a bound just above it passes too."""
    from harness.sim.watchdog import quiet_stretch_s

    sc = load_scenario(ROOT / "fixtures/scenarios/golden_fully_async.toml")
    tight = dataclasses.replace(sc, watchdog=WatchdogLimits(hang_after_s=quiet_stretch_s(sc)))
    assert simulate(tight).error is None


def test_the_simulate_command_exits_1_and_prints_the_hang_report(tmp_path, capsys):
    from harness.cli import main as cli

    code = cli(["simulate", "--scenario", str(STALL), "--trace", str(tmp_path / "trace.jsonl")])
    out = capsys.readouterr().out
    assert code == 1
    assert "run failed" in out and "WatchdogTripped('hang:" in out
    assert "watchdog: hang:" in out and "pending tasks:" in out and "in _worker_loop" in out
    assert (tmp_path / "trace.jsonl").read_text().count("\n") > 0  # the trace up to the hang is kept
