"""Where the suite's CPU goes (``pytest --cpu-report``): each test's CPU seconds, user
and system, of the test process, of the processes it started and waited for (and
theirs), and of the daemons its fork server forked and reaped (not the test process's
children: :mod:`support.forkserver` reports each one's rusage as it exits). A module's
fixtures count with its first test (set-up) and its last (teardown). With xdist, each
worker measures its own tests and the report is printed by the controller.
"""

from __future__ import annotations

import resource
from collections import defaultdict
from typing import Any

import pytest

from .forkserver import forked_daemons_cpu

#: How many tests and modules the report names.
TOP = 40


def _cpu() -> float:
    total = forked_daemons_cpu()
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class CpuReport:
    def __init__(self) -> None:
        self._last = _cpu()
        self.tests: dict[str, float] = defaultdict(float)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        outcome = yield
        now = _cpu()
        outcome.get_result().user_properties.append(("cpu", now - self._last))
        self._last = now

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == "cpu":
                self.tests[report.nodeid] += value

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        modules: dict[str, float] = defaultdict(float)
        for nodeid, cpu in self.tests.items():
            modules[nodeid.split("::")[0]] += cpu
        write = terminalreporter.write_line
        write(f"CPU of the tests: {sum(self.tests.values()):.1f} s")
        for title, table in (("tests", self.tests), ("modules", modules)):
            write(f"the {TOP} {title} of most CPU (seconds):")
            for name, cpu in sorted(table.items(), key=lambda row: -row[1])[:TOP]:
                write(f"{cpu:9.1f}  {name}")
