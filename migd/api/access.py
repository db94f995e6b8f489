"""``migd.daemon/v1``'s ``access``: access by owner as migd keeps it (docs/users.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AccessView:
    """``owners``: each owner and the accounts its instances are open to; ``unowned``: what instances
    without an entry get; ``changed``: capability nodes set since start; ``errors``: as of the last
    apply or pass."""

    owners: dict[str, str]
    unowned: str
    interface: str  # "dev" or "proc" (the driver's nv_cap_enable_devfs)
    root: str  # where the driver's /dev and /proc are ("/" but on a simulated node)
    changed: int
    errors: tuple[str, ...]  # what is not as the policy says now: owners whose accounts are gone, nodes not set
    unresolved: tuple[str, ...] = ()  # owners whose group or user no longer exists (closed to all but root)
