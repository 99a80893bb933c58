"""The access policy and the paths it decides on, without a daemon: whose a path is,
who may write and read it, and the groups the kernel reports of a peer."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from flightlog.daemon._access import Access, PermissionDenied, peer_groups
from flightlog.daemon._paths import PathRefused, ResolvedPath, Roots

DAEMON = 990


@dataclass
class _Who:
    uid: int
    gid: int = 1
    groups: tuple[int, ...] = ()


def _access(tmp_path: Path, readers: int | None = None) -> Access:
    return Access(Roots(str(tmp_path / "root")), daemon_uid=DAEMON, readers_gid=readers)


@pytest.mark.parametrize(
    ("path", "owner"),
    [
        ("uid/1001/a.jsonl", 1001),
        ("uid/1001/deep/er/a.jsonl", 1001),
        ("uid/0/a.jsonl", 0),
        ("a.jsonl", None),
        ("agents/uid/1001/a.jsonl", None),
        # Not a uid as the daemon writes it, or no directory at all: nobody's.
        ("uid/a.jsonl", -1),
        ("uid/01001/a.jsonl", -1),
        ("uid/x/a.jsonl", -1),
        ("uid/\uff11/a.jsonl", -1),
        ("uid/-1/a.jsonl", -1),
    ],
)
def test_a_session_belongs_to_the_uid_whose_directory_holds_it(
    path: str, owner: int | None
) -> None:
    assert Roots.owner(ResolvedPath("/r", tuple(path.split("/")))) == owner
    roots = Roots("/r", ("/srv/agents",))
    assert roots.owner_of(f"/r/{path}") == owner
    assert roots.owner_of(f"/srv/agents/{path}") == owner
    assert roots.owner_of(f"/elsewhere/{path}") is None


def test_relative_paths_of_another_uid_resolve_in_its_own_directory(tmp_path: Path) -> None:
    access = _access(tmp_path)
    root = access.roots.root
    assert access.resolve(_Who(1001), "a/b.jsonl") == ResolvedPath(
        root, ("uid", "1001", "a", "b.jsonl")
    )
    assert access.resolve(_Who(DAEMON), "a/b.jsonl") == ResolvedPath(root, ("a", "b.jsonl"))
    # An absolute path is taken as it is: the owner check decides.
    mine = access.resolve(_Who(1001), f"{root}/uid/1002/b.jsonl")
    assert mine.parts == ("uid", "1002", "b.jsonl")
    with pytest.raises(PathRefused):
        access.resolve(_Who(1001), "../1002/b.jsonl")


def test_only_the_owner_writes(tmp_path: Path) -> None:
    access = _access(tmp_path, readers=500)
    root = access.roots.root
    theirs = access.resolve(_Who(1001), "a.jsonl")
    access.check_write(_Who(1001), theirs)
    for who in (_Who(1002), _Who(0), _Who(DAEMON), _Who(1003, groups=(500,))):
        with pytest.raises(PermissionDenied) as refused:
            access.check_write(who, theirs)
        assert refused.value.code == "permission_denied"
        assert theirs.path in refused.value.message
    top = access.resolve(_Who(DAEMON), "a.jsonl")
    access.check_write(_Who(DAEMON), top)
    with pytest.raises(PermissionDenied):
        access.check_write(_Who(1001), top)
    with pytest.raises(PermissionDenied):
        access.check_write(_Who(1001), access.resolve(_Who(1001), f"{root}/uid/x/a.jsonl"))


def test_the_owner_root_the_daemon_and_the_readers_group_read(tmp_path: Path) -> None:
    access = _access(tmp_path, readers=500)
    theirs = access.resolve(_Who(1001), "a.jsonl")
    for who in (
        _Who(1001),
        _Who(0),
        _Who(DAEMON),
        _Who(1003, groups=(7, 500)),
        _Who(1004, gid=500),  # the readers' group as its primary group
    ):
        access.check_read(who, theirs)
        assert access.may_read(who, theirs.path)
    stranger = _Who(1002, groups=(7,))
    with pytest.raises(PermissionDenied):
        access.check_read(stranger, theirs)
    assert not access.may_read(stranger, theirs.path)
    assert access.may_read(stranger, access.resolve(stranger, "b.jsonl").path)
    # Without a readers' group, a group is nothing special.
    assert not _access(tmp_path).may_read(_Who(1003, groups=(500,)), theirs.path)


def test_the_kernel_reports_a_peers_groups() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert sorted(peer_groups(left)) == sorted(os.getgroups())
