"""Which Unix accounts may use an owner's instances: the ``access:`` section of migd's configuration.

An owner (the ``owner:`` of a profile's instances) maps to a group, a user, or both.  Its instances'
capability nodes become ``<user or root>:<group or root>`` mode 0440 (0400 with a user alone): the
group's members, or the user, may open them; nobody else but root.  Instances without an owner, or
whose owner has no entry, follow ``unowned``: ``root`` (admins only, the default) or ``open``
(readable by all, the driver's own default for GI and CI capabilities).  Every capability of an
instance that does not exist is root's alone (0400), so an id the driver reuses for the next instance
carries no earlier grant.
"""

from __future__ import annotations

import grp
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field

from migd.hardware.caps import CapsPaths
from migd.kinds import Word

ROOT_ONLY = 0o400
GRANTED = 0o440
OPEN = 0o444


class Unowned(Word):
    ROOT = "root"  # admins only
    OPEN = "open"  # every local user (the driver's default)


@dataclass(frozen=True)
class NodeMode:
    """What one capability node should be: owner, group and permission bits."""

    uid: int
    gid: int
    mode: int

    def describe(self) -> str:
        return f"{self.uid}:{self.gid} {self.mode:04o}"


CLOSED = NodeMode(0, 0, ROOT_ONLY)


def gid_of(group: str) -> int:
    """A group's id (a number is taken as the id itself); KeyError when there is no such group."""
    return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid


def uid_of(user: str) -> int:
    """A user's id (a number is taken as the id itself); KeyError when there is no such user."""
    return int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid


@dataclass(frozen=True)
class Grant:
    """One owner's Unix accounts, resolved when the configuration is read (a name that does not
    resolve is a configuration error there, not a surprise at the first apply)."""

    group: str | None = None
    user: str | None = None
    gid: int = 0
    uid: int = 0

    @classmethod
    def resolve(cls, group: str | None, user: str | None) -> Grant:
        """KeyError when either does not exist."""
        return cls(group, user, gid_of(group) if group else 0, uid_of(user) if user else 0)

    def node(self) -> NodeMode:
        return NodeMode(self.uid, self.gid, GRANTED if self.group else ROOT_ONLY)


@dataclass(frozen=True)
class AccessPolicy:
    owners: Mapping[str, Grant] = field(default_factory=dict)
    unowned: Unowned = Unowned.ROOT
    paths: CapsPaths = field(default_factory=CapsPaths)

    def wanted(self, owner: str | None) -> NodeMode:
        """The node mode of an existing instance owned by ``owner``."""
        grant = self.owners.get(owner) if owner else None
        if grant is not None:
            return grant.node()
        return NodeMode(0, 0, OPEN) if self.unowned is Unowned.OPEN else CLOSED

    def accounts(self, owner: str) -> str:
        """``group ml-a`` / ``user alice`` / ``no entry``: for messages and ``migctl status``."""
        g = self.owners.get(owner)
        if g is None:
            return f"no entry (unowned: {self.unowned.value})"
        return " and ".join(x for x in (f"group {g.group}" if g.group else "", f"user {g.user}" if g.user else "")
                            if x)
