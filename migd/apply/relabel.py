"""An owner-only change (the same layout, other owners) as a transaction of its own.

Who may open an instance follows its owner label (``owners.json``), so a relabel moves an instance
from one team to another without any NVML call.  Done as close -> write the labels -> open, with a
journal entry (``relabeling``, the labels before and after) written before the close: a crash at any
cut leaves the instance closed to all but root, or the new owner's, never the old owner's with the
new owner's label nor the reverse; recovery finishes it forward (close, write the new labels) and the
pass's open grants by them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from migd.plan.planner import GpuPlan

log = logging.getLogger(__name__)


def labels_of(plan: GpuPlan) -> dict[int, str]:
    """The owner labels a plan's layout carries: GI placement start -> owner."""
    return {t.placement.start: t.owner for t in plan.targets if t.owner}


def relabelled(plans: list[GpuPlan], owners: Mapping[str, Mapping[int, str]]) -> list[GpuPlan]:
    """The GPUs whose layout holds and whose owners change (a GPU whose layout changes relabels with it)."""
    return [p for p in plans if not p.changes and p.targets and labels_of(p) != dict(owners.get(p.gpu.uuid, {}))]


def moves(before: Mapping[int, str], after: Mapping[int, str]) -> str:
    """``GI at slice 0: notebooks -> training`` for each instance whose owner changes (for the log)."""
    return ", ".join(f"GI at slice {start}: {before.get(start, '(none)')} -> {after.get(start, '(none)')}"
                     for start in sorted(set(before) | set(after)) if before.get(start) != after.get(start))
