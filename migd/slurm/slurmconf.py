"""The ``slurm:`` section of migd's config: which node, which files, how Slurm learns the GRES.

Slurm has no dynamic MIG ("Slurm expects MIG devices to already be partitioned", gres
documentation): a layout change needs the node drained, gres.conf and the node's ``Gres=``
rewritten, and the daemons made to read them.  On Slurm 22.05 ``scontrol reconfigure`` leaves the
node INVALID_REG after a GRES count change and a restarted slurmd alone is refused; what works is
stop slurmd, restart slurmctld, start slurmd (measured on Debian's 22.05).  Newer Slurm
can reconfigure in place; dynamic nodes (``slurmd -Z``) re-register instead.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from migd.kinds import Word
from migd.slurm.demandconf import DemandSettings, parse_demand
from migd.state.live import WATCHDOG_STALL_S
from migd.yamlsrc import Node

KEYS = ["node", "slurm_conf", "gres_conf", "update", "stop_slurmd", "start_slurmd", "restart_slurmctld",
        "device_dir", "mig_minors", "maintenance_ahead", "maintenance_window", "register_timeout",
        "command_timeout", "max_in_maintenance", "partition", "env", "demand"]


BOUNDED = ("register_timeout", "command_timeout")  # one step of a switch each: below the watchdog's limit


class GresUpdate(Word):
    """How Slurm is made to take a new GRES layout."""

    RESTART = "restart"  # stop slurmd, restart slurmctld, start slurmd (static nodes, Slurm 22.05)
    RECONFIGURE = "reconfigure"  # scontrol reconfigure (a Slurm that applies GRES changes in place)
    DYNAMIC = "dynamic"  # delete the dynamic node and start slurmd -Z again (re-registration)


@dataclass(frozen=True)
class SlurmSettings:
    node: str
    slurm_conf: Path  # the file holding this node's "NodeName=... Gres=" line (slurm.conf or an Include)
    gres_conf: Path
    update: GresUpdate = GresUpdate.RESTART
    stop_slurmd: tuple[str, ...] = ("systemctl", "stop", "slurmd")
    start_slurmd: tuple[str, ...] = ("systemctl", "start", "slurmd")
    restart_slurmctld: tuple[str, ...] = ("systemctl", "restart", "slurmctld")
    device_dir: Path = Path("/dev")  # nvidia<minor> and nvidia-caps/nvidia-cap<minor> live here
    mig_minors: Path = Path("/proc/driver/nvidia-caps/mig-minors")
    maintenance_ahead_s: float = 900.0  # a MAINT reservation starts this long before a transition
    maintenance_window_s: float = 1800.0
    register_timeout_s: float = 90.0
    command_timeout_s: float = 30.0
    max_in_maintenance: int | None = None  # fleet waves: at most this many nodes of the partition drained
    partition: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # added to every Slurm command's environment (e.g. SLURM_CONF)
    demand: DemandSettings | None = None  # layouts from the queue (slurm/demandconf.py); None: the schedule


def _argv(n: Node) -> tuple[str, ...]:
    argv = tuple(x.str() for x in n.items()) if n.is_sequence() else tuple(n.str().split())
    if not argv:
        raise n.error("needs a command")
    return argv


def default_slurm_conf() -> Path:
    """Where Slurm's own commands look: $SLURM_CONF, else Debian's /etc/slurm/slurm.conf."""
    return Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))


def parse_slurm(n: Node, profiles: Collection[str] = ()) -> SlurmSettings:
    m = n.mapping(allowed=KEYS)
    conf = Path(m["slurm_conf"].str()) if "slurm_conf" in m else default_slurm_conf()
    kw: dict[str, object] = {}
    for key in ("stop_slurmd", "start_slurmd", "restart_slurmctld"):
        if key in m:
            kw[key] = _argv(m[key])
    for key, attr in (("maintenance_ahead", "maintenance_ahead_s"), ("maintenance_window", "maintenance_window_s"),
                      ("register_timeout", "register_timeout_s"), ("command_timeout", "command_timeout_s")):
        if key in m:
            kw[attr] = seconds = m[key].duration()
            if key in BOUNDED and seconds >= WATCHDOG_STALL_S:
                raise m[key].error(f"must be under {WATCHDOG_STALL_S:g}s: migd stops feeding systemd's watchdog "
                                   "after that long without progress, and a Slurm wait is one step")
    if "max_in_maintenance" in m:
        kw["max_in_maintenance"] = m["max_in_maintenance"].int(minimum=1)
    partition = m["partition"].name() if "partition" in m else None
    if "demand" in m:
        kw["demand"] = parse_demand(m["demand"], profiles, partition, kw.get("max_in_maintenance"))  # type: ignore[arg-type]
    for key in ("device_dir", "mig_minors"):
        if key in m:
            kw[key] = Path(m[key].str())
    return SlurmSettings(
        node=m["node"].name() if "node" in m else socket.gethostname().split(".")[0],
        slurm_conf=conf,
        gres_conf=Path(m["gres_conf"].str()) if "gres_conf" in m else conf.parent / "gres.conf",
        update=GresUpdate(m["update"].str(choices=list(GresUpdate))) if "update" in m else GresUpdate.RESTART,
        partition=partition,
        env=m["env"].environment() if "env" in m else (),
        **kw,  # type: ignore[arg-type]
    )
