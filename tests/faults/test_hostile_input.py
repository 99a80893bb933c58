"""Hostile input: a frame fuzzer driving a live daemon, and paths and peers that try to
lead it where it must not go.

The fuzzer (hypothesis) builds frames from valid messages of every kind, with real
session and run ids, then mutates them: fields replaced by any MessagePack value,
dropped, added, retagged; bytes flipped, cut, inserted; lengths that lie.  Paths come
from an alphabet of escapes (``..``, absolute paths outside the roots, symlinks final
and intermediate, a fifo, a device, a directory).  It runs for a bounded time in seeded
rounds.  After it the daemon must serve normally, every file under the root must pass
``check``, and nothing outside the root may have changed.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from flightlog.protocol import (
    AGENT_FACT_TYPES,
    Record,
    new_id,
)
from flightlog.protocol.format import (
    encode_line,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    CloseSession,
    Create,
    ErrorReply,
    Hello,
    Open,
    SessionOpened,
    Status,
    StatusReply,
    Subscribe,
    Sync,
    TailEnd,
    encode_frame,
)
from support import DaemonProcess, RawClient, wait_for
from support.daemon import (
    assert_serving,
    begin,
    create,
    fact,
    proc_status_kb,
    synced_seq,
)

from .harness import assert_every_file_sound

FUZZ_SECONDS = 20.0
SOAK_FUZZ_SECONDS = 600.0
MAX_FRAME = 16 * 1024 * 1024
_msgpack = msgspec.msgpack.Encoder()


# ------------------------------------------------------------ the hostile root


@dataclass
class Hostile:
    """A daemon whose root holds traps, and a directory outside it with a canary."""

    daemon: DaemonProcess
    outside: Path
    canary: bytes
    stats: dict[str, int] = field(default_factory=dict)


def _canary_line() -> bytes:
    return encode_line(
        Record(
            session_id=new_id(),
            seq=1,
            type="session_start",
            time="2026-11-29T20:00:00.000000Z",
            data=msgspec.Raw(b'{"format_version":1,"meta":{}}'),
        )
    )


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    base = Path(tempfile.mkdtemp(prefix="fl-hostile-", dir="/tmp"))
    outside = base / "outside"
    outside.mkdir()
    canary = _canary_line()
    (outside / "target.jsonl").write_bytes(canary)
    root = base / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    (root / "linkfile.jsonl").symlink_to(outside / "target.jsonl")
    os.mkfifo(root / "fifo.jsonl")
    (root / "dir.jsonl").mkdir()
    if os.geteuid() == 0:
        os.mknod(root / "null.jsonl", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        os.mknod(root / "zero.jsonl", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    daemon = DaemonProcess(base).start()
    try:
        yield Hostile(daemon, outside, canary)
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def _assert_outside_untouched(h: Hostile) -> None:
    assert sorted(p.name for p in h.outside.iterdir()) == ["target.jsonl"]
    assert (h.outside / "target.jsonl").read_bytes() == h.canary
    base = h.daemon.base
    assert sorted(p.name for p in base.iterdir() if not p.name.endswith(".log")) == [
        "outside",
        "root",
        "run",
    ]


# ------------------------------------------------------------- the fuzzer

_HOSTILE_PATHS = [
    "fuzz/a.jsonl",
    "../escape.jsonl",
    "fuzz/../../escape.jsonl",
    "/etc/flightlog-escape.jsonl",
    "{outside}/target.jsonl",
    "{outside}/new.jsonl",
    "{root}/../escape.jsonl",
    "{root}/fuzz/absolute.jsonl",
    "{root}",
    "link/target.jsonl",
    "link/new.jsonl",
    "link/deeper/new.jsonl",
    "linkfile.jsonl",
    "fifo.jsonl",
    "null.jsonl",
    "zero.jsonl",
    "dir.jsonl",
    "dir.jsonl/inside.jsonl",
    "fuzz/a.jsonl/below-a-file.jsonl",
    "",
    ".",
    "/",
    "fuzz/nul\x00byte.jsonl",
    "fuzz/" + "x" * 300,
    "d/" * 2100 + "s.jsonl",
    "fuzz/ünïcødé ☃.jsonl",
]

_times = st.one_of(
    st.just("2026-11-29T20:00:00.000000Z"),
    st.sampled_from(
        [
            "2026-02-30T00:00:00.000000Z",
            "2026-11-29T20:00:00.000000+01:00",
            "2026-11-29 20:00:00",
            "\uff12\uff10\uff12\uff16-11-29T20:00:00.000000Z",
            "",
        ]
    ),
    st.text(max_size=40),
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=25,
)
_data = st.one_of(
    st.dictionaries(st.text(max_size=8), _json, max_size=5).map(
        lambda d: json.dumps(d, ensure_ascii=False).encode()
    ),
    _json.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 600).map(lambda n: b'{"a":' + b"[" * n + b"]" * n + b"}"),
    st.binary(max_size=120),
    st.sampled_from([b'{"a":1}\n', b'{"a":"\xff"}', b'{"a":"\\ud800"}', b"{} {}", b"", b"{"]),
)
_any = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=30)
    | st.binary(max_size=60),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)
_paths = st.one_of(
    st.sampled_from(_HOSTILE_PATHS),
    st.text(alphabet="ab./\x00", max_size=16).map(lambda t: "fuzz/" + t),
    st.text(max_size=30),
)
_event_types = st.one_of(
    st.sampled_from(sorted(AGENT_FACT_TYPES)),
    st.sampled_from(["session_start", "run_start", "checkpoint", "run_close", "message_update"]),
    st.text(max_size=20),
)
_ids = st.one_of(st.integers(1, 1000), st.integers(-(2**63), 2**64 - 1))

_KINDS = [
    "hello",
    "create",
    "open",
    "begin_run",
    "record",
    "record",
    "record",
    "save_checkpoint",
    "close_run",
    "close_session",
    "sync",
    "load_checkpoint",
    "subscribe",
    "unsubscribe",
    "status",
]


@st.composite
def _actions(draw: Any) -> dict[str, Any]:
    """One frame to be: a message kind with drawn values, and what mutates it."""
    return {
        "kind": draw(st.sampled_from(_KINDS)),
        "id": draw(_ids),
        "path": draw(_paths),
        "meta": draw(st.dictionaries(st.text(max_size=8), _any, max_size=4)),
        "time": draw(_times),
        "data": draw(_data),
        "event_type": draw(_event_types),
        "own_ids": draw(st.booleans() | st.just(True)),
        "after": draw(st.integers(-5, 2**40)),
        "follow": draw(st.booleans()),
        "types": draw(st.none() | st.lists(_event_types, max_size=3)),
        # Fields mutated in one frame in three.
        "fields": draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["set", "drop", "add", "retag"]),
                    st.text(max_size=12),
                    _any,
                ),
                min_size=1,
                max_size=3,
            )
        )
        if draw(st.integers(0, 2)) == 1
        else [],
        # Bytes mutated in one frame in four; a lying length in one in forty (it ends
        # what the daemon can read of the connection).  Not "== 0": hypothesis draws
        # the bounds of a range often.
        "bytes": draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["flip", "cut", "insert"]),
                    st.floats(0, 1),
                    st.binary(min_size=1, max_size=8),
                ),
                min_size=1,
                max_size=2,
            )
        )
        if draw(st.integers(0, 3)) == 2
        else [],
        "length": draw(st.integers(0, 64) | st.integers(MAX_FRAME + 1, 2**32 - 1))
        if draw(st.integers(0, 39)) == 17
        else None,
    }


def _message(
    action: dict[str, Any], root: Path, outside: Path, ids: tuple[str, str]
) -> dict[str, Any]:
    kind = action["kind"]
    session_id, run_id = ids if action["own_ids"] else (new_id(), new_id())
    path = action["path"].replace("{root}", str(root)).replace("{outside}", str(outside))
    fields: dict[str, Any] = {"type": kind, "id": action["id"]}
    if kind == "hello":
        fields |= {"version": action["id"] % 3, "client": path}
    elif kind in ("create", "open"):
        fields["path"] = path
        if kind == "create":
            fields["meta"] = action["meta"]
    elif kind == "record":
        del fields["id"]
        fields |= {
            "session_id": session_id,
            "run_id": run_id,
            "event_type": action["event_type"],
            "time": action["time"],
            "data": action["data"],
        }
    elif kind == "subscribe":
        fields |= {
            "path": path or None,
            "after": action["after"],
            "follow": action["follow"],
            "types": action["types"],
        }
    elif kind == "unsubscribe":
        fields["subscription"] = action["id"]
    elif kind != "status":
        fields["session_id"] = session_id
        if kind in ("begin_run", "save_checkpoint", "close_run"):
            fields["time"] = action["time"]
        if kind in ("save_checkpoint", "close_run"):
            fields["run_id"] = run_id
        if kind == "save_checkpoint":
            fields["snapshot"] = action["data"]
    for op, name, value in action["fields"]:
        keys = sorted(fields) or ["type"]
        key = keys[len(name) % len(keys)]
        if op == "set":
            fields[key] = value
        elif op == "drop":
            fields.pop(key, None)
        elif op == "add":
            fields[name or "extra"] = value
        else:
            fields["type"] = name or value
    return fields


def _frame(action: dict[str, Any], message: dict[str, Any]) -> bytes:
    try:
        payload = bytearray(_msgpack.encode(message))
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        payload = bytearray(b"\xc1")
    for op, where, chunk in action["bytes"]:
        at = min(int(where * len(payload)), max(len(payload) - 1, 0))
        if op == "flip" and payload:
            payload[at] ^= chunk[0] or 1
        elif op == "cut":
            del payload[at:]
        else:
            payload[at:at] = chunk
    length = len(payload) if action["length"] is None else action["length"]
    return length.to_bytes(4, "big") + bytes(payload)


_MARK = 2**62


def _expects_a_reply(stream: bytes) -> bool:
    """Whether the daemon, having read ``stream``, is between frames (so it will read a
    request sent next), not waiting for the rest of a frame or hanging up."""
    at = 0
    while at + 4 <= len(stream):
        length = int.from_bytes(stream[at : at + 4], "big")
        if length > MAX_FRAME:
            return False  # it hangs up at this frame
        at += 4 + length
    return at == len(stream)


class _Fuzz:
    def __init__(self, h: Hostile, name: str) -> None:
        self.h = h
        self.name = name  # the fuzz runs of a module share its daemon and root
        self.examples = 0

    def run(self, actions: list[dict[str, Any]]) -> None:
        h = self.h
        daemon = h.daemon
        self.examples += 1
        with RawClient(daemon.socket, client="fuzz") as client:
            opened = create(client, f"fuzz/{self.name}-{self.examples}.jsonl")
            run = begin(client, opened.session_id)
            ids = (opened.session_id, run.run_id)
            stream = b"".join(
                _frame(action, _message(action, daemon.root, h.outside, ids)) for action in actions
            )
            h.stats["frames"] = h.stats.get("frames", 0) + len(actions)
            h.stats["bytes"] = h.stats.get("bytes", 0) + len(stream)
            try:
                client.send_bytes(stream)
                if _expects_a_reply(stream):
                    # Everything before this request is answered (or pushed) first.
                    client.send(Status(id=_MARK))
                    while not isinstance(message := client.receive(30), StatusReply) or (
                        message.id != _MARK
                    ):
                        key = getattr(message, "code", None) or type(message).__name__
                        h.stats[key] = h.stats.get(key, 0) + 1
                        # "internal" is a bug in the daemon, never the client's doing.
                        assert key != "internal", message
                    h.stats["answered"] = h.stats.get("answered", 0) + 1
            except (EOFError, ConnectionResetError, BrokenPipeError):
                h.stats["hung_up"] = h.stats.get("hung_up", 0) + 1
        assert daemon.alive(), daemon.log[-5000:]


def _fuzz_for(h: Hostile, seconds: float, first_seed: int) -> int:
    fuzz = _Fuzz(h, f"seed{first_seed}")
    deadline = time.monotonic() + seconds
    round_seed = first_seed

    def example(actions: list[dict[str, Any]]) -> None:
        fuzz.run(actions)

    while time.monotonic() < deadline:
        test = seed(round_seed)(
            settings(
                max_examples=40,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )(given(st.lists(_actions(), min_size=1, max_size=20))(example))
        )
        test()
        round_seed += 1
    return fuzz.examples


def _assert_sound_after_fuzzing(h: Hostile) -> None:
    daemon = h.daemon
    assert_serving(daemon)
    reports = assert_every_file_sound(daemon.root, tail_allowed=False)
    assert len(reports) >= 1
    _assert_outside_untouched(h)


def test_fuzzed_frames_against_a_live_daemon(hostile: Hostile) -> None:
    examples = _fuzz_for(hostile, FUZZ_SECONDS, 0)
    assert examples >= 100, examples
    _assert_sound_after_fuzzing(hostile)
    print(f"fuzz: {examples} examples, {hostile.stats}")


@pytest.mark.soak
@pytest.mark.timeout(SOAK_FUZZ_SECONDS + 600)
def test_fuzzed_frames_against_a_live_daemon_soak(hostile: Hostile) -> None:
    examples = _fuzz_for(hostile, SOAK_FUZZ_SECONDS, 100_000)
    _assert_sound_after_fuzzing(hostile)
    print(f"fuzz soak: {examples} examples, {hostile.stats}")


# ---------------------------------------------------------------- paths

_IN_OPEN = 0x20


class _OpenWatch:
    """inotify IN_OPEN on some paths: whether anything opened them."""

    def __init__(self, paths: list[Path]) -> None:
        self._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            pytest.skip("no inotify")
        for path in paths:
            assert self._libc.inotify_add_watch(self.fd, bytes(path), _IN_OPEN) >= 0

    def opened(self) -> bool:
        readable, _, _ = select.select([self.fd], [], [], 0)
        return bool(readable) and bool(os.read(self.fd, 4096))

    def close(self) -> None:
        os.close(self.fd)


def test_devices_and_fifos_in_place_of_a_session_file_are_never_opened(
    hostile: Hostile,
) -> None:
    """Regression: open() of a session path opened whatever was there before it looked
    (a fifo, a terminal, a tape) and only then refused it; without O_NOCTTY a terminal
    could even become the daemon's controlling terminal."""
    root = hostile.daemon.root
    names = ["fifo.jsonl", "null.jsonl", "zero.jsonl"]
    if not (root / "null.jsonl").exists():
        pytest.skip("mknod needs root")
    watch = _OpenWatch([root / name for name in names])
    try:
        with RawClient(hostile.daemon.socket) as client:
            for name in names:
                for reply in (
                    client.request(Open(id=client.next_id(), path=name)),
                    client.request(
                        Open(id=client.next_id(), path=str(root / name)),
                    ),
                    client.request(
                        Subscribe(id=client.next_id(), path=name, follow=False),
                    ),
                ):
                    if not isinstance(reply, ErrorReply):  # a subscription: its end says
                        ended = client.receive()
                        assert isinstance(ended, TailEnd), ended
                        reply = ended
                    assert reply.code == "path_refused", reply
        assert not watch.opened(), "the daemon opened a device or fifo"
    finally:
        watch.close()
    assert_serving(hostile.daemon)


def test_every_hostile_path_is_refused_with_its_code_for_open_create_and_tail(
    hostile: Hostile,
) -> None:
    """Regression (found by the fuzzer's soak): a tail of a name too long for the file
    system ended with code "internal" (an OSError nobody named) instead of
    path_refused, as open and create say."""
    daemon = hostile.daemon
    with RawClient(daemon.socket) as client:
        for template in _HOSTILE_PATHS[1:]:
            path = template.replace("{root}", str(daemon.root))
            path = path.replace("{outside}", str(hostile.outside))
            for message in (
                Open(id=client.next_id(), path=path),
                Create(id=client.next_id(), path=path),
                Subscribe(id=client.next_id(), path=path, follow=False),
            ):
                reply = client.request(message)
                while not isinstance(reply, ErrorReply | TailEnd | SessionOpened):
                    reply = client.receive()
                if isinstance(reply, SessionOpened):
                    # A path under the root after all: nothing to refuse.
                    assert Path(reply.path).is_relative_to(daemon.root), reply
                    client.request(CloseSession(id=client.next_id(), session_id=reply.session_id))
                    continue
                if reply.code is None:
                    continue  # the tail of a session under the root: it ended
                allowed = {"path_refused", "session_not_found", "session_exists", "session_busy"}
                assert reply.code in allowed, (path, message, reply)
    _assert_outside_untouched(hostile)
    assert_serving(daemon)


def test_tailing_an_endless_device_is_refused_and_costs_no_memory(hostile: Hostile) -> None:
    """Regression: a tail of a character device like /dev/zero in place of a session
    file read it for ever, holding every byte (no line ever ended)."""
    root = hostile.daemon.root
    if not (root / "zero.jsonl").exists():
        pytest.skip("mknod needs root")
    daemon = hostile.daemon
    baseline = proc_status_kb(daemon.pid, "VmRSS")
    with RawClient(daemon.socket) as client:
        client.request(Subscribe(id=client.next_id(), path="zero.jsonl", follow=True))
        ended = client.receive()
        assert isinstance(ended, TailEnd) and ended.code == "path_refused", ended
    assert proc_status_kb(daemon.pid, "VmHWM") - baseline < 64 * 1024
    assert_serving(daemon)


def test_a_directory_swapped_for_a_symlink_while_the_file_is_closed(short_tmp: Path) -> None:
    """The session's directory is replaced by a symlink out of the root while its file
    is closed for being idle: the reopen walks the path again and refuses it, so the
    write fails (sticky) and nothing outside changes; a tail of it is refused too."""
    outside = short_tmp / "outside"
    outside.mkdir()
    daemon = DaemonProcess(short_tmp, "--idle-timeout", "0.2").start()
    try:
        with RawClient(daemon.socket) as client:
            opened = create(client, "swap/s.jsonl")
            run = begin(client, opened.session_id)
            client.send(fact(opened.session_id, run.run_id, 1))
            assert synced_seq(client, opened.session_id) == 3

            def file_closed() -> bool:
                reply = client.request(Status(id=client.next_id()))
                return not any(s.file_open for s in reply.sessions)

            wait_for(file_closed)
            (daemon.root / "swap").rename(outside / "swap")
            (daemon.root / "swap").symlink_to(outside / "swap")
            before = (outside / "swap" / "s.jsonl").read_bytes()
            client.send(fact(opened.session_id, run.run_id, 2))
            sync = client.request(Sync(id=client.next_id(), session_id=opened.session_id))
            assert isinstance(sync, ErrorReply) and sync.code == "write_failed", sync
            assert "symlink" in sync.message, sync
            assert (outside / "swap" / "s.jsonl").read_bytes() == before
            tail = client.request(Subscribe(id=client.next_id(), path="swap/s.jsonl"))
            while not isinstance(tail, ErrorReply | TailEnd):
                tail = client.receive()
            assert tail.code == "path_refused", tail
        assert_serving(daemon)
    finally:
        daemon.stop()


# ------------------------------------------------------------ another user

_CONNECT_AS_NOBODY = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("EACCES")
else:
    s.sendall(bytes.fromhex(sys.argv[2]))
    print("connected", len(s.recv(4096)))
"""


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def _connect_as_nobody(socket_path: str) -> str:
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or os.geteuid() != 0:
        pytest.skip("needs root and a python3 that user nobody can run")
    hello = encode_frame(Hello(id=1, version=PROTOCOL_VERSION, client="nobody"))
    result = subprocess.run(
        [python, "-c", _CONNECT_AS_NOBODY, socket_path, hello.hex()],
        preexec_fn=_as_nobody,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(
    ("socket_mode", "run_dir_mode", "expected"),
    [
        pytest.param(None, None, "EACCES", id="default-0700-directory"),
        pytest.param(None, 0o755, "EACCES", id="socket-0600-in-an-open-directory"),
        pytest.param("0666", 0o755, "connected", id="control-socket-0666"),
    ],
)
def test_another_user_cannot_connect_where_the_socket_mode_forbids_it(
    short_tmp: Path, socket_mode: str | None, run_dir_mode: int | None, expected: str
) -> None:
    short_tmp.chmod(0o755)
    if run_dir_mode is not None:
        (short_tmp / "run").mkdir(mode=run_dir_mode)
        (short_tmp / "run").chmod(run_dir_mode)
    args = ("--socket-mode", socket_mode) if socket_mode else ()
    daemon = DaemonProcess(short_tmp, *args).start()
    try:
        outcome = _connect_as_nobody(daemon.socket)
        assert outcome.startswith(expected), outcome
        if expected == "EACCES":
            assert 'uid": 65534' not in daemon.log
        assert_serving(daemon)
    finally:
        daemon.stop()
