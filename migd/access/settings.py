"""The ``access:`` section of migd's configuration, read into an :class:`AccessPolicy` (file, line and
field in every error; a group or user that does not exist is an error here, not at the first apply)::

    access:
      owners:
        team-a: {group: ml-a}
        notebooks: {group: users}
        alice-thesis: {user: alice}
      unowned: root          # or open
      with_slurm: false      # Slurm mode: Slurm's cgroups own device access unless this is true
      root: /                # where /dev and /proc are (a simulated node's own tree in tests)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from migd.access.policy import AccessPolicy, Grant, Unowned
from migd.hardware.caps import CapsPaths
from migd.yamlsrc import Node


@dataclass(frozen=True)
class AccessSettings:
    policy: AccessPolicy
    with_slurm: bool = False


def parse_access(node: Node) -> AccessSettings:
    m = node.mapping(allowed=["owners", "unowned", "with_slurm", "root"], required=["owners"])
    owners = {}
    for name, entry in m["owners"].mapping().items():
        e = entry.mapping(allowed=["group", "user"])
        if not e:
            raise entry.error("names no group and no user: whose are this owner's instances?")
        group = e["group"].str() if "group" in e else None
        user = e["user"].str() if "user" in e else None
        try:
            owners[name] = Grant.resolve(group, user)
        except KeyError:
            which = ("group", group) if group and not _exists_group(group) else ("user", user)
            raise e[which[0]].error(f"no {which[0]} named {which[1]!r} on this node") from None
    root = Path(m["root"].str()) if "root" in m else Path("/")
    if not root.is_absolute():
        raise m["root"].error("must be an absolute path")
    return AccessSettings(
        AccessPolicy(owners, Unowned(m["unowned"].str(choices=list(Unowned))) if "unowned" in m else Unowned.ROOT,
                     CapsPaths(root)),
        m["with_slurm"].bool() if "with_slurm" in m else False)


def _exists_group(name: str) -> bool:
    try:
        Grant.resolve(name, None)
    except KeyError:
        return False
    return True
