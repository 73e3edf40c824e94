"""Per-GPU telemetry sampled on a daemon thread through NVML, tagged with the run phase.

Contract: ``TelemetrySampler`` observes and never interferes. Without NVML (pynvml
not importable, ``nvmlInit`` failing, zero devices) it says ``no telemetry: <reason>``
exactly once, ``available`` is False and every method is a no-op. Any exception while
sampling (NVML, ``phase_fn``, the sink) is caught: the first one is logged, every one
is counted in ``errors``, and after ``max_consecutive_errors`` failures in a row the
sampler switches itself off. Nothing it does propagates into the run it watches
(trio's rule for instruments).

Each sample yields one record per GPU::

    {t_s, gpu, util_gpu_pct, util_mem_pct, sm_active_pct, sm_occupancy_pct,
     mem_used_bytes, power_w, clock_sm_mhz, clock_mem_mhz, phase}

``t_s`` is the injected ``clock()`` at the sample, ``phase`` whatever ``phase_fn()``
returned then. ``sm_active_pct`` / ``sm_occupancy_pct`` come from GPM
(``NVML_GPM_METRIC_SM_UTIL`` / ``SM_OCCUPANCY``, Hopper and later) over the interval
since the previous sample of that GPU; they are None on the first sample, on devices
without GPM support, and after a GPM failure. Fields a device does not support
(``NVMLError_NotSupported``) are None. Records go to ``records`` and, when given, to
``sink.emit("telemetry", **record)``.

Tests drive ``sample_once()`` directly; the thread only loops ``sample_once`` and a
wait on a ``threading.Event`` of ``interval_s``, so ``stop()`` returns at once.
"""

from __future__ import annotations

import importlib
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miles_async_core.errors import ConfigError

TELEMETRY_EVENT = "telemetry"
RECORD_FIELDS = (
    "t_s",
    "gpu",
    "util_gpu_pct",
    "util_mem_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "mem_used_bytes",
    "power_w",
    "clock_sm_mhz",
    "clock_mem_mhz",
    "phase",
)
MEAN_FIELDS = (
    "util_gpu_pct",
    "util_mem_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "power_w",
    "clock_sm_mhz",
    "clock_mem_mhz",
)
UNKNOWN_PHASE = "unknown"


def _print_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class _GpmState:
    """Two GPM sample buffers per device; metrics need a (previous, current) pair."""

    prev: Any
    cur: Any
    has_prev: bool = False


class TelemetrySampler:
    def __init__(
        self,
        interval_s: float = 0.1,
        phase_fn: Callable[[], Any] | None = None,
        nvml: Any = None,
        sink: Any = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_consecutive_errors: int = 5,
        log: Callable[[str], None] = _print_stderr,
    ) -> None:
        if not (isinstance(interval_s, (int, float)) and math.isfinite(interval_s) and interval_s > 0):
            raise ConfigError(f"interval_s={interval_s!r}; it must be a finite number of seconds > 0, e.g. 0.1.")
        if not (isinstance(max_consecutive_errors, int) and max_consecutive_errors >= 1):
            raise ConfigError(f"max_consecutive_errors={max_consecutive_errors!r}; it must be an integer >= 1, e.g. 5.")
        self.interval_s = float(interval_s)
        self.max_consecutive_errors = max_consecutive_errors
        self._phase_fn = phase_fn
        self._nvml_injected = nvml
        self._sink = sink
        self._clock = clock
        self._log = log
        self.records: list[dict[str, Any]] = []
        self.errors = 0
        self.last_error: BaseException | None = None
        self.reason: str | None = None  # why telemetry is unavailable or switched off
        self.switched_off = False
        self._consecutive_errors = 0
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._gpm: list[_GpmState | None] = []
        self._initialised = False
        self._available = False
        self._closed = False
        self._lock = threading.Lock()  # one sample at a time; guards records
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    # --- setup -------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """True when NVML initialised and found at least one GPU (initialises lazily)."""
        self._ensure_init()
        return self._available

    @property
    def num_gpus(self) -> int:
        return len(self._handles) if self.available else 0

    def _unavailable(self, reason: str) -> None:
        self.reason = reason
        self._log(f"no telemetry: {reason}")

    def _ensure_init(self) -> None:
        if self._initialised:
            return
        self._initialised = True
        try:
            nvml = self._nvml_injected if self._nvml_injected is not None else importlib.import_module("pynvml")
        except ImportError as exc:
            return self._unavailable(f"pynvml is not importable ({exc})")
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return self._unavailable(f"NVML init failed ({exc})")
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            self._shutdown(nvml)
            return self._unavailable(f"NVML device query failed ({exc})")
        if count == 0:
            self._shutdown(nvml)
            return self._unavailable("NVML reports zero GPUs")
        self._nvml = nvml
        self._handles = handles
        self._gpm = [self._gpm_setup(h) for h in handles]
        self._available = True

    def _gpm_setup(self, handle: Any) -> _GpmState | None:
        """GPM buffers for a device that supports GPM, else None (no SM activity)."""
        nvml = self._nvml
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return None
            return _GpmState(prev=nvml.nvmlGpmSampleAlloc(), cur=nvml.nvmlGpmSampleAlloc())
        except Exception:  # no GPM in this driver or pynvml: a capability, not an error
            return None

    @staticmethod
    def _shutdown(nvml: Any) -> None:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass

    # --- sampling ----------------------------------------------------------------------

    def sample_once(self) -> list[dict[str, Any]]:
        """Take one sample of every GPU; return its records ([] when off). Never raises."""
        if self._closed or self.switched_off or not self.available:
            return []
        with self._lock:
            try:
                records = self._read_all()
                self.records.extend(records)
                if self._sink is not None and getattr(self._sink, "enabled", True):
                    for record in records:
                        self._sink.emit(TELEMETRY_EVENT, **record)
            except Exception as exc:  # an observer must not crash the run it observes
                self._note_error(exc)
                return []
            self._consecutive_errors = 0
            return records

    def _read_all(self) -> list[dict[str, Any]]:
        t_s = float(self._clock())
        phase = self._phase_fn() if self._phase_fn is not None else None
        return [self._read_device(i, h, t_s, phase) for i, h in enumerate(self._handles)]

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None where the device does not support the query."""
        not_supported = getattr(self._nvml, "NVMLError_NotSupported", None)
        try:
            return fn(*args)
        except Exception as exc:
            if not_supported is not None and isinstance(exc, not_supported):
                return None
            raise

    def _read_device(self, i: int, handle: Any, t_s: float, phase: Any) -> dict[str, Any]:
        nvml = self._nvml
        util = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        mem = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        clock_sm = self._optional(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        clock_mem = self._optional(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM)
        sm_active, sm_occupancy = self._read_gpm(i, handle)
        return {
            "t_s": t_s,
            "gpu": i,
            "util_gpu_pct": float(util.gpu) if util is not None else None,
            "util_mem_pct": float(util.memory) if util is not None else None,
            "sm_active_pct": sm_active,
            "sm_occupancy_pct": sm_occupancy,
            "mem_used_bytes": int(mem.used) if mem is not None else None,
            "power_w": power_mw / 1000.0 if power_mw is not None else None,  # NVML reports milliwatts
            "clock_sm_mhz": float(clock_sm) if clock_sm is not None else None,
            "clock_mem_mhz": float(clock_mem) if clock_mem is not None else None,
            "phase": phase,
        }

    def _read_gpm(self, i: int, handle: Any) -> tuple[float | None, float | None]:
        """SM activity and occupancy over the interval since this GPU's last sample.
        A GPM failure turns GPM off for that GPU (counted as an error) but keeps the
        other fields flowing."""
        state = self._gpm[i]
        if state is None:
            return None, None
        nvml = self._nvml
        try:
            nvml.nvmlGpmSampleGet(handle, state.cur)
            if not state.has_prev:
                state.prev, state.cur, state.has_prev = state.cur, state.prev, True
                return None, None
            query = nvml.c_nvmlGpmMetricsGet_t()
            query.version = nvml.NVML_GPM_METRICS_GET_VERSION
            query.numMetrics = 2
            query.sample1 = state.prev
            query.sample2 = state.cur
            query.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
            query.metrics[1].metricId = nvml.NVML_GPM_METRIC_SM_OCCUPANCY
            nvml.nvmlGpmMetricsGet(query)
            state.prev, state.cur = state.cur, state.prev
            ok = getattr(nvml, "NVML_SUCCESS", 0)
            values = [float(m.value) if m.nvmlReturn == ok else None for m in (query.metrics[0], query.metrics[1])]
            return values[0], values[1]
        except Exception as exc:
            self._gpm[i] = None
            self._free_gpm(state)
            self._note_error(exc, what=f"GPM on GPU {i} (SM activity off for it)")
            return None, None

    def _note_error(self, exc: BaseException, *, what: str = "sample") -> None:
        self.errors += 1
        self._consecutive_errors += 1
        self.last_error = exc
        if self.errors == 1:
            self._log(f"telemetry error in {what}: {exc!r} (the run goes on; later errors are only counted)")
        if self._consecutive_errors >= self.max_consecutive_errors and not self.switched_off:
            self.switched_off = True
            self.reason = f"switched off after {self._consecutive_errors} consecutive errors (last: {exc!r})"
            self._log(f"telemetry {self.reason}")

    # --- thread ------------------------------------------------------------------------

    def start(self) -> TelemetrySampler:
        """Start the sampling thread (no-op when unavailable, off, closed or running)."""
        if self._closed or self.switched_off or not self.available:
            return self
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._loop, name="telemetry-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop_event.is_set() and not self.switched_off:
            self.sample_once()
            self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        """Stop the thread, then release NVML. Safe to call more than once."""
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 5 * self.interval_s))
            self._thread = None
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._available:
                return
            for state in self._gpm:
                if state is not None:
                    self._free_gpm(state)
            self._gpm = []
            self._shutdown(self._nvml)

    def _free_gpm(self, state: _GpmState) -> None:
        for sample in (state.prev, state.cur):
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except Exception:
                pass

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # --- results -----------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per-phase means over all GPUs and samples (None where no value was read),
        peak memory, and the sampler's own health (available, errors, switched_off)."""
        with self._lock:
            records = list(self.records)
        phases: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            phases.setdefault(UNKNOWN_PHASE if r["phase"] is None else str(r["phase"]), []).append(r)
        return {
            "available": self._available,
            "reason": self.reason,
            "errors": self.errors,
            "switched_off": self.switched_off,
            "gpus": len(self._handles),
            "samples": len(records),
            "overall": _aggregate(records),
            "phases": {name: _aggregate(rs) for name, rs in sorted(phases.items())},
        }


def nvml_status(nvml: Any = None) -> tuple[bool, str | None]:
    """``(True, None)`` when NVML initialises here and sees at least one GPU, else
    ``(False, reason)`` with the reason a sampler would log. Probes quietly and releases
    NVML. ``nvml`` replaces ``pynvml`` (tests)."""
    sampler = TelemetrySampler(nvml=nvml, log=lambda message: None)
    try:
        return sampler.available, sampler.reason
    finally:
        sampler.close()


def _aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"records": len(records)}
    for name in MEAN_FIELDS:
        values = [r[name] for r in records if r[name] is not None]
        out[f"{name}_mean"] = sum(values) / len(values) if values else None
    used = [r["mem_used_bytes"] for r in records if r["mem_used_bytes"] is not None]
    out["mem_used_bytes_max"] = max(used) if used else None
    return out
