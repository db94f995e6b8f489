"""gres.conf and the node's ``Gres=`` for a MIG layout, as Slurm expects them.

gres.conf(5), Slurm 22.05: a GPU with MIG is one record per MIG device with ``MultipleFiles``
("Graphics cards using Multi-Instance GPU (MIG) technology will present multiple device files
that should be managed as a single generic resource"); without MIG, ``File``.  A MIG device's
files are its GPU's ``/dev/nvidia<minor>`` and the ``nvidia-caps`` nodes of its GI and CI
access capabilities, whose minors the driver lists in ``/proc/driver/nvidia-caps/mig-minors``
(read as nvidia-container-toolkit's ``internal/nvcaps`` reads it; MIG user guide, "Device
Nodes and Capabilities").  ``Type`` is the MIG profile name, so jobs ask ``--gres=gpu:1g.10gb:1``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from migd.hardware.caps import ci_cap, gi_cap
from migd.hardware.types import GpuState


class GresError(Exception):
    """The layout cannot be written as GRES (an unknown minor, a missing node line)."""


@dataclass(frozen=True)
class GresRecord:
    type: str
    files: tuple[str, ...]
    mig: bool

    def line(self, node: str) -> str:
        key = "MultipleFiles" if self.mig else "File"
        return f"NodeName={node} Name=gpu Type={self.type} {key}={','.join(self.files)}"


def records(states: Sequence[GpuState], minor_of: Callable[[int], int], minors: Mapping[str, int],
            device_dir: Path) -> list[GresRecord]:
    """One record per MIG device (GPU order, then GI placement, then CI id), one per non-MIG GPU."""
    out = []
    for st in sorted(states, key=lambda s: s.gpu.index):
        gpu_minor = minor_of(st.gpu.index)
        dev = str(device_dir / f"nvidia{gpu_minor}")
        model = st.gpu.model
        if not st.gpu.mig_current:
            out.append(GresRecord((model.key if model else "gpu").lower(), (dev,), mig=False))
            continue
        for gi in sorted(st.instances, key=lambda g: g.placement.start):
            prof = model.profile_by_id(gi.profile_id) if model else None
            for ci in sorted(gi.compute_instances, key=lambda c: c.id):
                cip = prof.ci_by_id(ci.profile_id) if prof else None
                if cip is None:
                    raise GresError(f"GPU {st.gpu.index}: GI {gi.id} CI {ci.id} has no profile name")
                caps = [gi_cap(gpu_minor, gi.id), ci_cap(gpu_minor, gi.id, ci.id)]
                missing = [c for c in caps if c not in minors]
                if missing:
                    raise GresError(f"GPU {st.gpu.index}: {missing[0]} is not in the driver's mig-minors table")
                files = (dev, *(str(device_dir / "nvidia-caps" / f"nvidia-cap{minors[c]}") for c in caps))
                out.append(GresRecord(cip.name, files, mig=True))
    return out


def gres_conf(node: str, recs: Sequence[GresRecord], profile: str, old: str | None = None) -> str:
    """gres.conf with ``node``'s records for its layout.  ``old``: the file as it is; its lines for other
    nodes are kept (one gres.conf shared by a cluster's nodes, each line naming its NodeName=, as
    gres.conf(5) allows), this node's lines and migd's header for it are replaced."""
    head = f"# written by migd for profile {profile} on {node}: one record per MIG device (gres.conf(5) MultipleFiles)"
    mine = re.compile(rf"^\s*(NodeName={re.escape(node)}\s|# written by migd for profile \S+ on {re.escape(node)}:)",
                      re.IGNORECASE)
    kept = [line for line in (old or "").splitlines() if not mine.match(line)]
    kept = [line for line in kept if not line.startswith("# written by migd for profile ") or " on " in line]
    return "\n".join([*kept, head, *(r.line(node) for r in recs)]) + "\n"


def node_gres(recs: Sequence[GresRecord]) -> str:
    """The node's ``Gres=`` value: ``gpu:<type>:<count>`` per type, in the order types first appear."""
    counts = Counter(r.type for r in recs)
    return ",".join(f"gpu:{t}:{n}" for t, n in counts.items())


def set_node_gres(conf: str, node: str, gres: str) -> str:
    """``conf`` with ``Gres=`` of the line ``NodeName=<node> ...`` replaced (added if absent)."""
    pattern = re.compile(rf"^(\s*NodeName={re.escape(node)}(?=\s)[^\n]*)$", re.IGNORECASE | re.MULTILINE)
    found = pattern.search(conf)
    if found is None:
        raise GresError(f"no 'NodeName={node} ...' line to carry the node's Gres=")
    line = found.group(1)
    value = f"Gres={gres}" if gres else ""
    new = re.sub(r"\bGres=\S*", value, line, flags=re.IGNORECASE) if re.search(r"\bGres=", line, re.I) \
        else f"{line} {value}".rstrip()
    return conf[:found.start(1)] + re.sub(r"\s{2,}", " ", new).rstrip() + conf[found.end(1):]
