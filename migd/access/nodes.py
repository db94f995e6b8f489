"""Setting one capability to a :class:`~migd.access.policy.NodeMode` through the driver's /dev
interface (``migd.hardware.caps``): ``DeviceFileModify: 0`` first, so that nvidia-modprobe leaves the
node to migd, then the node itself, made as nvidia-modprobe would make it when it is absent.

Why in that order: nvidia-modprobe (setuid root, run by every CUDA program and nvidia-smi) re-makes a
node whose mode differs from the /proc file's ``DeviceFileMode`` while ``DeviceFileModify`` is 1, and
makes nothing at all while it is 0 (nvidia-modprobe-utils.c ``mknod_helper``: "If device file
modification is not allowed, nothing to do").  So a node migd means to be closed must exist, root's
0400, once ``DeviceFileModify`` is 0: absent, nobody could make it, not even for root.

Nothing here follows a symbolic link: a node that is not the character device the driver's minor
names is refused and left as it was (someone put something else there), and so is a node directory
that anyone but root could write to.  Each node is set or refused on its own.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from migd.access.policy import NodeMode
from migd.hardware.caps import CapsPaths

MODIFY_OFF = "DeviceFileModify: 0"


class AccessError(Exception):
    """A capability could not be set (one line: which, and why)."""


@dataclass(frozen=True)
class Driver:
    """The node side of one node's driver: the paths and the node major (the /dev interface)."""

    paths: CapsPaths
    major: int

    def check_dir(self) -> None:
        """/dev/nvidia-caps must be root's and writable by nobody else (else anyone could swap nodes)."""
        try:
            st = os.lstat(self.paths.dev)
        except FileNotFoundError:  # as nvidia-modprobe makes it (nvidia_cap_mknod: 0755 root:root)
            self.paths.dev.mkdir(mode=0o755, parents=True)
            st = os.lstat(self.paths.dev)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise AccessError(f"{self.paths.dev} is not a directory that only root can write "
                              f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): every node left as it was")

    def exists(self, name: str) -> bool:
        """The driver has capability ``name`` now (its /proc file: made and removed with the instance)."""
        return os.path.lexists(self.paths.proc_file(name))

    def present(self, gpu_minor: int) -> list[str]:
        """The GPU's GI and CI capabilities the driver has now (their /proc files), by name."""
        base = self.paths.proc_caps / f"gpu{gpu_minor}" / "mig"
        return sorted(f"gpu{gpu_minor}/{p.relative_to(base)}" for pattern in ("gi*/access", "gi*/ci*/access")
                      for p in base.glob(pattern))

    def modify_on(self, name: str) -> bool:
        """The capability exists and nvidia-modprobe may still set its node (a new one: nv-caps.c
        ``nv_cap_alloc`` starts it at ``NVreg_ModifyDeviceFiles``, 1 by default)."""
        try:
            return MODIFY_OFF not in self.paths.proc_file(name).read_text()
        except FileNotFoundError:
            return False

    def set(self, name: str, minor: int, want: NodeMode) -> bool:
        """Make capability ``name`` (node minor ``minor``) as ``want``: an existing capability's node is
        made if absent; a capability the driver does not have keeps no node but a root-only one.
        True when something changed; AccessError: this node is left as it was."""
        exists = self.exists(name)
        changed = _keep_modify_off(self.paths.proc_file(name)) if exists else False
        return self._set_node(self.paths.node(minor), minor, want, make=exists) or changed

    def _set_node(self, node: Path, minor: int, want: NodeMode, make: bool) -> bool:
        made = False
        try:
            st = os.lstat(node)
        except FileNotFoundError:
            if not make:
                return False  # no capability, no node: nvidia-modprobe cannot make one either
            old = os.umask(0)
            try:  # root's, at most owner-readable, until set as wanted below
                os.mknod(node, stat.S_IFCHR | (want.mode & 0o400), os.makedev(self.major, minor))
            finally:
                os.umask(old)
            st, made = os.lstat(node), True
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(self.major, minor):
            raise AccessError(f"{node} is not the driver's capability node {self.major}:{minor}")
        return _apply(str(node), st, want) or made


def _apply(path: str, st: os.stat_result, want: NodeMode) -> bool:
    """Owner and group before the mode when widening, the mode first when narrowing: at no moment
    is the node open to more accounts than either its old or its new setting allows."""
    changed, mode = False, stat.S_IMODE(st.st_mode)
    if mode & ~want.mode:  # bits to take away: first (a character device: chmod follows nothing)
        mode &= want.mode
        os.chmod(path, mode)
        changed = True
    if (st.st_uid, st.st_gid) != (want.uid, want.gid):
        os.chown(path, want.uid, want.gid, follow_symlinks=False)
        changed = True
    if mode != want.mode:
        os.chmod(path, want.mode)
        changed = True
    return changed


def _keep_modify_off(path: Path) -> bool:
    """``DeviceFileModify: 0``, as the MIG user guide does it (``chmod +uw`` then write), so that
    nvidia-modprobe does not set the node back to the driver's ``DeviceFileMode``."""
    try:
        text = path.read_text()
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise AccessError(f"{path} is not the driver's capability file")
    if MODIFY_OFF in text:
        return False
    if not st.st_mode & stat.S_IWUSR:
        os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)
    with open(path, "w") as f:
        f.write(MODIFY_OFF + "\n")
    return True
