"""A root shared by the group of every recording uid cannot be booby-trapped by one of
them (issue 27, 6): docs/operations.md's layout for an ``--allow`` root (owned by the
daemon's user, group ``flightlog``, mode 3770) and the daemon's repair of a ``uid``
directory planted there.

Real uids in a throwaway group take turns against a root-owned shared daemon (root
is its uid here, as ``flightlog`` is in the recommended install).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol.wire import (
    Create,
    SessionOpened,
)
from support import DaemonProcess, RawClient
from support.daemon import as_uid, needs_root, shared_daemon, wait_for_log

pytestmark = needs_root

WRITERS = 43000  # the group every recording uid is in (``flightlog``)
VICTIM = 43001
ATTACKER = 43002


@pytest.fixture(params=[0o3770, 0o2770], ids=["sticky", "setgid only"])
def root(request: pytest.FixtureRequest) -> Iterator[Path]:
    """An ``--allow`` root of the daemon's user and the writers' group."""
    path = Path(tempfile.mkdtemp(prefix="fl-shared-", dir="/tmp"))
    os.chown(path, os.geteuid(), WRITERS)
    path.chmod(request.param)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shared(root: Path) -> Iterator[DaemonProcess]:
    with shared_daemon("--allow", str(root)) as proc:
        yield proc


def _create(socket: str, path: str) -> Any:
    def run() -> Any:
        with RawClient(socket) as client:
            return client.request(Create(id=client.next_id(), path=path, meta={}))

    return as_uid(VICTIM, run, groups=(WRITERS,))


def test_a_member_of_the_group_cannot_take_the_users_directory_from_the_others(
    shared: DaemonProcess, root: Path
) -> None:
    first = _create(shared.socket, f"{root}/uid/{VICTIM}/first.jsonl")
    assert isinstance(first, SessionOpened), first

    def swap() -> str:
        # Move the daemon's directory away and plant one of its own.
        try:
            os.rename(root / "uid", root / "moved")
        except PermissionError:
            return "refused"
        (root / "uid").mkdir(mode=0o700)
        return "planted"

    outcome = as_uid(ATTACKER, swap, groups=(WRITERS,))
    again = _create(shared.socket, f"{root}/uid/{VICTIM}/again.jsonl")
    # Before, the victim (and every uid) got path_refused for good.
    assert isinstance(again, SessionOpened), again
    if root.stat().st_mode & 0o1000:
        # The recommended layout: the sticky bit keeps each member to its own entries.
        assert outcome == "refused"
        assert sorted(p.name for p in root.iterdir()) == ["uid"]
    else:
        # Without it the swap works, and the daemon moves the planted one aside.
        assert outcome == "planted"
        moved = wait_for_log(shared, event="planted_directory_moved")
        assert moved["owner"] == ATTACKER
        aside = Path(moved["moved_to"])
        assert aside.name.startswith(f"uid.planted-by-{ATTACKER}-")
        assert list(aside.iterdir()) == []  # nothing of the victim's went into it
        assert (root / "uid").stat().st_uid == os.geteuid()
        assert (root / "moved" / str(VICTIM) / "first.jsonl").exists()
    assert (root / "uid" / str(VICTIM) / "again.jsonl").exists()


def test_a_users_directory_planted_before_the_daemon_made_one_is_moved_aside(
    shared: DaemonProcess, root: Path
) -> None:
    def plant() -> None:
        (root / "uid").mkdir(mode=0o700)
        (root / "uid" / str(VICTIM)).mkdir(mode=0o777)

    as_uid(ATTACKER, plant, groups=(WRITERS,))
    opened = _create(shared.socket, f"{root}/uid/{VICTIM}/s.jsonl")
    assert isinstance(opened, SessionOpened), opened
    moved = wait_for_log(shared, event="planted_directory_moved")
    assert moved["owner"] == ATTACKER
    assert list((Path(moved["moved_to"]) / str(VICTIM)).iterdir()) == []
    for directory in (root / "uid", root / "uid" / str(VICTIM)):
        st = directory.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "file"])
def test_a_symlink_file_or_fifo_planted_as_the_users_directory_is_moved_aside(
    shared: DaemonProcess, root: Path, kind: str, tmp_path: Path
) -> None:
    def plant() -> None:
        users = root / "uid"
        if kind == "symlink":
            os.symlink(tmp_path, users)
        elif kind == "dangling symlink":
            os.symlink("/nonexistent/uid", users)
        elif kind == "fifo":
            os.mkfifo(users)
        else:
            users.write_text("not a directory")

    as_uid(ATTACKER, plant, groups=(WRITERS,))
    opened = _create(shared.socket, f"{root}/uid/{VICTIM}/s.jsonl")
    # Before, every uid got path_refused ('uid' is a symlink or not a directory) for
    # as long as the planted entry stayed: the daemon moved aside only directories.
    assert isinstance(opened, SessionOpened), opened
    moved = wait_for_log(shared, event="planted_directory_moved")
    assert moved["owner"] == ATTACKER
    assert Path(moved["moved_to"]).name.startswith(f"uid.planted-by-{ATTACKER}-")
    st = (root / "uid").lstat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert (root / "uid" / str(VICTIM) / "s.jsonl").exists()
    assert list(tmp_path.iterdir()) == []  # nothing went where the symlink pointed
