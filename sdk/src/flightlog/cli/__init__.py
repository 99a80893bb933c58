"""The ``flightlog`` command: follow, read, verify and understand session files.

It is built on the public SDK (:mod:`flightlog.sdk`) and the protocol, and installs with
``flightlog-sdk``; :func:`main` is the console script, :func:`run` the same without the
exit.
"""

from ._main import main, run

__all__ = ["main", "run"]
