"""Every benchmark measures the share of the machine it had (``harness.measure.host_load``).

Over each benchmark test (its function-scoped fixtures included) the fixture below reads the process tree's CPU
time against wall time and the cores this process may use, the CPU others kept busy and
the 1-minute load before and after. The figures go into the test's ``user_properties``
(``host``; a JUnit XML report carries them) and the session ends with one line per
benchmark; a benchmark that ran on a busy host is named there as not comparable with a
clean run's, with the threshold it crossed.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.measure import host_load

_WINDOWS: dict[str, dict[str, Any]] = {}


@pytest.fixture(autouse=True)
def host_share(request: pytest.FixtureRequest):
    meter = host_load.Meter().start()
    yield meter
    figures = meter.stop()
    _WINDOWS[request.node.nodeid] = figures
    request.node.user_properties.append(("host", figures))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _WINDOWS:
        return
    terminalreporter.section("share of the host each benchmark had (harness.measure.host_load)")
    for nodeid, f in _WINDOWS.items():
        share = "-" if f["share"] is None else f"{f['share']:.2f}"
        others = "-" if f["others_cores"] is None else f"{f['others_cores']:.2f}"
        verdict = f"NOT COMPARABLE: {f['why']}" if f["busy"] else "clean"
        terminalreporter.write_line(f"{nodeid}: share {share} of {f['cores']:g} cores, others {others}; {verdict}")
