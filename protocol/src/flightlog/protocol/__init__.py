"""flightlog's protocol: the file format, events, codec and wire messages, without I/O."""

from __future__ import annotations

from ._client import *  # noqa: F403
from ._client import __all__ as _client_all
from ._codec import *  # noqa: F403
from ._codec import __all__ as _codec_all
from ._defaults import *  # noqa: F403
from ._defaults import __all__ as _defaults_all
from ._errors import *  # noqa: F403
from ._errors import __all__ as _errors_all
from ._events import *  # noqa: F403
from ._events import __all__ as _events_all
from ._framing import *  # noqa: F403
from ._framing import __all__ as _framing_all
from ._json import *  # noqa: F403
from ._json import __all__ as _json_all
from ._ledger import *  # noqa: F403
from ._ledger import __all__ as _ledger_all
from ._lines import *  # noqa: F403
from ._lines import __all__ as _lines_all
from ._meta import *  # noqa: F403
from ._meta import __all__ as _meta_all
from ._numbers import *  # noqa: F403
from ._numbers import __all__ as _numbers_all
from ._reader import *  # noqa: F403
from ._reader import __all__ as _reader_all
from ._records import *  # noqa: F403
from ._records import __all__ as _records_all
from ._ring import *  # noqa: F403
from ._ring import __all__ as _ring_all
from ._server import *  # noqa: F403
from ._server import __all__ as _server_all
from ._state import *  # noqa: F403
from ._state import __all__ as _state_all
from ._wire import *  # noqa: F403
from ._wire import __all__ as _wire_all

__all__ = [
    *_client_all,
    *_codec_all,
    *_defaults_all,
    *_errors_all,
    *_events_all,
    *_framing_all,
    *_json_all,
    *_ledger_all,
    *_lines_all,
    *_meta_all,
    *_numbers_all,
    *_reader_all,
    *_records_all,
    *_ring_all,
    *_server_all,
    *_state_all,
    *_wire_all,
]
