"""The event model, and every event type through codec -> record line -> reader -> decode."""

from __future__ import annotations

import inspect
import io
import types
import typing
from datetime import UTC, datetime
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from flightlog.protocol import (
    AGENT_FACT_TYPES,
    Codec,
    Event,
    Execution,
    Reader,
    Record,
    SessionStartData,
    default_codec,
    format_time,
    new_id,
    now,
)
from flightlog.protocol.events import (
    EVENT_CLASSES,
    AgentEnd,
    AssistantMessage,
    CallConfig,
    ChatMessage,
    ContextCompacted,
    FilePart,
    ImagePart,
    MessageEnd,
    ModelExecEnd,
    ModelRequest,
    ModelResponse,
    Part,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolDeclaration,
    ToolExecEnd,
    ToolResultMessage,
    Usage,
    UserMessage,
    event_type,
    new_execution_id,
)
from flightlog.protocol.format import (
    NEVER_WRITTEN_TYPES,
    encode_line,
    is_credential_key,
    is_time,
)

# --- the model ----------------------------------------------------------------------------

# Facts that belong to a call and so must carry an execution.
CALL_FACTS = {
    "model_request",
    "model_exec_start",
    "model_exec_end",
    "model_response",
    "model_stream",
    "tool_queued",
    "tool_exec_start",
    "tool_invoke_start",
    "tool_invoke_end",
    "tool_exec_update",
    "tool_exec_end",
    "retry",
    "retry_wait_start",
    "retry_wait_end",
    "context_compacted",
}


def test_one_event_class_per_agent_fact_and_never_written_type() -> None:
    assert set(EVENT_CLASSES) == AGENT_FACT_TYPES | NEVER_WRITTEN_TYPES


@pytest.mark.parametrize("tag", sorted(EVENT_CLASSES))
def test_event_class_knows_its_record_type(tag: str) -> None:
    cls = EVENT_CLASSES[tag]
    assert event_type(cls) == tag
    config = cls.__struct_config__
    assert config.tag == tag  # an explicit string tag, not the class name
    assert config.tag_field == "type"
    assert config.frozen
    params = inspect.signature(cls).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert not config.forbid_unknown_fields


@pytest.mark.parametrize("tag", sorted(CALL_FACTS))
def test_facts_of_a_call_require_an_execution(tag: str) -> None:
    fields = {f.name: f for f in msgspec.structs.fields(EVENT_CLASSES[tag])}
    assert fields["execution"].type is Execution
    assert fields["execution"].required


@pytest.mark.parametrize("tag", sorted(set(EVENT_CLASSES) - CALL_FACTS))
def test_other_events_may_carry_an_execution_or_none(tag: str) -> None:
    fields = {f.name: f for f in msgspec.structs.fields(EVENT_CLASSES[tag])}
    if "execution" in fields:
        assert fields["execution"].type == Execution | None
        assert not fields["execution"].required


def test_event_type_refuses_the_base_class() -> None:
    with pytest.raises(TypeError):
        event_type(Event)


def test_record_type_property() -> None:
    event = AgentEnd(ok=False, reason="max_turns")
    assert event.record_type == "agent_end"


def test_time_defaults_to_now_in_record_format() -> None:
    event = AgentEnd()
    assert is_time(event.time)
    assert event.time <= now()


def test_events_are_frozen() -> None:
    event = AgentEnd()
    with pytest.raises(AttributeError):
        event.ok = False  # type: ignore[misc]


def test_execution_defaults_and_next_attempt() -> None:
    execution = Execution(id="m1", kind="model")
    assert execution.attempt == 1
    assert execution.parent_id is None
    assert execution.turn_index is None
    retried = execution.next_attempt()
    assert retried == Execution(id="m1", kind="model", attempt=2)
    assert execution.attempt == 1


def test_execution_attempt_starts_at_one() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": "m1", "kind": "model", "attempt": 0}, Execution)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": "m1", "kind": "robot"}, Execution)


def test_model_exec_end_ok() -> None:
    execution = Execution(id="m1", kind="model")
    assert ModelExecEnd(execution=execution, message=AssistantMessage()).ok
    assert not ModelExecEnd(execution=execution, error="overloaded").ok


def test_message_and_part_tags() -> None:
    def tag(cls: type[msgspec.Struct]) -> object:
        return cls.__struct_config__.tag

    messages = ["user", "assistant", "tool_result", "system"]
    assert [tag(c) for c in typing.get_args(ChatMessage)] == messages
    parts = ["text", "thinking", "tool_call", "image", "file"]
    assert [tag(c) for c in typing.get_args(Part)] == parts
    for cls in (*typing.get_args(ChatMessage), *typing.get_args(Part)):
        assert cls.__struct_config__.tag_field == "$type"


def test_messages_encode_natively_with_their_type_key() -> None:
    message = AssistantMessage(content=[TextPart(text="hi")], model="m", stop_reason="stop")
    encoded = msgspec.json.encode(message)
    assert encoded.startswith(b'{"$type":"assistant","content":[{"$type":"text","text":"hi"}]')
    assert msgspec.json.decode(encoded, type=ChatMessage) == message


def test_user_message_content_may_be_a_string_or_parts() -> None:
    for content in ("hello", [TextPart(text="hello"), ImagePart(media_type="image/png", data="")]):
        message = UserMessage(content=content)
        assert msgspec.json.decode(msgspec.json.encode(message), type=UserMessage) == message


def test_tool_exec_end_defaults() -> None:
    event = ToolExecEnd(execution=Execution(id="t1", kind="tool"), tool_call_id="c1", name="ls")
    assert event.disposition == "ran"
    assert not event.is_error
    assert event.content == []


def test_every_event_constructs_from_required_fields_only() -> None:
    for cls in EVENT_CLASSES.values():
        required = {f.name: SAMPLES[f.type] for f in msgspec.structs.fields(cls) if f.required}
        event = cls(**required)
        assert is_time(event.time)


SAMPLES: dict[Any, Any] = {
    Execution: Execution(id="x1", kind="tool"),
    str: "x",
    Any: None,
}

# --- strategies ---------------------------------------------------------------------------

# Keys avoid the credential names the codec removes and the "$type" key it reserves.
keys = st.text(max_size=12).filter(lambda k: not is_credential_key(k) and k != "$type")

# Text: any unicode (newlines, NUL, \r, U+2028 included), empty, and now and then large.
texts = st.one_of(
    st.text(),
    st.just(""),
    st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=4), st.integers(1000, 50_000)),
)
floats = st.floats(allow_nan=False, allow_infinity=False)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | floats | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(keys, json_values, max_size=4)

executions = st.builds(
    Execution,
    id=texts,
    kind=st.sampled_from(["model", "tool", "compaction"]),
    attempt=st.integers(1, 2**31),
    parent_id=st.none() | texts,
    turn_index=st.none() | st.integers(0, 10_000),
)
usages = st.builds(
    Usage,
    input_tokens=st.integers(0, 2**40),
    output_tokens=st.integers(0, 2**40),
    cache_read_tokens=st.integers(0, 2**40),
    cache_write_tokens=st.integers(0, 2**40),
    cost=st.none() | floats,
)
parts: st.SearchStrategy[Any] = st.one_of(
    st.builds(TextPart, text=texts),
    st.builds(ThinkingPart, thinking=texts, signature=st.none() | texts, redacted=st.booleans()),
    st.builds(ToolCallPart, id=texts, name=texts, arguments=json_objects),
    st.builds(ImagePart, media_type=st.just("image/png"), data=texts),
    st.builds(
        FilePart,
        media_type=st.just("application/pdf"),
        data=texts,
        name=st.none() | texts,
        file_id=st.none() | texts,
    ),
)
messages: st.SearchStrategy[Any] = st.one_of(
    st.builds(UserMessage, content=texts | st.lists(parts, max_size=3)),
    st.builds(SystemMessage, content=texts | st.lists(parts, max_size=3)),
    st.builds(
        AssistantMessage,
        content=st.lists(parts, max_size=3),
        model=st.none() | texts,
        provider=st.none() | texts,
        stop_reason=st.none() | st.sampled_from(["stop", "length", "tool_use"]),
        response_id=st.none() | texts,
    ),
    st.builds(
        ToolResultMessage,
        tool_call_id=texts,
        name=texts,
        content=st.lists(parts, max_size=3),
        is_error=st.booleans(),
    ),
)
# Where a message, result or detail goes: messages, parts or plain JSON.
free_values = st.one_of(json_values, messages, parts)
tool_declarations = st.builds(
    ToolDeclaration, name=texts, description=texts, parameters=json_objects
)
call_configs = st.builds(
    CallConfig,
    model=texts,
    provider=st.none() | texts,
    temperature=st.none() | floats,
    max_tokens=st.none() | st.integers(0, 2**31),
    top_p=st.none() | floats,
    stop=st.lists(texts, max_size=3),
    extra=json_objects,
)

_BY_TYPE: dict[Any, st.SearchStrategy[Any]] = {
    str: texts,
    int: st.integers(-(2**63), 2**64 - 1),
    float: floats,
    bool: st.booleans(),
    Any: free_values,
    Execution: executions,
    Usage: usages,
    CallConfig: call_configs,
    ToolDeclaration: tool_declarations,
}


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy for a value of an event field's declared type."""
    if tp in _BY_TYPE:
        return _BY_TYPE[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([st.none() if a is type(None) else strategy_for(a) for a in args])
    if origin is list:
        return st.lists(strategy_for(args[0]), max_size=4)
    if origin is dict:
        return st.dictionaries(keys, strategy_for(args[1]), max_size=4)
    raise AssertionError(f"no strategy for {tp!r}")


times = st.datetimes(
    min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
).map(format_time)


def events_of(cls: type[Event]) -> st.SearchStrategy[Event]:
    fields = {f.name: strategy_for(f.type) for f in msgspec.structs.fields(cls) if f.name != "time"}
    return st.builds(cls, time=times, **fields)


# --- through the whole pipeline -------------------------------------------------------------


def write_file(*items: tuple[str, bytes, str]) -> tuple[str, bytes]:
    """A session file with one run holding the given (type, data, time) facts."""
    session_id, run_id = new_id(), new_id()
    header = msgspec.json.encode(SessionStartData(meta={"app": "tests"}))
    lines = [
        Record(
            session_id=session_id, seq=1, type="session_start", time=now(), data=msgspec.Raw(header)
        ),
        Record(
            session_id=session_id,
            seq=2,
            type="run_start",
            time=now(),
            run_id=run_id,
            data=msgspec.Raw(b'{"pid":1,"client":"tests"}'),
        ),
    ]
    for type_, data, time in items:
        lines.append(
            Record(
                session_id=session_id,
                seq=len(lines) + 1,
                type=type_,
                time=time,
                run_id=run_id,
                data=msgspec.Raw(data),
            )
        )
    return session_id, b"".join(encode_line(record) for record in lines)


def round_trip(event: Event, codec: Codec = default_codec) -> Event | None:
    encoded = codec.encode_event(event)
    if encoded is None:
        return None
    assert encoded.type == event_type(type(event))
    assert encoded.time == event.time
    decoded_data = msgspec.json.decode(encoded.data)
    assert isinstance(decoded_data, dict)
    assert "type" not in decoded_data
    assert "time" not in decoded_data
    session_id, content = write_file((encoded.type, encoded.data, encoded.time))
    assert content.count(b"\n") == 3  # nothing in the event breaks the line rule
    assert b"\r" not in content
    records = list(Reader(io.BytesIO(content)))
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[-1].session_id == session_id
    return codec.decode_event(records[-1])


def expected_after_writing(event: Event) -> Event:
    if isinstance(event, ModelResponse):  # written without its message
        return msgspec.structs.replace(event, message=None)
    return event


@pytest.mark.parametrize("tag", sorted(AGENT_FACT_TYPES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_recorded_event_round_trips_and_takes_the_fast_path_to_the_same_bytes(
    tag: str, data: st.DataObject
) -> None:
    """Both checks on each event drawn (drawing is most of their time): the codec's fast
    path writes what the careful walk writes, and the event reads back as written."""
    from flightlog.protocol._lowering import Lowering
    from flightlog.protocol._shapes import _BUILTIN_SHAPES, _EVENT_SHAPES
    from flightlog.protocol._values import _Walk

    event = data.draw(events_of(EVENT_CLASSES[tag]))
    shape = _EVENT_SHAPES[type(event)]
    fast = default_codec._encode_fast(event, shape)
    if fast is not None:
        assert fast == Lowering(_BUILTIN_SHAPES).encode_careful(event, shape, _Walk())
    decoded = round_trip(event)
    if isinstance(event, ModelResponse) and event.length_recovery is None:
        assert decoded is None
        return
    assert decoded == expected_after_writing(event)
    assert type(decoded) is type(event)


@pytest.mark.parametrize("tag", sorted(NEVER_WRITTEN_TYPES))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_never_written_events_encode_to_none(tag: str, data: st.DataObject) -> None:
    event = data.draw(events_of(EVENT_CLASSES[tag]))
    assert default_codec.encode_event(event) is None


def test_a_realistic_loop_round_trips_in_one_file() -> None:
    model = Execution(id="m1", kind="model", turn_index=0)
    tool = Execution(id="t1", kind="tool", parent_id="m1", turn_index=0)
    reply = AssistantMessage(
        content=[
            ThinkingPart(thinking="list it", signature="sig"),
            ToolCallPart(id="call_1", name="ls", arguments={"path": "/"}),
        ],
        model="claude-x",
        stop_reason="tool_use",
    )
    result = ToolResultMessage(tool_call_id="call_1", name="ls", content=[TextPart(text="etc")])
    events: list[Event] = [
        EVENT_CLASSES["agent_start"](agent="demo", messages=[UserMessage(content="ls /")]),
        EVENT_CLASSES["turn_start"](turn_index=0),
        ModelRequest(
            execution=model,
            messages=[UserMessage(content="ls /")],
            tools=[ToolDeclaration(name="ls", parameters={"type": "object"})],
            config=CallConfig(model="claude-x", max_tokens=1024, extra={"api_key": "sk-1"}),
            headers={"Authorization": "Bearer sk-1", "anthropic-version": "2023-06-01"},
        ),
        EVENT_CLASSES["model_exec_start"](execution=model, model="claude-x"),
        EVENT_CLASSES["message_start"](execution=model, message=AssistantMessage()),
        EVENT_CLASSES["message_update"](execution=model, message=reply, delta="ls"),
        ModelExecEnd(execution=model, message=reply, usage=Usage(input_tokens=10)),
        MessageEnd(execution=model, message=reply),
        EVENT_CLASSES["tool_queued"](execution=tool, tool_call_id="call_1", name="ls"),
        EVENT_CLASSES["tool_exec_start"](execution=tool, tool_call_id="call_1", name="ls"),
        EVENT_CLASSES["tool_invoke_start"](
            execution=tool, tool_call_id="call_1", name="ls", arguments={"path": "/"}
        ),
        EVENT_CLASSES["tool_exec_update"](execution=tool, tool_call_id="call_1", name="ls"),
        EVENT_CLASSES["tool_invoke_end"](
            execution=tool, tool_call_id="call_1", name="ls", content=result.content
        ),
        ToolExecEnd(execution=tool, tool_call_id="call_1", name="ls", content=result.content),
        MessageEnd(message=result),
        ContextCompacted(
            execution=Execution(id="c1", kind="compaction"),
            summary=UserMessage(content="summary"),
            compacted_count=4,
        ),
        EVENT_CLASSES["turn_end"](turn_index=0, message_count=2, tool_call_count=1),
        AgentEnd(ok=True, reason="completed", turns=1),
    ]
    encoded = [e for e in map(default_codec.encode_event, events) if e is not None]
    assert len(encoded) == len(events) - 3  # message_start, message_update, tool_exec_update
    _, content = write_file(*((e.type, e.data, e.time) for e in encoded))
    assert b"sk-1" not in content
    assert b"2023-06-01" in content
    decoded = [default_codec.decode_event(r) for r in list(Reader(io.BytesIO(content)))[2:]]
    assert [event_type(type(e)) for e in decoded] == [e.type for e in encoded]
    request = decoded[2]
    assert isinstance(request, ModelRequest)
    assert request.config is not None
    assert request.config.extra == {}
    assert request.headers == {"anthropic-version": "2023-06-01"}
    assert decoded[4] == events[6]  # model_exec_end, the reply restored as typed parts


# --- the codec's fast path writes what the careful walk writes ------------------------------
# (on random events of every type: test_every_recorded_event_round_trips_and_...)


def test_plain_events_take_the_fast_path_and_typed_values_do_not() -> None:
    from flightlog.protocol._shapes import _EVENT_SHAPES
    from flightlog.protocol.events import (
        ToolExecStart,
        UserMessage,
    )

    shape = _EVENT_SHAPES[ToolExecStart]
    execution = Execution(id="t1", kind="tool", turn_index=0)
    plain = ToolExecStart(
        execution=execution, tool_call_id="c", name="n", arguments={"q": [1, 2.5, None, "é"]}
    )
    assert default_codec._encode_fast(plain, shape) is not None
    typed = ToolExecStart(
        execution=execution, tool_call_id="c", name="n", arguments={"m": UserMessage(content="x")}
    )
    assert default_codec._encode_fast(typed, shape) is None
    assert b'"$type":"user"' in default_codec.encode_event(typed).data  # type: ignore[union-attr]


def test_the_fast_path_still_refuses_fields_of_the_wrong_type() -> None:
    from flightlog.protocol import (
        RecordingError,
    )
    from flightlog.protocol.events import (
        ToolExecStart,
    )

    wrong = ToolExecStart(
        execution=Execution(id="t1", kind="tool", attempt=0), tool_call_id="c", name="n"
    )
    with pytest.raises(RecordingError) as caught:
        default_codec.encode_event(wrong)
    assert caught.value.code == "bad_event"
    assert "attempt" in caught.value.message


def test_new_execution_ids_are_fresh_hex() -> None:
    ids = {new_execution_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
