"""The events the benchmark records, and the exact line bytes the daemon writes for them.

The baselines write, for every event, the very line flightlogd would write: the record
envelope of file format version 1 around the codec's ``data``, encoded by the protocol's
own :func:`append_line`.  So every system pays for the same codec work and writes the
same number of bytes; only where and how the line reaches the disk differs.
"""

from __future__ import annotations

import msgspec

from flightlog.protocol import (
    Event,
    Execution,
    Record,
    default_codec,
)
from flightlog.protocol.events import (
    AssistantMessage,
    CallConfig,
    ModelRequest,
    TextPart,
    ToolCallPart,
    ToolDeclaration,
    ToolExecStart,
    ToolResultMessage,
    UserMessage,
)
from flightlog.protocol.format import (
    append_line,
)

__all__ = [
    "LARGE_EVENT_BYTES",
    "LineEncoder",
    "large_event",
    "line_lengths",
    "small_event",
    "stamped_event",
    "stamped_ns",
]

#: The target size of the large event's ``data``: one 64 KiB model request.
LARGE_EVENT_BYTES = 64 * 1024

_EXECUTION = Execution(id="tool-7", kind="tool", turn_index=3)


def small_event(sent_ns: int = 0) -> ToolExecStart:
    """A tool call starting, as an agent loop records it: its line is about 300 bytes."""
    return ToolExecStart(
        execution=_EXECUTION,
        tool_call_id="call_8f2b",
        name="read_file",
        arguments={"path": "src/app.py", "sent_ns": sent_ns},
    )


def stamped_event(sent_ns: int) -> ToolExecStart:
    """The small event carrying a ``time.monotonic_ns()`` send stamp (tail latency)."""
    return small_event(sent_ns)


def stamped_ns(data: bytes | msgspec.Raw) -> int:
    """The send stamp back out of a stamped event's record ``data``."""
    return _stamp_decoder.decode(data).arguments.sent_ns


class _Arguments(msgspec.Struct):
    sent_ns: int = 0


class _Stamped(msgspec.Struct):
    arguments: _Arguments


_stamp_decoder = msgspec.json.Decoder(_Stamped)

_PROSE = (
    "The handler reads the request body, validates it against the schema and writes the "
    "result to the store; on a conflict it retries twice with jitter before giving up. "
)


def large_event(target: int = LARGE_EVENT_BYTES) -> ModelRequest:
    """A model request whose ``data`` is ``target`` bytes (within a few bytes).

    A conversation of user turns, assistant tool calls and tool results, with the tools
    offered and the resolved call config: the shape of a real mid-run request.
    """
    tools = [
        ToolDeclaration(
            name=name,
            description=f"{name.replace('_', ' ').capitalize()} in the workspace.",
            parameters={
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        )
        for name in ("read_file", "write_file", "list_dir", "run_tests", "search")
    ]
    config = CallConfig(model="claude-sonnet", provider="anthropic", max_tokens=4096)

    def build(text_bytes: int) -> ModelRequest:
        messages: list[object] = []
        turn = 0
        remaining = text_bytes
        while remaining > 0:
            chunk = min(remaining, 4000)
            body = (_PROSE * (chunk // len(_PROSE) + 1))[:chunk]
            remaining -= chunk
            call_id = f"call_{turn:04d}"
            messages.append(UserMessage(content=[TextPart(text=f"Step {turn}: continue.")]))
            messages.append(
                AssistantMessage(
                    content=[
                        ToolCallPart(
                            id=call_id, name="read_file", arguments={"path": f"f{turn}.py"}
                        )
                    ],
                    model="claude-sonnet",
                    stop_reason="tool_use",
                )
            )
            messages.append(
                ToolResultMessage(
                    tool_call_id=call_id, name="read_file", content=[TextPart(text=body)]
                )
            )
            turn += 1
        return ModelRequest(
            execution=Execution(id="model-0042", kind="model", turn_index=turn),
            messages=messages,
            tools=tools,
            config=config,
            system="You are a careful coding agent.",
        )

    overhead = _data_size(build(1))
    event = build(max(1, target - overhead))
    # Each extra 4000-byte chunk adds a turn's envelope: trim the text by what is over.
    over = _data_size(event) - target
    if over > 0:
        event = build(max(1, target - overhead - over))
    return event


def _data_size(event: Event) -> int:
    encoded = default_codec.encode_event(event)
    assert encoded is not None
    return len(encoded.data)


class LineEncoder:
    """Turns events into complete session-file lines, as the daemon writes them.

    ``line(event)`` runs the codec (what ``record()`` runs in the agent) and wraps its
    ``data`` in the record envelope with the next seq: the bytes flightlogd would write.
    """

    def __init__(self, session_id: str, run_id: str, first_seq: int = 1) -> None:
        self.session_id = session_id
        self.run_id = run_id
        self.seq = first_seq - 1
        self.type = ""  # of the last line
        self.time = ""

    def line(self, event: Event) -> bytes:
        encoded = default_codec.encode_event(event)
        assert encoded is not None
        self.seq += 1
        self.type, self.time = encoded.type, encoded.time
        buf = bytearray()
        append_line(
            buf,
            Record(
                session_id=self.session_id,
                seq=self.seq,
                type=encoded.type,
                time=encoded.time,
                run_id=self.run_id,
                data=msgspec.Raw(encoded.data),
            ),
        )
        return bytes(buf)


def line_lengths(sample_line_at_seq_1: int, first_seq: int, count: int) -> int:
    """Total bytes of ``count`` lines from ``first_seq`` on, whose line at seq 1 is
    ``sample_line_at_seq_1`` bytes long: only the seq's digits change the length."""
    base = sample_line_at_seq_1 - 1
    total = base * count
    start, end = first_seq, first_seq + count  # seqs in [start, end)
    digits, low = 1, 1
    while low < end:
        high = low * 10
        overlap = max(0, min(end, high) - max(start, low))
        total += overlap * digits
        digits, low = digits + 1, high
    return total
