"""The client's C path (flightlog.protocol._sender) against the Python it replaces.

``encode_record`` must make msgspec's frame byte for byte, or say None (and then
``FrameEncoder.encode_record`` raises what ``encode`` raises); the C ``RingWriter``
must answer every call as the Python one does, and leave the same bytes in the ring,
whatever the daemon's side writes in the ring's header, whenever.
Both sides run the same input; C must also take the common case, or it is dead weight.
"""

from __future__ import annotations

import importlib.util
import itertools
import mmap
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import example, given

from flightlog.protocol import (
    LocalProtocolError,
    RemoteProtocolError,
    _accel,
    _ring,
)
from flightlog.protocol.ring import (
    RING_HEADER,
    RingReader,
    RingWriter,
    ring_writer,
)
from flightlog.protocol.wire import (
    FrameEncoder,
    RecordEvent,
    encode_frame,
)

pytestmark = pytest.mark.skipif(_accel.encode_record is None, reason="the C accelerator is off")

# Lengths where msgpack's str and bin headers change form.
_EDGES = [0, 1, 31, 32, 255, 256, 65535, 65536]


def _frame(fields: tuple[str, str, str, str], data: bytes) -> bytes:
    """msgspec's frame of the RecordEvent of ``fields`` (session, run, type, time)."""
    session_id, run_id, event_type, time = fields
    return encode_frame(
        RecordEvent(
            session_id=session_id, run_id=run_id, event_type=event_type, time=time, data=data
        )
    )


def _text(length: int) -> str:
    """``length`` UTF-8 bytes, two of them one character when there is room."""
    return "ü" + "x" * (length - 2) if length >= 2 else "x" * length


@given(
    session_id=st.text(max_size=40),
    run_id=st.text(max_size=300),
    event_type=st.text(max_size=40),
    time=st.text(max_size=40),
    data=st.binary(max_size=600),
)
@example("s" * 32, "r" * 32, "tool_exec_start", "2026-12-02T03:00:00.000000Z", b'{"a":1}')
def test_a_record_frame_is_msgspecs_to_the_byte(
    session_id: str, run_id: str, event_type: str, time: str, data: bytes
) -> None:
    expected = encode_frame(
        RecordEvent(
            session_id=session_id, run_id=run_id, event_type=event_type, time=time, data=data
        )
    )
    made = _accel.encode_record(session_id, run_id, event_type, time, data, 2**32)
    if made is None:
        # Only a string that is not UTF-8 (a lone surrogate) makes C unsure.
        assert any("\ud800" <= c <= "\udfff" for c in session_id + run_id + event_type + time)
    else:
        assert made == expected


@pytest.mark.parametrize("length", [*_EDGES, 70_000])
def test_every_header_form_of_a_str_and_of_bin(length: int) -> None:
    text, data = _text(length), b"d" * length
    for fields in [(text, "r", "t", "z"), ("s", text, "t", "z"), ("s", "r", text, "z")]:
        message = RecordEvent(
            session_id=fields[0], run_id=fields[1], event_type=fields[2], time=fields[3], data=data
        )
        assert _accel.encode_record(*fields, data, 2**32) == encode_frame(message)


def test_the_frame_limit_is_the_python_encoders() -> None:
    fields = ("s" * 32, "r" * 32, "tool_exec_start", "2026-12-02T03:00:00.000000Z")
    data = b'{"text":"' + b"x" * 1000 + b'"}'
    body = len(_frame(fields, data)) - 4
    assert _accel.encode_record(*fields, data, body) is not None
    assert _accel.encode_record(*fields, data, body - 1) is None
    with pytest.raises(LocalProtocolError) as raised:
        FrameEncoder(body - 1).encode_record(*fields, data)
    assert raised.value.code == "frame_too_large"


@pytest.mark.parametrize(
    "args",
    [
        ("s", "r", "t", "z", bytearray(b"{}")),  # not bytes: the Python encoder decides
        ("s", "r", "t", "\ud800", b"{}"),  # not UTF-8
        (1, "r", "t", "z", b"{}"),
    ],
)
def test_c_is_unsure_of_what_it_does_not_handle(args: tuple[Any, ...]) -> None:
    assert _accel.encode_record(*args, 2**32) is None


@pytest.mark.parametrize("limit", [2**64, -1])
def test_a_limit_c_cannot_hold_is_left_to_the_python_encoder(limit: int) -> None:
    """A peer may announce any frame limit: C says None, the Python encoder decides."""
    fields = ("s", "r", "tool_exec_start", "2026-12-02T03:00:00.000000Z")
    assert _accel.encode_record(*fields, b"{}", limit) is None
    expected = _frame(fields, b"{}")
    if limit > 0:
        assert FrameEncoder(limit).encode_record(*fields, b"{}") == expected
    else:
        with pytest.raises(LocalProtocolError):
            FrameEncoder(limit).encode_record(*fields, b"{}")


# ------------------------------------------------------------------ the ring writer
#
# The daemon writes ``head`` and ``asleep`` (and laid out ``magic`` and ``size``); a
# hostile or broken one may write any word at any moment.  The C writer must then do
# exactly what the Python one does (the same answer, or the same error type and
# message, and the same bytes in the ring), and neither may ever copy outside the data
# area.  Hypothesis rewrites every header word between calls, with random and edge
# values; a second process rewrites ``head`` while the writer runs, which only shared
# memory lets happen in the middle of a C call.  tests/protocol/test_sanitizers.py
# runs this file again with the C built under AddressSanitizer and UBSan.

SIZE = 64
# Bytes past the ring's end in each buffer, which no writer may touch.
GUARD = 64
_FILL = 0xA5
# Word indexes of the header's fields (flightlog.protocol._ring's layout).
_WORDS = {"magic": 0, "size": 1, "head": 8, "tail": 16, "waiting": 17, "asleep": 24}
_TOP = 2**64 - 1
_EDGES = [0, 1, SIZE - 1, SIZE, SIZE + 1, 2**31, 2**32, 2**63 - 1, 2**63, _TOP - SIZE, _TOP]

# A header word's new value: absolute, or near the writer's tail (``("near", delta)``),
# where a head is almost right.
_values = st.one_of(
    st.sampled_from(_EDGES),
    st.integers(0, _TOP),
    st.tuples(st.just("near"), st.integers(-3 * SIZE, 3 * SIZE)),
)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.binary(min_size=1, max_size=3 * SIZE)),
        st.tuples(st.just("take"), st.integers(1, 2 * SIZE)),
        st.tuples(st.sampled_from(["sleep", "wake", "hang_up", "wait", "waited"]), st.none()),
        st.tuples(st.sampled_from(["room", "poke_due"]), st.none()),
        st.tuples(st.just("set"), st.tuples(st.sampled_from(sorted(_WORDS)), _values)),
    ),
    max_size=60,
)


class _Side:
    """One writer (Python's, or C's) and a reader over a buffer of their own, with a
    guard after it."""

    def __init__(self, c: bool) -> None:
        lock = self.lay_out()
        self.writer: Any = _accel.CRingWriter(self.buf) if c else RingWriter(self.buf, lock)

    def lay_out(self) -> threading.Lock:
        """The buffer, the guard and the reader; the lock the writer is to take."""
        self.whole = bytearray([_FILL]) * (RING_HEADER + SIZE + GUARD)
        self.buf = memoryview(self.whole)[: RING_HEADER + SIZE]
        self.words = self.buf[:RING_HEADER].cast("Q")
        self.buf[:] = bytes(RING_HEADER + SIZE)
        lock = threading.Lock()
        self.reader = RingReader(self.buf, SIZE, lock)
        self.out = bytearray()
        self.tail = 0  # what the writer published, as it said
        return lock

    def step(self, name: str, arg: Any) -> object:
        if name == "set":
            word, value = arg
            if isinstance(value, tuple):
                value = (self.tail + value[1]) % 2**64
            self.words[_WORDS[word]] = value
            return None
        if name == "write":
            taken, poke = self.writer.write(arg)
            assert 0 <= taken <= len(arg)
            self.tail += taken
            return taken, poke
        if name == "take":
            return self.reader.take(self.out.extend, arg)
        if name in ("sleep", "wake", "hang_up"):
            return getattr(self.reader, name)()
        if name == "room":
            return self.writer.room
        return getattr(self.writer, name)()

    def outcome(self, name: str, arg: Any) -> object:
        """The step's answer, or its error's type, code and message."""
        try:
            return self.step(name, arg)
        except (RemoteProtocolError, ValueError) as exc:
            return type(exc), getattr(exc, "code", None), str(exc)

    def guard_intact(self) -> bool:
        return self.whole[RING_HEADER + SIZE :] == bytes([_FILL]) * GUARD


@given(_steps)
@example([("write", b"x" * 10), ("set", ("head", _TOP)), ("write", b"y" * 60)])
@example([("write", b"x" * SIZE), ("set", ("head", ("near", 1))), ("write", b"y")])
@example([("write", b"x" * 40), ("take", 20), ("set", ("head", 10)), ("room", None)])
@example([("set", ("head", ("near", -SIZE - 1))), ("write", b"y" * 2 * SIZE), ("wait", None)])
@example([("write", b"x" * 3), ("set", ("asleep", _TOP)), ("write", b"y"), ("poke_due", None)])
def test_the_c_writer_answers_hostile_headers_as_the_python_one(
    steps: list[tuple[str, Any]],
) -> None:
    python, c = _Side(c=False), _Side(c=True)
    for name, arg in steps:
        expected = python.outcome(name, arg)
        assert c.outcome(name, arg) == expected, (name, arg)
        assert bytes(c.buf) == bytes(python.buf)
        assert c.guard_intact() and python.guard_intact()
        assert 0 <= python.writer._tail - python.writer._head <= SIZE
    assert c.out == python.out


def test_a_head_out_of_reach_raises_and_writes_nothing() -> None:
    """The adversarial review's case: a head far behind made C's room exceed the ring
    and its copy run past the mapping."""
    for c in (False, True):
        side = _Side(c)
        assert side.step("write", b"x" * 10) == (10, False)
        before = bytes(side.buf)
        for head in (_TOP, 11, 2**63, SIZE + 10):
            side.words[8] = head
            with pytest.raises(RemoteProtocolError) as raised:
                side.writer.write(b"y" * SIZE)
            assert raised.value.code == "bad_message"
            assert "head" in raised.value.message
            side.words[8] = head
            assert bytes(side.buf[RING_HEADER:]) == before[RING_HEADER:]
            with pytest.raises(RemoteProtocolError):
                assert side.writer.room
            with pytest.raises(RemoteProtocolError):
                side.writer.wait()
        side.words[8] = 10  # a head the daemon may write: all is well again
        assert side.writer.write(b"z" * SIZE) == (SIZE, False)
        assert side.guard_intact()


_field_values = st.one_of(st.sampled_from(_EDGES), st.integers(0, _TOP))


@given(
    magic=st.one_of(st.just(int.from_bytes(b"flightlo", "little")), _field_values),
    size=st.one_of(st.just(SIZE), _field_values),
    head=st.one_of(st.just(0), _field_values),
    tail=st.one_of(st.just(0), _field_values),
)
def test_a_ring_handed_over_with_any_header_is_taken_alike(
    magic: int, size: int, head: int, tail: int
) -> None:
    """A writer takes only a new ring: the magic, the size its mapping holds, head and
    tail 0; C refuses what Python refuses, with the same message."""
    outcomes = []
    for c in (False, True):
        buf = memoryview(bytearray(RING_HEADER + SIZE))
        words = buf[:RING_HEADER].cast("Q")
        words[0], words[1], words[8], words[16] = magic, size, head, tail
        try:
            writer: Any = _accel.CRingWriter(buf) if c else RingWriter(buf, threading.Lock())
        except ValueError as exc:
            outcomes.append(str(exc))
        else:
            outcomes.append(writer.size)
            assert writer.room == SIZE
    assert outcomes[0] == outcomes[1]


# A daemon's side in another process: rewrites head while the writer runs, mostly
# near the published tail (a head that is nearly right), sometimes anything, until
# the word at STOP is set.  Its argv: the memfd, the ring's size.
_RACER = """
import mmap, os, random, sys
fd, size = int(sys.argv[1]), int(sys.argv[2])
m = mmap.mmap(fd, os.fstat(fd).st_size)
words = memoryview(m).cast("Q")
stop = len(words) - 1
words[stop - 1] = 1
rng = random.Random(27)
top = 2**64 - 1
while not words[stop]:
    tail = words[16]
    if rng.random() < 0.1:
        words[8] = rng.choice([0, top, rng.randrange(top)])
    else:
        words[8] = (tail - rng.randrange(-size, 2 * size)) % 2**64
"""


@pytest.mark.parametrize("c", [False, True], ids=["python", "c"])
def test_a_head_rewritten_during_the_writes_never_leads_outside_the_ring(c: bool) -> None:
    size = 4096
    fd = os.memfd_create("hostile-ring")
    length = 2 * mmap.PAGESIZE + RING_HEADER + size
    os.ftruncate(fd, length)
    mapping = mmap.mmap(fd, length)
    whole = memoryview(mapping)
    words = whole.cast("Q")
    stop = len(words) - 1
    ring = whole[: RING_HEADER + size]
    guard = bytes([_FILL]) * (length - RING_HEADER - size - 16)
    whole[RING_HEADER + size : length - 16] = guard
    RingReader(ring, size, threading.Lock())
    writer: Any = _accel.CRingWriter(ring) if c else RingWriter(ring, threading.Lock())
    racer = subprocess.Popen(
        [sys.executable, "-c", _RACER, str(fd), str(size)], pass_fds=[fd], close_fds=True
    )
    try:
        while not words[stop - 1]:  # the racer runs
            assert racer.poll() is None, "the racer died"
            os.sched_yield()
        errors = published = 0
        data = b"r" * (3 * size)
        # Until the racer broke the header and let writes through, both many times
        # (bounded, should it be starved of a core throughout).
        for i in itertools.count():
            if (i >= 5_000 and errors > 20 and published > 20 * size) or i >= 2_000_000:
                break
            try:
                if i % 3 == 2:
                    room = writer.wait()
                    writer.waited()
                    assert 0 <= room <= size
                else:
                    taken, _ = writer.write(data[: 1 + i % len(data)])
                    assert 0 <= taken <= size
                    published += taken
            except RemoteProtocolError as exc:
                assert exc.code == "bad_message"
                errors += 1
        assert errors > 20 and published > 20 * size
        assert words[16] == published  # the tail is the writer's own
    finally:
        words[stop] = 1
        racer.wait(timeout=30)
    assert racer.returncode == 0
    assert bytes(whole[RING_HEADER + size : length - 16]) == guard
    writer.release()
    ring.release()
    words.release()
    whole.release()
    mapping.close()
    os.close(fd)


def test_the_ring_writer_is_the_c_one_where_built() -> None:
    buf = memoryview(bytearray(RING_HEADER + SIZE))
    RingReader(buf, SIZE, threading.Lock())
    writer = ring_writer(buf, threading.Lock())
    assert isinstance(writer, _accel.CRingWriter)
    assert writer.size == SIZE


def test_the_c_writer_refuses_what_is_no_ring_and_lets_go_of_the_mapping() -> None:
    with pytest.raises(ValueError):
        _accel.CRingWriter(memoryview(bytearray(RING_HEADER + SIZE)))  # no magic
    with pytest.raises(ValueError):
        _accel.CRingWriter(memoryview(bytearray(10)))
    buf = bytearray(RING_HEADER + SIZE)
    RingReader(memoryview(buf), SIZE, threading.Lock())
    writer = _accel.CRingWriter(buf)
    with pytest.raises(BufferError):
        buf.append(0)  # exported: the writer holds it
    writer.release()
    buf.append(0)
    with pytest.raises(ValueError):
        writer.write(b"x")  # as a released memoryview: the transport's "closed"


# ------------------------------------------------ a header rewritten between any two loads
#
# A daemon's side may rewrite a word between any two loads of it, also within one call
# (test_a_head_rewritten_during_the_writes_never_leads_outside_the_ring races it, but
# a race between two loads nanoseconds apart is rarely won).  Here every load has a
# value of its own: the C writer built with FLIGHTLOG_RING_SCRIPT takes each load of
# a header word from a script (the sanitizers' build is one too), and the Python
# writer reads through words that do the same.  Hypothesis writes the scripts (the
# ring as handed over, then values for each call's loads of ``head`` and ``asleep``);
# both writers must make the same loads in the same order, give the same answers and
# leave the same bytes, and neither may write outside the ring.  A writer that loaded
# ``head`` twice in a call (one load checked, another used) differs in its loads at the
# first call that reads it, whatever values the loads see.

_SOURCE = Path(__file__).resolve().parents[2] / "protocol/src/flightlog/protocol/_sender.c"


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``_sender`` built with FLIGHTLOG_RING_SCRIPT: the one imported when it is (the
    sanitizers' build), else one compiled here."""
    from flightlog.protocol import _sender

    if hasattr(_sender, "script"):
        return _sender
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is absent: the scripted build needs it")
    target = (
        tmp_path_factory.mktemp("scripted") / f"_sender{sysconfig.get_config_var('EXT_SUFFIX')}"
    )
    include = f"-I{sysconfig.get_paths()['include']}"
    command = [gcc, "-shared", "-fPIC", "-O2", "-DFLIGHTLOG_RING_SCRIPT", include]
    subprocess.run([*command, str(_SOURCE), "-o", str(target)], check=True, timeout=300)
    spec = importlib.util.spec_from_file_location("flightlog.protocol._sender", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _ScriptedWords:
    """The Python writer's view of the header, whose loads take a script's values as
    the C writer's do (and are traced)."""

    def __init__(self, words: memoryview) -> None:
        self.words = words
        self.scripts: dict[int, list[int]] = {}
        self.trace: list[int] = []

    def __getitem__(self, index: int) -> int:
        self.trace.append(index)
        if self.scripts.get(index):
            self.words[index] = self.scripts[index].pop(0)
        return int(self.words[index])

    def __setitem__(self, index: int, value: int) -> None:
        self.words[index] = value

    def release(self) -> None:
        self.words.release()


class _ScriptedSide(_Side):
    """A side whose writer's loads of header words follow scripts: the C writer of
    ``module``, or (None) the Python one."""

    def __init__(self, module: Any, scripts: dict[int, list[int]]) -> None:
        self.module = module
        lock = self.lay_out()
        self.proxy = _ScriptedWords(self.buf[:RING_HEADER].cast("Q"))

        def make() -> Any:
            if module is not None:
                return module.RingWriter(self.buf)
            with mock.patch.object(_ring, "_words", lambda buf: self.proxy):
                return RingWriter(self.buf, lock)

        made, self.made_loads = self.loads(scripts, make)
        self.writer: Any = None
        if isinstance(made, tuple):  # refused: its error
            self.made: object = made
        else:
            self.writer, self.made = made, made.size

    def loads(self, scripts: dict[int, list[int]], call: Any) -> tuple[object, list[int]]:
        """``call()``'s answer (or error) with the writer's loads following
        ``scripts``, and the words it loaded, in order."""
        if self.module is None:
            self.proxy.scripts = {word: list(values) for word, values in scripts.items()}
            self.proxy.trace = []
            answer = _answer(call)
            self.proxy.scripts = {}
            return answer, self.proxy.trace
        self.module.script(scripts)
        try:
            answer = _answer(call)
            return answer, self.module.trace()
        finally:
            self.module.script(None)

    def scripted_step(
        self, name: str, arg: Any, scripts: dict[str, list[Any]]
    ) -> tuple[object, list[int]]:
        """A step whose loads of ``head`` and ``asleep`` take ``scripts``' values
        (``("near", delta)``: that far from the tail published)."""
        values = {
            _WORDS[word]: [
                (self.tail + v[1]) % 2**64 if isinstance(v, tuple) else v for v in script
            ]
            for word, script in scripts.items()
        }
        return self.loads(values, lambda: self.step(name, arg))


def _answer(call: Any) -> object:
    try:
        return call()
    except (RemoteProtocolError, ValueError) as exc:
        return type(exc), getattr(exc, "code", None), str(exc)


_scripts = st.fixed_dictionaries(
    {"head": st.lists(_values, max_size=3), "asleep": st.lists(_values, max_size=2)}
)
_scripted_steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.binary(min_size=1, max_size=3 * SIZE), _scripts),
        st.tuples(st.sampled_from(["room", "wait", "poke_due"]), st.none(), _scripts),
        st.tuples(st.just("take"), st.integers(1, 2 * SIZE), st.just({})),
        st.tuples(st.sampled_from(["sleep", "wake", "hang_up", "waited"]), st.none(), st.just({})),
    ),
    max_size=40,
)
_handed = st.fixed_dictionaries(
    {},
    optional={
        word: st.lists(st.one_of(st.just(value), _field_values), min_size=1, max_size=2)
        for word, value in [
            ("magic", int.from_bytes(b"flightlo", "little")),
            ("size", SIZE),
            ("head", 0),
            ("tail", 0),
        ]
    },
)


@given(handed=_handed, steps=_scripted_steps)
@example(
    handed={},
    steps=[
        ("write", b"x" * 40, {"head": [], "asleep": []}),
        ("write", b"y" * 40, {"head": [("near", -40), _TOP], "asleep": [1, 1]}),
        ("write", b"z" * 30, {"head": [30, _TOP], "asleep": []}),
    ],
)
@example(handed={"size": [SIZE, 2**63]}, steps=[("write", b"x" * 70, {"head": [], "asleep": []})])
def test_both_writers_make_the_same_loads_whatever_each_load_finds(
    scripted: Any, handed: dict[str, list[int]], steps: list[tuple[str, Any, dict[str, Any]]]
) -> None:
    handing = {_WORDS[word]: values for word, values in handed.items()}
    python, c = _ScriptedSide(None, handing), _ScriptedSide(scripted, handing)
    assert (c.made, c.made_loads) == (python.made, python.made_loads)
    assert bytes(c.buf) == bytes(python.buf)
    if python.writer is None:
        return
    for name, arg, scripts in steps:
        expected = python.scripted_step(name, arg, scripts)
        assert c.scripted_step(name, arg, scripts) == expected, (name, arg, scripts)
        assert bytes(c.buf) == bytes(python.buf)
        assert c.guard_intact() and python.guard_intact()
    assert c.out == python.out
