"""The share of the machine a real-time run had, and the busy-host verdict
(``harness.measure.host_load``): the figures and the thresholds on injected numbers, the
results file's ``host`` record and what ``compare`` says of it, and one real measurement
under a load the test generates (slow tier)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.cli import main as cli
from harness.measure import host_load
from harness.measure.host_load import LOAD_PER_CORE_MAX, OTHERS_SHARE_MAX, Reading, figures, verdict
from harness.results.schema import Results, load_results


def _window(*, own_cpu_s: float, host_busy_s: float | None, wall: float = 10.0, cores: float = 2.0, load=(0.5, 1.5)):
    before = Reading(t=100.0, tree_cpu_s=50.0, host_busy_s=None if host_busy_s is None else 1000.0, load1=load[0])
    after = Reading(
        t=100.0 + wall,
        tree_cpu_s=50.0 + own_cpu_s,
        host_busy_s=None if host_busy_s is None else 1000.0 + host_busy_s,
        load1=load[1],
    )
    return figures(before, after, cores)


def test_the_figures_are_the_trees_cores_its_share_and_the_cores_others_kept_busy():
    f = _window(own_cpu_s=15.0, host_busy_s=19.0)
    assert f["own_cores"] == pytest.approx(1.5)
    assert f["share"] == pytest.approx(0.75)
    assert f["others_cores"] == pytest.approx(0.4)
    assert (f["load1_before"], f["load1_after"]) == (0.5, 1.5)


def test_others_just_above_the_threshold_make_the_run_not_comparable_and_say_why():
    limit = OTHERS_SHARE_MAX * 2 * 10.0  # CPU seconds others may take on 2 cores over 10 s
    f = _window(own_cpu_s=10.0, host_busy_s=10.0 + limit + 0.1)
    assert f["busy"] is True
    assert f"of the 2 cores busy (more than {OTHERS_SHARE_MAX:g} of them)" in f["why"]
    assert "the run had 1.00 cores (50 % of the host)" in f["why"]


def test_others_just_below_the_threshold_leave_the_run_comparable():
    limit = OTHERS_SHARE_MAX * 2 * 10.0
    f = _window(own_cpu_s=10.0, host_busy_s=10.0 + limit - 0.1)
    assert (f["busy"], f["why"]) == (False, None)


def test_a_high_load_does_not_override_the_direct_figure_where_it_was_read():
    f = _window(own_cpu_s=18.0, host_busy_s=18.5, load=(9.0, 9.0))
    assert f["busy"] is False


def test_without_the_cores_others_used_the_load_before_the_run_decides():
    high = _window(own_cpu_s=5.0, host_busy_s=None, load=(LOAD_PER_CORE_MAX * 2 + 0.5, 0.0))
    low = _window(own_cpu_s=5.0, host_busy_s=None, load=(LOAD_PER_CORE_MAX * 2 - 0.5, 9.0))
    assert high["others_cores"] is None and high["busy"] is True
    assert "the 1-minute load was 2.50 on 2 cores before the run" in high["why"]
    assert low["busy"] is False


def test_nothing_readable_is_not_called_busy():
    assert verdict({"cores": 2.0, "others_cores": None, "load1_before": None}) == (False, None)


def test_busy_cores_are_read_for_the_allowed_cpus_only_with_steal_counted(tmp_path):
    stat = tmp_path / "stat"
    tick = host_load.os.sysconf("SC_CLK_TCK")
    #                 user nice system idle iowait irq softirq steal
    stat.write_text(
        f"cpu  9 9 9 9 9 9 9 9\ncpu0 {tick} 0 {tick} 500 77 0 0 {tick}\ncpu1 {50 * tick} 0 0 0 0 0 0 0\nintr 1 2\n"
    )
    assert host_load.host_busy_s([0], stat) == pytest.approx(3.0)  # user + system + steal; idle and iowait left out
    assert host_load.host_busy_s([0, 1], stat) == pytest.approx(53.0)
    assert host_load.host_busy_s([0, 7], stat) is None  # a CPU without a line: unknown, not smaller
    assert host_load.host_busy_s([0], tmp_path / "missing") is None


def test_a_cgroup_quota_caps_the_cores_available(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")
    assert host_load.cores_available([0, 1, 2, 3], cpu_max) == pytest.approx(1.5)
    cpu_max.write_text("max 100000\n")
    assert host_load.cores_available([0, 1], cpu_max) == 2.0
    assert host_load.cores_available([0, 1, 2], tmp_path / "none") == 3.0


def test_a_summary_is_busy_when_any_window_was_and_names_the_first():
    clean, busy = _window(own_cpu_s=19.0, host_busy_s=19.0), _window(own_cpu_s=8.0, host_busy_s=18.0)
    s = host_load.summary({"sync#1": clean, "one-step#1": busy, "fully-async#1": busy})
    assert s["busy"] is True and s["busy_windows"] == ["one-step#1", "fully-async#1"]
    assert s["why"].startswith("one-step#1: other processes kept 1.00 of the 2 cores busy")
    assert (s["others_share_max"], s["load_per_core_max"]) == (OTHERS_SHARE_MAX, LOAD_PER_CORE_MAX)
    text = host_load.describe(s)
    assert "the run had 0.40-0.95 of the host" in text
    assert "\nNOT COMPARABLE: busy host in 2 window(s) (one-step#1: " in text and "Fix: rerun on an idle host" in text
    one = host_load.describe(host_load.summary({"sync#1": clean}))
    assert "the run had 0.95 of the host" in one and "(clean: others at most" in one
    assert host_load.describe(None) == "host share: not recorded"


def test_the_meter_reads_this_process_at_both_edges():
    f = host_load.Meter().start().stop()
    assert f["cores"] >= 1 and f["wall_s"] >= 0 and isinstance(f["busy"], bool)


# --- results files and compare ----------------------------------------------------------


def _results(tmp_path, name: str, host: dict | None) -> str:
    res = Results.new("run", {"mode": "sync"})
    res.add_benchmark("sync/step_s", [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], "s", False)
    if host is not None:
        res.host = host
    return str(res.write(tmp_path / f"{name}.json"))


CLEAN = host_load.summary({"sync#1": _window(own_cpu_s=19.0, host_busy_s=19.0)})
BUSY = host_load.summary({"sync#1": _window(own_cpu_s=8.0, host_busy_s=18.0)})


def test_the_host_record_round_trips_and_a_file_without_it_reads_as_unknown(tmp_path):
    assert load_results(_results(tmp_path, "busy", BUSY)).host == BUSY
    old = load_results(_results(tmp_path, "old", None))
    assert old.host is None


def test_a_host_record_without_its_verdict_names_the_field(tmp_path, capsys):
    path = _results(tmp_path, "bad", {"windows": {}, "busy": "yes"})
    code = cli(["compare", path, path])
    err = capsys.readouterr().err
    assert code == 2 and "host.busy" in err and "true or false" in err


def test_compare_says_a_busy_run_against_a_clean_one_is_not_comparable(tmp_path, capsys):
    clean, busy = _results(tmp_path, "clean", CLEAN), _results(tmp_path, "busy", BUSY)
    code = cli(["compare", clean, busy])
    out = capsys.readouterr().out
    line = next(x.strip() for x in out.splitlines() if "host:" in x)
    assert code == 0  # a warning, not a threshold
    assert line.startswith(f"host: NOT COMPARABLE: {busy} ran on a busy host ({busy}: sync#1: other processes")
    assert f"against a clean run ({clean})" in line


def test_compare_names_an_old_file_beside_a_busy_one_and_says_nothing_of_two_clean_runs(tmp_path, capsys):
    old, busy, clean = (_results(tmp_path, n, h) for n, h in (("old", None), ("busy", BUSY), ("clean", CLEAN)))
    cli(["compare", old, busy])
    assert f"against {old}, which did not record its host" in capsys.readouterr().out
    cli(["compare", clean, clean])
    cli(["compare", old, clean])
    assert "host:" not in capsys.readouterr().out


def test_the_main_jobs_record_names_each_run_by_mode_and_repeat():
    from types import SimpleNamespace

    from harness.main_job.outputs import host_record

    w = _window(own_cpu_s=8.0, host_busy_s=18.0)
    runs = {"sync": [SimpleNamespace(host=None), SimpleNamespace(host=w)], "one-step": [SimpleNamespace(host=w)]}
    record = host_record(runs)  # type: ignore[arg-type]
    assert record is not None and list(record["windows"]) == ["sync#2", "one-step#1"]
    assert host_record({"sync": [SimpleNamespace(host=None)]}) is None  # type: ignore[arg-type]


# --- one real measurement under a generated load ----------------------------------------

SPIN = "import time, sys\nt = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < t: pass\n"


def _spinners(n: int, seconds: float, *, detached: bool) -> list[subprocess.Popen]:
    """``n`` processes that spin ``seconds`` of wall time and exit. ``detached``: started
    through a shell that exits at once, so they are not in this process's tree (their CPU
    is 'others'), and they end by themselves even if the test dies."""
    if detached:
        cmd = " ".join(f"{sys.executable} -c '{SPIN}' {seconds} >/dev/null 2>&1 &" for _ in range(n))
        subprocess.run(["sh", "-c", cmd], check=True)
        return []
    return [subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)]) for _ in range(n)]


def _measure_workload(cores: int, seconds: float) -> dict:
    meter = host_load.Meter().start()
    for p in _spinners(cores, seconds, detached=False):
        p.wait()
    return meter.stop()


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_a_generated_load_lowers_the_share_measured_by_a_clear_margin():
    cores = len(host_load.allowed_cpus())
    clean = _measure_workload(cores, 1.5)
    _spinners(2 * cores, 4.0, detached=True)  # twice as many busy processes as cores, 4 s each
    time.sleep(0.3)  # let them start
    loaded = _measure_workload(cores, 1.5)
    assert loaded["share"] < 0.75 * clean["share"], (clean, loaded)
    assert loaded["others_cores"] > clean["others_cores"], (clean, loaded)
