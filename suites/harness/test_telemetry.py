"""TelemetrySampler against a fake NVML (same function names as pynvml), and the
real pynvml's no-GPU path. No test sleeps: sampling is driven by ``sample_once`` and
the one threaded test waits on events the fake sets."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import pytest

from harness.checking.requirements import require_or_skip
from harness.measure.telemetry import TelemetrySampler, nvml_status
from miles_async_core.errors import ConfigError


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


class FakeMetricsGet:
    """Stand-in for pynvml.c_nvmlGpmMetricsGet_t (attribute-compatible)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1 = None
        self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(4)]


class FakeNVML:
    """Deterministic NVML: device i reads util 10*(i+1) + tick, memory (i+1) GiB,
    power 100 W + tick, SM clock 1500 + i MHz. GPM on the devices in ``gpm_devices``:
    SM activity = 50 + ticks between the two samples."""

    NVML_SUCCESS = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVMLError = FakeNVMLError
    NVMLError_NotSupported = FakeNotSupported
    c_nvmlGpmMetricsGet_t = FakeMetricsGet

    def __init__(self, n_devices=2, *, gpm_devices=(0,), fail_util_on_ticks=(), init_error=None, no_power=False):
        self.n_devices = n_devices
        self.gpm_devices = set(gpm_devices)
        self.fail_util_on_ticks = set(fail_util_on_ticks)
        self.init_error = init_error
        self.no_power = no_power
        self.tick = 0  # advanced by the test between samples
        self.inited = False
        self.shutdowns = 0
        self.freed = 0
        self.util_calls = 0
        self.util_called = threading.Event()

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error
        self.inited = True

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.n_devices

    def nvmlDeviceGetHandleByIndex(self, i):
        return SimpleNamespace(index=i)

    def nvmlDeviceGetUtilizationRates(self, h):
        self.util_calls += 1
        self.util_called.set()
        if self.tick in self.fail_util_on_ticks:
            raise FakeNVMLError("GPU is lost")
        return SimpleNamespace(gpu=10 * (h.index + 1) + self.tick, memory=5 + h.index)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(h.index + 1) * 2**30, total=80 * 2**30, free=0)

    def nvmlDeviceGetPowerUsage(self, h):
        if self.no_power:
            raise FakeNotSupported("Not Supported")
        return (100 + self.tick) * 1000  # milliwatts

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1500 + h.index if kind == self.NVML_CLOCK_SM else 2600

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(isSupportedDevice=int(h.index in self.gpm_devices))

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(tick=None)

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmSampleGet(self, h, sample):
        sample.tick = self.tick
        return sample

    def nvmlGpmMetricsGet(self, query):
        assert query.numMetrics == 2 and query.version == self.NVML_GPM_METRICS_GET_VERSION
        elapsed = query.sample2.tick - query.sample1.tick
        for m in query.metrics[: query.numMetrics]:
            m.nvmlReturn = self.NVML_SUCCESS
            m.value = 50.0 + elapsed if m.metricId == self.NVML_GPM_METRIC_SM_UTIL else 25.0
        return query


class ListSink:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def emit(self, kind, /, **fields):
        self.events.append((kind, fields))


class Phase:
    def __init__(self, value="generating") -> None:
        self.value = value

    def __call__(self):
        return self.value


def make(fake, **kwargs):
    messages: list[str] = []
    clock_ticks = iter(range(1000))
    sampler = TelemetrySampler(
        interval_s=0.05, nvml=fake, clock=lambda: float(next(clock_ticks)), log=messages.append, **kwargs
    )
    return sampler, messages


def test_two_gpus_give_one_record_each_with_the_phase_of_the_moment():
    fake, phase, sink = FakeNVML(2), Phase("generating"), ListSink()
    sampler, messages = make(fake, phase_fn=phase, sink=sink)
    assert sampler.available and sampler.num_gpus == 2
    first = sampler.sample_once()
    fake.tick, phase.value = 3, "training"
    second = sampler.sample_once()
    assert [(r["gpu"], r["phase"]) for r in first + second] == [
        (0, "generating"),
        (1, "generating"),
        (0, "training"),
        (1, "training"),
    ]
    r = second[1]
    assert r == {
        "t_s": 1.0,
        "gpu": 1,
        "util_gpu_pct": 23.0,
        "util_mem_pct": 6.0,
        "sm_active_pct": None,
        "sm_occupancy_pct": None,
        "mem_used_bytes": 2 * 2**30,
        "power_w": 103.0,
        "clock_sm_mhz": 1501.0,
        "clock_mem_mhz": 2600.0,
        "phase": "training",
    }
    assert [kind for kind, _ in sink.events] == ["telemetry"] * 4
    assert sink.events[3][1] == r
    assert sampler.records == first + second
    assert messages == [] and sampler.errors == 0


def test_gpm_sm_activity_needs_two_samples_and_only_on_supported_devices():
    fake = FakeNVML(2, gpm_devices=(0,))
    sampler, _ = make(fake)
    first = sampler.sample_once()
    fake.tick = 4
    second = sampler.sample_once()
    fake.tick = 5
    third = sampler.sample_once()
    assert first[0]["sm_active_pct"] is None  # no previous GPM sample yet
    assert second[0]["sm_active_pct"] == 54.0 and second[0]["sm_occupancy_pct"] == 25.0
    assert third[0]["sm_active_pct"] == 51.0  # interval since the previous sample only
    assert all(r["sm_active_pct"] is None for r in first + second + third if r["gpu"] == 1)


def test_unsupported_fields_are_none_not_errors():
    sampler, messages = make(FakeNVML(1, no_power=True))
    (record,) = sampler.sample_once()
    assert record["power_w"] is None and record["util_gpu_pct"] == 10.0
    assert sampler.errors == 0 and messages == []


def test_errors_mid_run_are_counted_logged_once_and_never_escape():
    fake = FakeNVML(2, fail_util_on_ticks={2, 3})
    sampler, messages = make(fake, phase_fn=Phase(), max_consecutive_errors=5)
    completed_steps = 0
    for step in range(6):  # the "run": work, then a telemetry sample
        fake.tick = step
        completed_steps += 1
        sampler.sample_once()
    assert completed_steps == 6
    assert sampler.errors == 2 and not sampler.switched_off
    assert len(messages) == 1 and "GPU is lost" in messages[0]
    assert sorted({r["util_gpu_pct"] - 10 * (r["gpu"] + 1) for r in sampler.records}) == [0, 1, 4, 5]
    assert sampler.summary()["errors"] == 2


def test_sampler_switches_itself_off_after_consecutive_errors():
    fake = FakeNVML(1, fail_util_on_ticks=set(range(100)))
    sampler, messages = make(fake, max_consecutive_errors=3)
    for step in range(10):
        fake.tick = step
        assert sampler.sample_once() == []
    assert sampler.switched_off and sampler.errors == 3  # no sampling once off
    assert fake.util_calls == 3
    assert len(messages) == 2 and "switched off after 3 consecutive errors" in messages[1]
    sampler.start()  # a no-op once off
    assert sampler._thread is None


def test_failing_phase_fn_and_sink_are_caught():
    def broken_phase():
        raise RuntimeError("phase source gone")

    class BrokenSink:
        def emit(self, kind, /, **fields):
            raise OSError("disk full")

    sampler, messages = make(FakeNVML(1), phase_fn=broken_phase)
    assert sampler.sample_once() == [] and sampler.errors == 1
    sampler2, _ = make(FakeNVML(1), sink=BrokenSink())
    assert sampler2.sample_once() == [] and sampler2.errors == 1
    assert len(sampler2.records) == 1  # stored before the sink failed
    assert "phase source gone" in messages[0]


def test_gpm_failure_turns_gpm_off_for_that_gpu_and_keeps_sampling():
    fake = FakeNVML(1, gpm_devices=(0,))
    sampler, messages = make(fake)
    sampler.sample_once()

    def broken(query):
        raise FakeNVMLError("GPM stream lost")

    fake.nvmlGpmMetricsGet = broken
    (record,) = sampler.sample_once()
    assert record["sm_active_pct"] is None and record["util_gpu_pct"] == 10.0
    assert sampler.errors == 1 and fake.freed == 2 and "GPM on GPU 0" in messages[0]
    (again,) = sampler.sample_once()
    assert again["sm_active_pct"] is None and sampler.errors == 1


def test_summary_gives_per_phase_means():
    fake, phase = FakeNVML(2), Phase("generating")
    sampler, _ = make(fake, phase_fn=phase)
    sampler.sample_once()  # util 10, 20
    fake.tick, phase.value = 2, "training"
    sampler.sample_once()  # util 12, 22
    fake.tick, phase.value = 4, None
    sampler.sample_once()  # util 14, 24
    s = sampler.summary()
    assert s["available"] and s["gpus"] == 2 and s["samples"] == 6
    assert set(s["phases"]) == {"generating", "training", "unknown"}
    assert s["phases"]["generating"]["util_gpu_pct_mean"] == 15.0
    assert s["phases"]["training"]["util_gpu_pct_mean"] == 17.0
    assert s["phases"]["training"]["power_w_mean"] == 102.0
    assert s["overall"]["util_gpu_pct_mean"] == 17.0
    assert s["overall"]["mem_used_bytes_max"] == 2 * 2**30
    assert s["phases"]["training"]["sm_active_pct_mean"] == 52.0  # GPU 0 only; GPU 1 has no GPM


def test_thread_samples_until_stopped_and_releases_nvml():
    fake = FakeNVML(2)
    sampler, _ = make(fake, phase_fn=Phase("training"))
    with sampler:
        assert fake.util_called.wait(timeout=10), "the sampling thread never sampled"
    assert sampler._thread is None
    assert len(sampler.records) >= 2 and sampler.records[0]["phase"] == "training"
    assert fake.shutdowns == 1 and fake.freed == 2  # GPM buffers of GPU 0 freed
    count = len(sampler.records)
    assert sampler.sample_once() == [] and len(sampler.records) == count
    sampler.stop()  # idempotent
    assert fake.shutdowns == 1


@pytest.mark.parametrize(
    ("fake", "reason"),
    [
        (FakeNVML(init_error=FakeNVMLError("Driver Not Loaded")), "NVML init failed (Driver Not Loaded)"),
        (FakeNVML(0), "NVML reports zero GPUs"),
    ],
)
def test_unavailable_nvml_says_so_once_and_everything_is_a_no_op(fake, reason):
    sampler, messages = make(fake)
    assert not sampler.available and not sampler.available
    sampler.start()
    assert sampler.sample_once() == []
    sampler.stop()
    assert messages == [f"no telemetry: {reason}"]
    assert sampler.summary()["available"] is False and sampler.summary()["reason"] == reason


def test_nvml_status_probes_quietly_and_releases_nvml():
    fake = FakeNVML(2)
    assert nvml_status(fake) == (True, None)
    assert fake.shutdowns == 1
    assert nvml_status(FakeNVML(init_error=FakeNVMLError("Driver Not Loaded"))) == (
        False,
        "NVML init failed (Driver Not Loaded)",
    )
    assert nvml_status(FakeNVML(0)) == (False, "NVML reports zero GPUs")


def test_missing_pynvml_is_reported_once(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    sampler = TelemetrySampler()
    with sampler:
        assert sampler.sample_once() == []
    assert not sampler.available
    err = capsys.readouterr().err
    assert err.count("no telemetry:") == 1 and "pynvml is not importable" in err


def test_real_pynvml_without_a_gpu_reports_no_telemetry_once(capsys):
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is a declared dependency but not installed here")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML initialised on this machine; the no-GPU path needs a machine without NVML")
    sampler = TelemetrySampler(interval_s=0.01)
    sampler.start()
    for _ in range(3):
        sampler.sample_once()
    sampler.stop()
    assert sampler.available is False and sampler.records == []
    err = capsys.readouterr().err
    assert err.count("no telemetry:") == 1 and "NVML init failed" in err


@pytest.mark.gpu
def test_real_nvml_on_a_gpu_machine_reads_plausible_values():
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is a declared dependency but not installed here")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        require_or_skip(f"needs a GPU with NVML ({exc})")
    pynvml.nvmlShutdown()
    sampler = TelemetrySampler(phase_fn=lambda: "idle", log=lambda m: None)
    n_gpus = sampler.num_gpus
    first, second = sampler.sample_once(), sampler.sample_once()
    sampler.stop()
    assert n_gpus >= 1 and len(first) == len(second) == n_gpus
    for r in first + second:
        assert 0 <= r["util_gpu_pct"] <= 100 and r["mem_used_bytes"] > 0 and r["phase"] == "idle"
        assert r["clock_sm_mhz"] > 0 and (r["power_w"] is None or r["power_w"] > 0)
    assert sampler.errors == 0, sampler.last_error


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"interval_s": 0}, "interval_s"), ({"max_consecutive_errors": 0}, "max_consecutive_errors")]
)
def test_bad_settings_are_config_errors(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        TelemetrySampler(nvml=FakeNVML(1), **kwargs)
