"""Benchmarks of flightlogd against the two designs it replaces.

Run from the repository root: ``uv run python -m bench`` (``--quick`` for a run of
under a minute, ``--json FILE`` for every run's figures).  See ``docs/benchmarks.md``
for the latest results and what limits them, and :mod:`bench.__main__` for options.

Modules: ``_systems`` (the three systems behind one interface), ``_events`` (the
events and their exact line bytes), ``_procs`` (agent processes, ``/proc``),
``_daemon`` (flightlogd as a subprocess), one module per group of scenarios
(``_throughput``: 1, 2; ``_calls``: 3, 5; ``_tail``: 4; ``_scale``: 6, 7),
``_syslog`` (rsyslog and syslog-ng as peers in scenarios 1 and 2), and ``_report``
(medians, ratios, targets, the table).  Probes: ``wakeup``, ``roundtrip``, ``steps``.
"""
