"""``python -m flightlog.cli``: the ``flightlog`` command."""

from ._main import main

main()
