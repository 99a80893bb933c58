"""The codec: typed messages, the registry, credential removal, foreign objects, errors."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import pathlib
import socket
import uuid
from collections import deque
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import attrs
import hypothesis.strategies as st
import msgspec
import pydantic
import pytest
from hypothesis import given, settings

from flightlog.protocol import (
    Codec,
    EncodedEvent,
    ErrorCode,
    Execution,
    FlightlogError,
    LocalProtocolError,
    Record,
    RecordingError,
    RemoteProtocolError,
    decode_event,
    decode_value,
    default_codec,
    encode_event,
    encode_value,
)
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    AssistantMessage,
    CallConfig,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    ModelExecEnd,
    ModelRequest,
    ModelResponse,
    ModelStream,
    TextPart,
    ToolCallPart,
    ToolDeclaration,
    ToolExecEnd,
    ToolExecUpdate,
    ToolResultMessage,
    TurnStart,
    Usage,
    UserMessage,
)
from flightlog.protocol.format import (
    MAX_DEPTH,
    is_credential_key,
)

MODEL = Execution(id="m1", kind="model", turn_index=0)
TOOL = Execution(id="t1", kind="tool", parent_id="m1")


# --- application types ----------------------------------------------------------------------


class Note(msgspec.Struct, kw_only=True, frozen=True):
    text: str
    tags: list[str] = []


@dataclasses.dataclass(frozen=True)
class Artifact:
    name: str
    body: bytes | None = None
    note: Note | None = None
    parts: list[TextPart] = dataclasses.field(default_factory=list)


class Kinded(msgspec.Struct, kw_only=True, tag_field="kind", tag="kinded"):
    value: int


class Unregistered(msgspec.Struct, kw_only=True):
    value: int


@dataclasses.dataclass
class UnregisteredData:
    value: int


class Color(enum.Enum):
    RED = "red"


def app_codec() -> Codec:
    codec = Codec()
    codec.register("app.note", Note)
    codec.register("app.artifact", Artifact)
    codec.register("app.kinded", Kinded)
    return codec


def record_of(encoded: EncodedEvent, seq: int = 3) -> Record:
    return Record(
        session_id="a" * 32,
        seq=seq,
        type=encoded.type,
        time=encoded.time,
        run_id="b" * 32,
        data=msgspec.Raw(encoded.data),
    )


def data_of(encoded: EncodedEvent | None) -> Any:
    assert encoded is not None
    return msgspec.json.decode(encoded.data)


# --- events ---------------------------------------------------------------------------------


def test_encoded_event_carries_type_data_and_source_time() -> None:
    event = TurnStart(turn_index=3, time="2026-11-29T20:00:00.000001Z")
    encoded = encode_event(event)
    assert encoded == EncodedEvent(
        type="turn_start", data=b'{"turn_index":3}', time="2026-11-29T20:00:00.000001Z"
    )
    decoded = decode_event(record_of(encoded))
    assert decoded == event


def test_execution_is_a_plain_object_in_its_field() -> None:
    encoded = encode_event(ModelExecEnd(execution=MODEL, usage=Usage(input_tokens=5)))
    data = data_of(encoded)
    assert data["execution"] == {
        "id": "m1",
        "kind": "model",
        "attempt": 1,
        "parent_id": None,
        "turn_index": 0,
        "agent": None,
        "replaces": None,
    }
    assert "$type" not in data["usage"]


def test_messages_carry_their_type_key() -> None:
    reply = AssistantMessage(content=[TextPart(text="hi"), ToolCallPart(id="c", name="ls")])
    data = data_of(encode_event(MessageEnd(execution=MODEL, message=reply)))
    assert data["message"]["$type"] == "assistant"
    assert [p["$type"] for p in data["message"]["content"]] == ["text", "tool_call"]


@pytest.mark.parametrize(
    "event",
    [
        MessageStart(message=AssistantMessage()),
        MessageUpdate(message=AssistantMessage(), delta="x"),
        ModelStream(execution=MODEL, chunk={"delta": "x"}),
        ToolExecUpdate(execution=TOOL, tool_call_id="c", name="ls", partial="50%"),
        ModelResponse(execution=MODEL, message=AssistantMessage()),
    ],
)
def test_never_written_events_encode_to_none(event: Any) -> None:
    assert encode_event(event) is None


def test_never_written_events_are_not_even_walked() -> None:
    # A value the codec would refuse does not matter in an event that is never written.
    event = MessageUpdate(message=Unregistered(value=1))
    assert encode_event(event) is None


def test_model_response_with_a_length_recovery_decision_is_written_without_message() -> None:
    event = ModelResponse(
        execution=MODEL,
        message=AssistantMessage(content=[TextPart(text="secret plan")]),
        length_recovery="continue",
        stop_reason="length",
    )
    encoded = encode_event(event)
    assert encoded is not None
    assert b"secret plan" not in encoded.data
    assert "message" not in data_of(encoded)
    decoded = decode_event(record_of(encoded))
    assert decoded == msgspec.structs.replace(event, message=None)


def test_not_an_event_is_refused() -> None:
    with pytest.raises(RecordingError) as info:
        encode_event(UserMessage(content="hi"))  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.BAD_EVENT


@pytest.mark.parametrize(
    ("event", "where"),
    [
        (TurnStart(turn_index="3"), "turn_index"),  # type: ignore[arg-type]
        (ToolExecEnd(execution=TOOL, tool_call_id="c", name="x", disposition="ok"), "disposition"),  # type: ignore[arg-type]
        (ModelExecEnd(execution=Execution(id="m", kind="robot")), "kind"),  # type: ignore[arg-type]
        (ModelExecEnd(execution=Execution(id="m", kind="model", attempt=0)), "attempt"),
        (ModelExecEnd(execution="m1"), "execution"),  # type: ignore[arg-type]
        (AgentEnd(usage={"input_tokens": "many"}), "usage"),  # type: ignore[arg-type]
    ],
)
def test_a_field_of_the_wrong_type_fails_at_encoding(event: Any, where: str) -> None:
    with pytest.raises(RecordingError) as info:
        encode_event(event)
    assert info.value.code == ErrorCode.BAD_EVENT
    assert where in str(info.value)


@pytest.mark.parametrize(
    "time", ["yesterday", "2026-11-29 20:00:00", "2026-11-29T20:00:00", "2026-11-29T25:00:00Z"]
)
def test_a_time_not_in_rfc_3339_fails_at_encoding(time: str) -> None:
    with pytest.raises(RecordingError, match="RFC 3339"):
        encode_event(AgentEnd(time=time))


@pytest.mark.parametrize(
    ("time", "stored"),
    [
        ("2026-11-29T21:00:00.123456+01:00", "2026-11-29T20:00:00.123456Z"),
        ("2026-11-29T20:00:00+00:00", "2026-11-29T20:00:00Z"),
        ("2026-11-29t20:00:00.5z", "2026-11-29T20:00:00.5Z"),
        ("2026-11-29 15:30:00.123456789-04:30", "2026-11-29T20:00:00.123456789Z"),
        ("2026-12-31T23:00:00-02:00", "2027-01-01T01:00:00Z"),
    ],
)
def test_any_rfc_3339_offset_is_stored_in_utc(time: str, stored: str) -> None:
    encoded = encode_event(AgentEnd(time=time))
    assert encoded is not None
    assert encoded.time == stored


def test_decode_event_restores_the_envelope_time() -> None:
    encoded = encode_event(AgentEnd(time="2026-01-01T00:00:00.000000Z"))
    assert encoded is not None
    record = msgspec.structs.replace(record_of(encoded), time="2026-01-02T00:00:00.000000Z")
    assert decode_event(record).time == "2026-01-02T00:00:00.000000Z"


def test_decode_event_skips_unknown_fields_and_defaults_missing_ones() -> None:
    data = b'{"ok":false,"future_field":{"x":[1,2]},"reason":"aborted"}'
    record = Record(
        session_id="s", seq=3, type="agent_end", time="2026-01-01T00:00:00Z", data=msgspec.Raw(data)
    )
    event = decode_event(record)
    assert event == AgentEnd(ok=False, reason="aborted", time="2026-01-01T00:00:00Z")


def test_decode_event_refuses_a_structural_record() -> None:
    record = Record(session_id="s", seq=2, type="run_start", time="2026-01-01T00:00:00Z")
    with pytest.raises(LocalProtocolError, match="structural"):
        decode_event(record)


def test_decode_event_refuses_an_unknown_type() -> None:
    record = Record(session_id="s", seq=2, type="telepathy", time="2026-01-01T00:00:00Z")
    with pytest.raises(RemoteProtocolError, match="unknown record type") as info:
        decode_event(record)
    assert info.value.code == ErrorCode.BAD_EVENT


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"[1,2]", "JSON object"),
        (b'{"execution":{"id":"m"}}', "does not fit ModelExecEnd"),
        (b'{"execution":{"id":"m","kind":"model"},"usage":7}', "does not fit"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_decode_event_refuses_data_that_does_not_fit(data: bytes, match: str) -> None:
    record = Record(
        session_id="s",
        seq=2,
        type="model_exec_end",
        time="2026-01-01T00:00:00Z",
        data=msgspec.Raw(data),
    )
    with pytest.raises(RemoteProtocolError, match=match):
        decode_event(record)


def test_decode_event_data_from_parts() -> None:
    event = default_codec.decode_event_data(
        "turn_start", b'{"turn_index":2}', time="2026-01-01T00:00:00Z"
    )
    assert event == TurnStart(turn_index=2, time="2026-01-01T00:00:00Z")


# --- credentials ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "apiKey",
        "API_KEY",
        "openai_api_key",
        "OPENAI_API_KEY",
        "x-api-key",
        "X-Api-Key",
        "x-goog-api-key",
        "authorization",
        "Authorization",
        "Proxy-Authorization",
        "password",
        "db_password",
        "secret",
        "client_secret",
        "clientSecret",
        "access_token",
        "accessToken",
        "refresh_token",
        "id_token",
        "token",
        "auth_token",
        "session_token",
        "aws_secret_access_key",
        "private_key",
        "privateKey",
        "secret_key",
        "cookie",
        "Set-Cookie",
        "credentials",
    ],
)
def test_credential_keys(key: str) -> None:
    assert is_credential_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "max_tokens",
        "max_output_tokens",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "tokens",
        "model",
        "temperature",
        "user",
        "key",
        "prompt_cache_key",
        "anthropic-version",
        "content-type",
        "secretary",
    ],
)
def test_not_credential_keys(key: str) -> None:
    assert not is_credential_key(key)


def test_credentials_never_reach_a_model_request_record() -> None:
    event = ModelRequest(
        execution=MODEL,
        messages=[UserMessage(content="hi")],
        config=CallConfig(
            model="gpt-x",
            max_tokens=512,
            extra={
                "api_key": "sk-AAA",
                "apiKey": "sk-BBB",
                "reasoning": {"effort": "high", "client_secret": "sk-CCC"},
                "fallbacks": [{"model": "y", "x-api-key": "sk-DDD"}, "plain"],
                "max_output_tokens": 99,
            },
        ),
        headers={
            "Authorization": "Bearer sk-EEE",
            "x-api-key": "sk-FFF",
            "Cookie": "session=sk-GGG",
            "anthropic-beta": "tools",
        },
    )
    encoded = encode_event(event)
    assert encoded is not None
    assert b"sk-" not in encoded.data
    data = msgspec.json.decode(encoded.data)
    assert data["config"]["max_tokens"] == 512
    assert data["config"]["extra"] == {
        "reasoning": {"effort": "high"},
        "fallbacks": [{"model": "y"}, "plain"],
        "max_output_tokens": 99,
    }
    assert data["headers"] == {"anthropic-beta": "tools"}
    # The event the agent holds is untouched.
    assert event.config is not None
    assert event.config.extra["api_key"] == "sk-AAA"


def test_credentials_are_removed_from_a_call_config_anywhere() -> None:
    snapshot = {"config": CallConfig(model="m", extra={"api_key": "sk-1", "seed": 3})}
    decoded = decode_value(encode_value(snapshot))
    assert decoded == {"config": CallConfig(model="m", extra={"seed": 3})}


def test_tool_arguments_are_not_scrubbed() -> None:
    # Only configuration and headers are scrubbed: a tool's arguments are what it ran with.
    event = ToolExecEnd(execution=TOOL, tool_call_id="c", name="login", details={"token": "t"})
    assert data_of(encode_event(event))["details"] == {"token": "t"}


# --- the registry ---------------------------------------------------------------------------


def test_builtin_tags_are_registered() -> None:
    tags = Codec().tags
    builtin = ("user", "assistant", "tool_result", "system", "text", "thinking", "tool_call")
    for tag in (*builtin, "image", "file"):
        assert tag in tags
    assert tags["assistant"] is AssistantMessage
    assert Codec().tag_of(Execution) == "execution"
    assert Codec().tag_of(Note) is None


def test_register_returns_the_class_and_is_idempotent() -> None:
    codec = Codec()
    assert codec.register("app.note", Note) is Note
    assert codec.register("app.note", Note) is Note
    assert codec.tag_of(Note) == "app.note"


def test_registries_are_separate() -> None:
    codec = app_codec()
    assert codec.tag_of(Note) == "app.note"
    assert Codec().tag_of(Note) is None
    assert default_codec.tag_of(Note) is None


@pytest.mark.parametrize(
    ("tag", "cls", "match"),
    [
        ("app.note", Artifact, "already registered for"),
        ("user", Note, "already registered for"),
        ("app.other", Note, "already registered as"),
        ("", Unregistered, "non-empty"),
        ("app.dict", dict, "only msgspec Structs and dataclasses"),
        ("app.int", int, "only msgspec Structs and dataclasses"),
    ],
)
def test_register_conflicts(tag: str, cls: type, match: str) -> None:
    codec = app_codec()
    with pytest.raises(LocalProtocolError, match=match) as info:
        codec.register(tag, cls)
    assert info.value.code == ErrorCode.CODEC_ERROR


def test_register_refuses_array_like_structs() -> None:
    class Point(msgspec.Struct, array_like=True):
        x: int

    with pytest.raises(LocalProtocolError, match="array_like"):
        Codec().register("app.point", Point)


def test_register_refuses_a_struct_tagged_with_another_type() -> None:
    class Odd(msgspec.Struct, tag_field="$type", tag="odd"):
        x: int

    with pytest.raises(LocalProtocolError, match="already tags itself"):
        Codec().register("app.odd", Odd)
    assert Codec().register("odd", Odd) is Odd


class PydanticPart(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    kind: str
    when: datetime
    inner: PydanticInner | None = None


class PydanticInner(pydantic.BaseModel):
    values: list[int]


PydanticPart.model_rebuild()


@attrs.define
class AttrsCall:
    name: str
    args: dict[str, Any]


@pytest.mark.parametrize(
    ("obj", "fields"),
    [
        (Unregistered(value=1), {"value": 1}),
        (UnregisteredData(value=1), {"value": 1}),
        (AttrsCall(name="f", args={"x": (1, 2)}), {"name": "f", "args": {"x": [1, 2]}}),
    ],
)
def test_an_unregistered_object_is_written_with_its_class_and_fields(
    obj: Any, fields: dict[str, Any]
) -> None:
    decoded = data_of(app_codec().encode_event(MessageEnd(message=obj)))["message"]
    assert decoded == {"$class": f"{__name__}.{type(obj).__qualname__}", **fields}


def test_a_pydantic_model_is_written_faithfully() -> None:
    # As pydantic writes it in JSON mode (extra fields included), with its class first;
    # the models inside it are pydantic's to write, so they carry no class.
    moment = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
    part = PydanticPart(kind="text", when=moment, inner=PydanticInner(values=[1, 2]), note="x")
    decoded = decode_value(encode_value({"parts": [part]}))
    assert decoded == {
        "parts": [{"$class": f"{__name__}.PydanticPart", **part.model_dump(mode="json")}]
    }
    assert decoded["parts"][0]["inner"] == {"values": [1, 2]}


def test_registered_types_inside_an_unregistered_object_keep_their_tag() -> None:
    obj = UnregisteredData(value=TextPart(text="hi"))  # type: ignore[arg-type]
    decoded = decode_value(encode_value(obj))
    assert decoded == {"$class": f"{__name__}.UnregisteredData", "value": TextPart(text="hi")}


def test_other_common_values() -> None:
    value = {
        "path": pathlib.PurePosixPath("/etc/hostname"),
        "error": ValueError("bad input"),
        "queue": deque([1, 2]),
        "keys": {"a": 1}.keys(),
        "wait": timedelta(seconds=90),
    }
    assert decode_value(encode_value(value)) == {
        "path": "/etc/hostname",
        "error": {"$class": "builtins.ValueError", "message": "bad input"},
        "queue": [1, 2],
        "keys": ["a"],
        "wait": "PT90S",
    }


def test_an_event_is_not_a_value() -> None:
    with pytest.raises(RecordingError, match="AgentEnd"):
        encode_value([AgentEnd()])


def test_registered_types_round_trip_in_events() -> None:
    codec = app_codec()
    note = Note(text="remember", tags=["a"])
    artifact = Artifact(name="plot.png", body=None, note=note, parts=[TextPart(text="caption")])
    event = ToolExecEnd(
        execution=TOOL,
        tool_call_id="c",
        name="plot",
        content=[TextPart(text="done"), note],
        details={"artifact": artifact, "kinded": Kinded(value=3)},
    )
    encoded = codec.encode_event(event)
    assert encoded is not None
    data = msgspec.json.decode(encoded.data)
    assert data["content"][1] == {"$type": "app.note", "text": "remember", "tags": ["a"]}
    assert data["details"]["kinded"] == {"$type": "app.kinded", "kind": "kinded", "value": 3}
    decoded = codec.decode_event(record_of(encoded))
    assert decoded == event
    assert isinstance(decoded, ToolExecEnd)
    assert type(decoded.details["artifact"]) is Artifact


def test_unknown_type_tags_decode_as_plain_dicts() -> None:
    # A reader without the application's registry still reads the record.
    encoded = app_codec().encode_event(MessageEnd(message=Note(text="x")))
    assert encoded is not None
    event = default_codec.decode_event(record_of(encoded))
    assert isinstance(event, MessageEnd)
    assert event.message == {"$type": "app.note", "text": "x", "tags": []}


def test_a_registered_tag_that_does_not_fit_is_an_error() -> None:
    with pytest.raises(RemoteProtocolError, match=r"app\.note") as info:
        app_codec().decode_value(b'{"$type":"app.note","tags":"not a list"}')
    assert info.value.code == ErrorCode.CODEC_ERROR


def test_value_types_carry_a_tag_outside_their_own_fields() -> None:
    snapshot = {
        "execution": MODEL,
        "usage": Usage(output_tokens=3),
        "tools": [ToolDeclaration(name="ls")],
    }
    encoded = encode_value(snapshot)
    assert msgspec.json.decode(encoded)["execution"]["$type"] == "execution"
    assert decode_value(encoded) == snapshot


# --- snapshots ------------------------------------------------------------------------------


def test_plain_values_pass_as_they_are() -> None:
    value = {"a": [1, 2.5, None, True, "x"], "b": {"c": {}}, "": []}
    assert encode_value(value) == msgspec.json.encode(value)
    assert decode_value(encode_value(value)) == value


def test_tuples_and_sets_become_lists() -> None:
    assert decode_value(encode_value({"t": (1, 2), "s": {3}})) == {"t": [1, 2], "s": [3]}


def test_values_msgspec_writes_read_back_as_json() -> None:
    moment = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
    ident = uuid.UUID(int=7)
    value = {"when": moment, "id": ident, "n": Decimal("1.5"), "c": Color.RED, "b": b"\x00\xff"}
    assert decode_value(encode_value(value)) == {
        "when": "2026-11-29T20:00:00Z",
        "id": str(ident),
        "n": "1.5",
        "c": "red",
        "b": "AP8=",
    }


def test_nan_and_infinity_become_null() -> None:
    assert decode_value(encode_value([math.nan, math.inf, -math.inf])) == [None, None, None]


def unencodable(value: Any) -> str:
    with pytest.raises(RecordingError) as info:
        encode_value(value)
    assert info.value.code == ErrorCode.CODEC_ERROR
    return str(info.value)


def test_an_unencodable_value_is_a_recording_error_never_a_placeholder() -> None:
    with socket.socket() as handle:
        assert "socket" in unencodable({"ok": 1, "handle": handle})
    assert "function" in unencodable({"later": [lambda: None, "fine"]})
    assert "generator" in unencodable({"lazy": (i for i in range(3))})


def marked(value: Any) -> tuple[Any, tuple[str, ...]]:
    """What a tool_exec_end's details become, and the markers the codec names."""
    encoded = encode_event(ToolExecEnd(execution=TOOL, tool_call_id="c", name="x", details=value))
    assert encoded is not None
    return msgspec.json.decode(encoded.data)["details"], encoded.markers


def test_an_unencodable_value_in_an_event_is_marked_and_the_event_kept() -> None:
    thing = object()
    details, markers = marked({"fd": thing, "ok": 1})
    assert details == {
        "fd": {
            "$flightlog": "unencodable",
            "class": "builtins.object",
            "repr": repr(thing),
            "error": "TypeError: Encoding objects of type object is unsupported",
        },
        "ok": 1,
    }
    assert markers == (
        "details: builtins.object (TypeError: Encoding objects of type object is unsupported)",
    )


def test_each_kind_of_unencodable_value_is_marked_where_it_is() -> None:
    cycle: list[Any] = [1]
    cycle.append(cycle)
    deep: Any = "bottom"
    for _ in range(MAX_DEPTH + 50):
        deep = [deep]
    with socket.socket() as handle:
        details, markers = marked(
            {
                "socket": handle,
                "function": len,
                "method": print,
                "cycle": cycle,
                "keys": {(1, 2): "x"},
                "raw": msgspec.Raw(b"{}"),
                "event": AgentEnd(),
                "deep": deep,
                "surrogate": ["ok", "\ud800"],
            }
        )
    errors = {key: value["error"] for key, value in details.items() if isinstance(value, dict)}
    assert errors["socket"] == "TypeError: Encoding objects of type socket is unsupported"
    assert "builtin_function_or_method" in errors["function"]
    assert "dict keys" in errors["keys"]
    assert "Raw" in errors["raw"]
    assert "record events with run.record()" in errors["event"]
    assert details["surrogate"][0] == "ok"
    assert details["surrogate"][1]["repr"] == repr("\ud800")
    assert "surrogates not allowed" in details["surrogate"][1]["error"]
    # The too deep value is cut where it passes the limit, the rest of it kept.
    level, depth = details["deep"], 2  # details (1), then its "deep" member (2)
    while isinstance(level, list):
        level, depth = level[0], depth + 1
    assert level["$flightlog"] == "unencodable" and "deeper than 200" in level["error"]
    assert depth == MAX_DEPTH
    # A cycle is cut where the value meets itself again.
    assert details["cycle"][0] == 1
    assert details["cycle"][1]["class"] == "builtins.list"
    assert details["cycle"][1]["error"] == "a reference cycle"
    # At most 8 markers are named, then how many more.
    assert len(markers) == 9 and markers[-1] == "and 1 more"
    assert all(m.startswith("details: ") for m in markers[:-1])


def test_a_marker_repr_is_bounded() -> None:
    class Loud:
        def __repr__(self) -> str:
            return "x" * 10_000

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    details, _ = marked([Loud(), Broken()])
    assert len(details[0]["repr"]) == 200
    assert "..." in details[0]["repr"]
    assert details[1]["repr"].startswith("<Broken instance at")


def test_a_marked_event_reads_back() -> None:
    event = ToolExecEnd(execution=TOOL, tool_call_id="c", name="x", details={"fd": object()})
    encoded = encode_event(event)
    assert encoded is not None
    decoded = decode_event(record_of(encoded))
    assert isinstance(decoded, ToolExecEnd)
    assert decoded.details["fd"]["$flightlog"] == "unencodable"


def test_a_lone_surrogate_is_a_recording_error() -> None:
    assert "surrogate" in unencodable({"bad": "\ud800", "good": "é"})


def test_a_lone_surrogate_in_a_typed_field_is_kept_as_escaped_text() -> None:
    encoded = encode_event(ModelExecEnd(execution=Execution(id="\ud800", kind="model")))
    assert encoded is not None
    assert msgspec.json.decode(encoded.data)["execution"]["id"] == "\\ud800"
    assert encoded.markers == ("execution: builtins.str (a lone surrogate)",)


def test_a_lone_surrogate_in_a_free_field_of_an_event_is_marked() -> None:
    encoded = encode_event(MessageEnd(message={"text": "\ud800", "ok": "é"}, execution=MODEL))
    assert encoded is not None
    message = msgspec.json.decode(encoded.data)["message"]
    assert message["ok"] == "é"
    assert message["text"]["$flightlog"] == "unencodable"
    assert encoded.markers[0].startswith("message: builtins.str (UnicodeEncodeError")


def test_an_event_without_markers_names_none() -> None:
    encoded = encode_event(MessageEnd(message={"text": "hi"}, execution=MODEL))
    assert encoded is not None and encoded.markers == ()


def test_a_reference_cycle_is_a_recording_error() -> None:
    cycle: list[Any] = [1]
    cycle.append(cycle)
    assert "cycle" in unencodable({"cycle": cycle})
    obj = UnregisteredData(value=0)
    obj.value = obj  # type: ignore[assignment]
    assert "cycle" in unencodable(obj)


def test_a_shared_value_is_not_a_cycle() -> None:
    shared = {"x": 1}
    assert decode_value(encode_value([shared, shared])) == [shared, shared]


def test_too_deep_nesting_is_a_recording_error() -> None:
    deep: Any = "bottom"
    for _ in range(MAX_DEPTH + 50):
        deep = [deep]
    assert "deeper" in unencodable(deep)


def test_a_dict_with_keys_json_cannot_hold_is_a_recording_error() -> None:
    assert "dict keys" in unencodable({"d": {(1, 2): "x"}})
    assert decode_value(encode_value({"n": {1: "one"}})) == {"n": {"1": "one"}}


def test_raw_json_is_not_accepted_as_a_value() -> None:
    assert "Raw" in unencodable({"raw": msgspec.Raw(b"{}")})


@pytest.mark.parametrize("data", [b"", b"{", b"\xff", b"[1,]"])
def test_decode_value_raises_only_flightlog_errors(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_value(data)
    assert info.value.code == ErrorCode.CODEC_ERROR


def test_decode_value_of_absurd_nesting() -> None:
    with pytest.raises(FlightlogError):
        decode_value(b"[" * 100_000 + b"]" * 100_000)


# --- hypothesis: snapshots round trip -----------------------------------------------------

keys = st.text(max_size=10).filter(lambda k: k != "$type")
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
notes = st.builds(Note, text=st.text(), tags=st.lists(st.text(), max_size=3))
typed = st.one_of(
    notes,
    st.builds(TextPart, text=st.text()),
    st.builds(UserMessage, content=st.text()),
    st.builds(Kinded, value=st.integers()),
    st.builds(Artifact, name=st.text(), note=st.none() | notes),
    st.builds(
        ToolResultMessage,
        tool_call_id=st.text(),
        name=st.text(),
        content=st.lists(st.builds(TextPart, text=st.text()), max_size=2),
    ),
)
snapshots = st.recursive(
    scalars | typed,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(keys, children, max_size=5),
    max_leaves=25,
)


def normalise(value: Any) -> Any:
    """What a value reads back as: infinities are written as null."""
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    return value


@settings(max_examples=300, deadline=None)
@given(snapshots)
def test_snapshots_round_trip(value: Any) -> None:
    codec = app_codec()
    assert codec.decode_value(codec.encode_value(value)) == normalise(value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_decode_value_of_random_bytes_raises_only_flightlog_errors(data: bytes) -> None:
    with contextlib.suppress(FlightlogError):
        app_codec().decode_value(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["agent_end", "model_exec_end", "message_end"]))
def test_decode_event_of_random_bytes_raises_only_flightlog_errors(data: bytes, type_: str) -> None:
    with contextlib.suppress(FlightlogError):
        default_codec.decode_event_data(type_, data, time="2026-01-01T00:00:00Z")


def test_module_level_functions_use_the_default_codec() -> None:
    event = AgentStart(agent="demo", messages=[UserMessage(content="hi")])
    assert encode_event(event) == default_codec.encode_event(event)
    assert encode_value([1]) == default_codec.encode_value([1])


# --- the stub of an event too large to send ---------------------------------------------------


def test_an_oversized_event_becomes_a_stub_that_reads_as_the_event() -> None:
    import hashlib

    big = ToolExecEnd(
        execution=TOOL,
        tool_call_id="call_1",
        name="dump",
        content=[TextPart(text="x" * 100_000)],
        details={"rows": list(range(10_000))},
        is_error=False,
    )
    encoded = encode_event(big)
    assert encoded is not None
    stub = default_codec.oversized(encoded, limit=65_536)
    assert (stub.type, stub.time) == (encoded.type, encoded.time)
    data = msgspec.json.decode(stub.data)
    assert data == {
        "$flightlog": "oversized",
        "size": len(encoded.data),
        "sha256": hashlib.sha256(encoded.data).hexdigest(),
        "omitted": ["content", "details"],
        "execution": msgspec.to_builtins(TOOL),
        "tool_call_id": "call_1",
        "name": "dump",
        "is_error": False,
        "disposition": "ran",
        "reason": None,
    }
    assert stub.markers == (
        f"oversized: {len(encoded.data)} bytes, more than the maximum frame size of 65536 "
        "bytes; written as a stub without content, details",
    )
    decoded = decode_event(record_of(stub))
    assert isinstance(decoded, ToolExecEnd)
    assert (decoded.execution, decoded.name, decoded.content) == (TOOL, "dump", [])


def test_a_required_member_too_large_is_cut_or_null() -> None:
    from flightlog.protocol.events import (
        Error,
    )

    encoded = encode_event(MessageEnd(message={"text": "y" * 50_000}, execution=MODEL))
    assert encoded is not None
    stub = default_codec.oversized(encoded, limit=16_384)
    decoded = decode_event(record_of(stub))
    assert isinstance(decoded, MessageEnd)
    assert decoded.message is None and decoded.execution == MODEL

    encoded = encode_event(Error(message="z" * 50_000))
    assert encoded is not None
    stub = default_codec.oversized(encoded, limit=16_384)
    decoded = decode_event(record_of(stub))
    assert isinstance(decoded, Error)
    assert decoded.message == "z" * 256  # 16 KiB / 32 / 2
    assert len(stub.data) < 16_384


def test_markers_of_the_walk_survive_a_lone_surrogate_in_a_typed_field() -> None:
    thing = object()
    encoded = encode_event(
        ToolExecEnd(execution=TOOL, tool_call_id="c\ud800", name="x", details={"o": thing})
    )
    assert encoded is not None
    data = msgspec.json.decode(encoded.data)
    assert data["tool_call_id"] == "c\\ud800"
    assert data["details"]["o"]["class"] == "builtins.object"
    assert encoded.markers == (
        "details: builtins.object (TypeError: Encoding objects of type object is unsupported)",
        "tool_call_id: builtins.str (a lone surrogate)",
    )
