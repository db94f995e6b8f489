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

from migd.access.policy import AccessPolicy, Grant, Unowned, gid_of, uid_of
from migd.hardware.caps import CapsPaths
from migd.yamlsrc import Node


@dataclass(frozen=True)
class AccessSettings:
    policy: AccessPolicy
    with_slurm: bool = False


def parse_access(node: Node) -> AccessSettings:
    m = node.mapping(allowed=["owners", "unowned", "with_slurm", "root"], required=["owners"])
    owners = {}
    for name, entry in m["owners"].named().items():
        e = entry.mapping(allowed=["group", "user"])
        if not e:
            raise entry.error("names no group and no user: whose are this owner's instances?")
        for key, resolve in (("group", gid_of), ("user", uid_of)):
            if key in e:
                try:
                    resolve(e[key].name())  # checked now; resolved again at every pass (Grant.resolve)
                except KeyError:
                    raise e[key].error(f"no {key} named {e[key].str()!r} on this node") from None
        owners[name] = Grant(e["group"].name() if "group" in e else None, e["user"].name() if "user" in e else None)
    root = Path(m["root"].str()) if "root" in m else Path("/")
    if not root.is_absolute():
        raise m["root"].error("must be an absolute path")
    return AccessSettings(
        AccessPolicy(owners, Unowned(m["unowned"].str(choices=list(Unowned))) if "unowned" in m else Unowned.ROOT,
                     CapsPaths(root)),
        m["with_slurm"].bool() if "with_slurm" in m else False)

