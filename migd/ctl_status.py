"""``migctl status``: the table or document, read here or from migd; ``--mine``: the MIG devices the
calling user may use, as the kernel will decide it.

Whether a process may run on a MIG device is whether it may open the device's GPU-instance and
compute-instance capabilities (``migd.hardware.caps``), so this asks exactly that with ``access(2)``
on the nodes (or, with the /proc interface, the /proc files), with this process's effective ids:
nothing here repeats migd's policy, and a node an administrator changed by hand answers truthfully.
A GPU's device minor (the ``gpu<N>`` of its capabilities) comes from the driver's world-readable
``/proc/driver/nvidia/gpus/<PCI bus id>/information`` ("Device Minor:"), as the MIG user guide says.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from migd.api.status import Gpu, StatusDoc
from migd.ctl_daemon import caps_root, out
from migd.exits import Exit, partly
from migd.hardware.caps import CapsPaths, ci_cap, gi_cap, read_minors, uses_devfs
from migd.report_text import mine_table, status_table


def status_out(args: argparse.Namespace, doc: StatusDoc) -> int:
    """``migctl status``'s table or document; ``--mine``: only what this user may open (exit 1: nothing)."""
    if not args.mine:
        out(args, doc, status_table(doc))
        return partly(Exit.OK, doc.unreadable, bool(doc.gpus))
    mine = usable(doc, CapsPaths(Path(caps_root(args))))
    out(args, mine, mine_table(mine, os.geteuid(), os.getgroups()))
    return Exit.OK if mine.gpus else Exit.NOT_APPLIED


def gpu_minor(paths: CapsPaths, pci_bus_id: str) -> int | None:
    """The GPU's device minor, from its /proc information file; None when the driver does not list it."""
    try:
        for line in paths.gpu_information(pci_bus_id).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _may_open(path: Path) -> bool:
    return os.access(path, os.R_OK, effective_ids=os.access in os.supports_effective_ids)


def usable(doc: StatusDoc, paths: CapsPaths) -> StatusDoc:
    """``doc`` with only the compute instances this process may open (and the GPU instances holding
    them); GPUs left with none are left out."""
    try:
        minors, devfs = read_minors(paths.mig_minors), uses_devfs(paths)
    except OSError:
        return replace(doc, gpus=())
    gpus: list[Gpu] = []
    for g in doc.gpus:
        minor = gpu_minor(paths, g.pci_bus_id)
        if minor is None:
            continue

        def ok(name: str) -> bool:
            if name not in minors:
                return False
            return _may_open(paths.opened(name, minors[name], devfs))
        instances = []
        for gi in g.instances:
            if not ok(gi_cap(minor, gi.gi_id)):
                continue
            cis = tuple(c for c in gi.compute_instances if ok(ci_cap(minor, gi.gi_id, c.ci_id)))
            if cis:
                instances.append(replace(gi, compute_instances=cis))
        if instances:
            gpus.append(replace(g, instances=tuple(instances)))
    return replace(doc, gpus=tuple(gpus))
