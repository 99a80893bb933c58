"""Every wire message round-trips through frames, whatever its field values."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings

from flightlog.protocol.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    ClientMessage,
    Message,
    RecordEvent,
    ServerMessage,
    TailBatch,
    client_decoder,
    encode_frame,
    server_decoder,
)

CLIENT_TYPES: list[type[Message]] = list(ClientMessage.__args__)
SERVER_TYPES: list[type[Message]] = list(ServerMessage.__args__)

_json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _strategy(info: mi.Type) -> st.SearchStrategy[Any]:
    """A strategy for any value of a msgspec type, from its type info."""
    match info:
        case mi.IntType():
            return st.integers(-(2**63), 2**64 - 1)
        case mi.FloatType():
            return st.floats(allow_nan=False)
        case mi.StrType():
            return st.text()
        case mi.BytesType():
            return st.binary(max_size=2048)
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.AnyType():
            return _json
        case mi.ListType(item_type=item):
            return st.lists(_strategy(item), max_size=5)
        case mi.DictType(key_type=key, value_type=value):
            return st.dictionaries(_strategy(key), _strategy(value), max_size=5)
        case mi.UnionType(types=types):
            return st.one_of([_strategy(t) for t in types])
        case mi.StructType(cls=cls, fields=fields):
            return st.builds(cls, **{f.name: _strategy(f.type) for f in fields})
    raise AssertionError(f"no strategy for {info}")


def _messages(types: list[type[Message]]) -> st.SearchStrategy[Message]:
    return st.one_of([_strategy(mi.type_info(t)) for t in types])


@settings(max_examples=300, deadline=None)
@given(_messages(CLIENT_TYPES))
def test_client_messages_round_trip(message: Message) -> None:
    decoder = server_decoder()
    decoder.feed(encode_frame(message))
    assert decoder.next_message() == message
    assert decoder.next_message() is None
    assert decoder.buffered == 0


@settings(max_examples=300, deadline=None)
@given(_messages(SERVER_TYPES))
def test_server_messages_round_trip(message: Message) -> None:
    decoder = client_decoder()
    decoder.feed(encode_frame(message))
    assert decoder.next_message() == message


@pytest.mark.parametrize("cls", CLIENT_TYPES + SERVER_TYPES, ids=lambda c: c.__name__)
def test_every_message_has_an_explicit_unique_tag(cls: type[Message]) -> None:
    config = cls.__struct_config__
    assert config.tag_field == "type"
    assert isinstance(config.tag, str)
    assert config.frozen
    tags = [t.__struct_config__.tag for t in CLIENT_TYPES + SERVER_TYPES]
    assert tags.count(config.tag) == 1


@pytest.mark.parametrize("cls", CLIENT_TYPES + SERVER_TYPES, ids=lambda c: c.__name__)
def test_no_message_forbids_unknown_fields(cls: type[Message]) -> None:
    # Older peers must skip the fields newer ones add.
    assert not cls.__struct_config__.forbid_unknown_fields


def test_a_newer_peers_extra_fields_are_skipped() -> None:
    newer = msgspec.msgpack.encode(
        {"type": "ack", "id": 3, "seq": 9, "added_in_version_2": [1, 2, 3]}
    )
    decoder = client_decoder()
    decoder.feed(len(newer).to_bytes(4, "big") + newer)
    message = decoder.next_message()
    assert message is not None and message.id == 3 and message.seq == 9


def test_versions() -> None:
    assert PROTOCOL_VERSION in SUPPORTED_VERSIONS
    assert DEFAULT_MAX_FRAME_SIZE == 16 * 1024 * 1024


def test_json_payloads_travel_as_msgpack_bin() -> None:
    # JSON stays JSON: a record's data is carried as bytes, never as a decoded value.
    record = RecordEvent(
        session_id="a" * 32, run_id="b" * 32, event_type="turn_start", time="t", data=b'{"x":1}'
    )
    raw = msgspec.msgpack.decode(encode_frame(record)[4:])
    assert raw["data"] == b'{"x":1}'
    batch = msgspec.msgpack.decode(encode_frame(TailBatch(subscription=1, lines=[b"{}"]))[4:])
    assert batch["lines"] == [b"{}"]
