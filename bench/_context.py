"""What every scenario gets: sizes (full or quick), a scratch directory, progress output."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ._daemon import Daemon
from ._syslog import Peer, PeerDaemons
from ._systems import System

__all__ = ["Context"]


@dataclass
class Context:
    """The run's settings; ``quick`` shrinks every workload, never the set of rows."""

    base: Path
    quick: bool
    runs: int
    peers: Sequence[Peer] = ()  # rsyslog and syslog-ng, found or skipped (scenarios 1, 2)
    #: Options given to every flightlogd the scenarios start (``--daemon-arg``).
    daemon_args: Sequence[str] = ()
    _counter: int = 0

    def scratch(self, name: str) -> Path:
        """A fresh directory for one scenario (short: socket paths are limited)."""
        self._counter += 1
        path = self.base / f"{self._counter}{name}"
        path.mkdir(parents=True)
        return path

    def daemon(self, directory: Path, *args: str) -> Daemon:
        return Daemon(directory / "d", *args, *self.daemon_args)

    def peer_daemons(self, directory: Path) -> PeerDaemons:
        """The peers found, not yet started, each with a directory under ``directory``."""
        return PeerDaemons(self.peers, directory)

    def systems(
        self, directory: Path, daemon: Daemon, run: int, peers: Sequence[System] = ()
    ) -> list[System]:
        """The three systems (and ``peers``), with fresh data locations for run ``run``,
        in an order that rotates from run to run so no system always runs first."""
        systems = [
            System("flightlog", str(daemon.root), daemon.socket),
            System("jsonl", str(directory / f"jsonl{run}")),
            System("sqlite", str(directory / f"sqlite{run}")),
            *peers,
        ]
        shift = run % len(systems)
        return systems[shift:] + systems[:shift]

    @staticmethod
    def clean(system: System, run: int) -> None:
        """Remove a run's data (the large-event runs write gigabytes)."""
        if system.name == "flightlog":
            shutil.rmtree(Path(system.directory) / f"r{run}", ignore_errors=True)
        else:
            shutil.rmtree(system.directory, ignore_errors=True)

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)
