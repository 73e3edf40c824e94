"""``harness.measure.self_cost``: the recording's own time, counted call by call."""

from __future__ import annotations

import os
import sys

import pytest

from harness.measure.ages import AgeRecorder
from harness.measure.self_cost import SelfCost, process_cpu_s
from harness.trace import TraceRecorder


class _Ctx:
    weight_version, trainer_steps = 3, 2


def test_the_timed_sink_forwards_every_event_and_counts_each_call():
    cost = SelfCost()
    recorder = TraceRecorder(lambda: 1.5)
    sink = cost.sink(recorder)
    assert sink.enabled
    sink.emit("submitted", index=0, group_index=0, version=1)
    sink.emit("finished", index=0, status="completed")
    assert [(e.kind, e.t, e.fields) for e in recorder.events] == [
        ("submitted", 1.5, {"index": 0, "group_index": 0, "version": 1}),
        ("finished", 1.5, {"index": 0, "status": "completed"}),
    ]
    assert cost.calls == 2 and cost.in_run_s > 0.0


def test_the_timed_observer_returns_what_the_observer_returns_and_counts_a_failing_call():
    cost = SelfCost()
    obs = cost.observer(AgeRecorder())
    obs.on_weights_updated(_Ctx(), 3)
    assert obs.on_train_batch(_Ctx(), 0, []) == {
        "age_versions": [],
        "token_age_versions": [],
        "lag_steps": [],
        "tokens": 0,
    }
    failing = cost.sink(TraceRecorder(lambda: 0.0, strict=True))
    with pytest.raises(ValueError, match="unknown event kind"):
        failing.emit("no_such_kind")
    assert cost.calls == 3


def test_the_summary_is_the_share_of_the_timed_run():
    cost = SelfCost()
    cost.in_run_s, cost.calls = 0.05, 10
    assert cost.summary(10.0) == {"in_run_s": 0.05, "calls": 10, "share_of_run": pytest.approx(0.005)}
    assert cost.summary(0.0)["share_of_run"] is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/stat, a Linux file")
def test_process_cpu_reads_another_process_from_proc_and_agrees_with_process_time_on_this_one():
    sum(i * i for i in range(300_000))  # some CPU to read
    mine, via_proc = process_cpu_s(), process_cpu_s(os.getpid())
    assert via_proc is not None and abs(mine - via_proc) < 0.1  # /proc counts in clock ticks (10 ms)
    assert process_cpu_s(2**22 + 12345) is None  # above Linux's pid_max: no such process
