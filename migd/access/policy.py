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
from migd.numeral import whole

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


MAX_ID = 2**32 - 2  # uid_t and gid_t are 32 bits; (uid_t)-1 means "leave as it is" to chown(2)


def gid_of(group: str) -> int:
    """A group's id (a number is taken as the id itself); KeyError when there is no such group."""
    number = whole(group, 10)
    return grp.getgrnam(group).gr_gid if number is None else _id(number, group)


def uid_of(user: str) -> int:
    """A user's id (a number is taken as the id itself); KeyError when there is no such user."""
    number = whole(user, 10)
    return pwd.getpwnam(user).pw_uid if number is None else _id(number, user)


def _id(number: int, text: str) -> int:
    """An id given as a number: one past 32 bits names nobody (chown would overflow), as no name does."""
    if number > MAX_ID:
        raise KeyError(text)
    return number


@dataclass(frozen=True)
class Grant:
    """One owner's Unix accounts, by name as configured.  Names are resolved at every pass
    (:meth:`resolve`), not once at load: after ``groupdel`` the next ``groupadd`` may give the old gid
    to another team, and a grant kept as a number would then open the instances to that team."""

    group: str | None = None
    user: str | None = None

    def resolve(self) -> NodeMode:
        """The node mode now; KeyError naming what no longer exists (then the instances stay root's)."""
        gid = uid = 0
        if self.group:
            try:
                gid = gid_of(self.group)
            except KeyError:
                raise KeyError(f"group {self.group!r} does not exist") from None
        if self.user:
            try:
                uid = uid_of(self.user)
            except KeyError:
                raise KeyError(f"user {self.user!r} does not exist") from None
        return NodeMode(uid, gid, GRANTED if self.group else ROOT_ONLY)


@dataclass(frozen=True)
class Resolved:
    """The policy as the accounts database reads now: each owner's node mode, and the owners whose
    group or user no longer exists (their instances closed to all but root, and said)."""

    modes: Mapping[str, NodeMode]
    unowned: NodeMode
    missing: Mapping[str, str] = field(default_factory=dict)  # owner -> what does not exist

    def wanted(self, owner: str | None) -> NodeMode:
        """The node mode of an existing instance owned by ``owner``."""
        if owner and owner in self.missing:
            return CLOSED
        return self.modes.get(owner, self.unowned) if owner else self.unowned


@dataclass(frozen=True)
class AccessPolicy:
    owners: Mapping[str, Grant] = field(default_factory=dict)
    unowned: Unowned = Unowned.ROOT
    paths: CapsPaths = field(default_factory=CapsPaths)

    def resolve(self) -> Resolved:
        """Every owner's accounts looked up now (once per pass)."""
        modes, missing = {}, {}
        for owner, grant in self.owners.items():
            try:
                modes[owner] = grant.resolve()
            except KeyError as e:
                missing[owner] = e.args[0]
        return Resolved(modes, NodeMode(0, 0, OPEN) if self.unowned is Unowned.OPEN else CLOSED, missing)

    def accounts(self, owner: str) -> str:
        """``group ml-a`` / ``user alice`` / ``no entry``: for messages and ``migctl status``."""
        g = self.owners.get(owner)
        if g is None:
            return f"no entry (unowned: {self.unowned.value})"
        return " and ".join(x for x in (f"group {g.group}" if g.group else "", f"user {g.user}" if g.user else "")
                            if x)
