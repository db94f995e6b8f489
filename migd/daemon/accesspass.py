"""Access by owner in the daemon: built from the configuration, kept true at start and every pass.

In Slurm mode it stays off unless ``access.with_slurm`` is set: Slurm's cgroup device constraint
(``ConstrainDevices=yes``, cgroup.conf(5)) already decides which job may open which capability node,
and two owners of the same nodes would fight (docs/users.md, "With Slurm")."""

from __future__ import annotations

import logging

from migd.access.enforce import PROC_INTERFACE, AccessControl
from migd.api.access import AccessView
from migd.apply.executor import Applier
from migd.config.migdyaml import Config, unmapped_owners
from migd.errors import ValidationError
from migd.hardware.caps import registry_modify, uses_devfs
from migd.hardware.ports import GpuBackend

log = logging.getLogger("migd")


def access_control(config: Config, backend: GpuBackend, applier: Applier) -> AccessControl | None:
    """The configured access control, set on the applier (None, and unset, when there is none).
    ValidationError (the applier untouched) where the driver offers only the /proc interface."""
    s = config.access
    if s is None:
        applier.access = None
        return None
    if config.slurm is not None and not s.with_slurm:
        applier.access = None
        log.warning("access by owner is off in Slurm mode: Slurm's cgroups decide which job opens which "
                    "capability node (access.with_slurm: true has migd set the nodes as well)")
        return None
    for line in unmapped_owners(config):  # (migd --check says the same)
        log.warning("%s", line)
    if not uses_devfs(s.policy.paths):  # refused, not worked around: see PROC_INTERFACE
        raise ValidationError(config.path, None, None, "access", PROC_INTERFACE)
    if registry_modify(s.policy.paths) != 0:
        log.warning("access by owner: the driver's ModifyDeviceFiles is 1 (NVreg_ModifyDeviceFiles): for the moment "
                    "between the driver making an instance and migd closing it, any user's CUDA program can have "
                    "nvidia-modprobe open its node; migd keeps such an instance from its owner while that process "
                    "holds it. Loading the nvidia module with NVreg_ModifyDeviceFiles=0 closes that moment "
                    "(docs/users.md)")
    control = AccessControl(s.policy, backend, applier.owners.load)
    applier.access = control
    return control


def view(control: AccessControl) -> AccessView:
    p = control.policy
    return AccessView({o: p.accounts(o) for o in sorted(p.owners)}, p.unowned.value,
                      "dev" if uses_devfs(p.paths) else "proc", str(p.paths.root), control.changes,
                      tuple(control.errors), tuple(sorted(control.missing)))
