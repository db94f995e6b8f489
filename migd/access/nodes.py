"""Setting one capability to a :class:`~migd.access.policy.NodeMode`, through the interface the driver
offers (``migd.hardware.caps``): the /dev node (created as nvidia-modprobe would, ``DeviceFileModify`` set to 0 so
nvidia-modprobe leaves it alone), or, with the /proc interface, the /proc file itself.

Nothing here follows a symbolic link: a node that is not the character device the driver's minor
names is refused and left alone (someone put something else there), and so is a node directory that
anyone but root could write to.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from migd.access.policy import CLOSED, NodeMode
from migd.hardware.caps import CapsPaths


class AccessError(Exception):
    """A capability could not be set (one line: which, and why)."""


@dataclass(frozen=True)
class Driver:
    """The node side of one node's driver: the paths, the interface in use and the node major."""

    paths: CapsPaths
    devfs: bool
    major: int

    def check_dir(self) -> None:
        """/dev/nvidia-caps must be root's and writable by nobody else (else anyone could swap nodes)."""
        try:
            st = os.lstat(self.paths.dev)
        except FileNotFoundError:
            self.paths.dev.mkdir(mode=0o755, parents=True)
            st = os.lstat(self.paths.dev)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise AccessError(f"{self.paths.dev} is not a directory that only root can write "
                              f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): nodes left alone")

    def set(self, name: str, minor: int, want: NodeMode, exists: bool) -> bool:
        """Make capability ``name`` (minor ``minor``) as ``want``; ``exists``: the driver has it now
        (an instance exists).  True when something changed."""
        if not self.devfs:
            return _set_file(self.paths.proc_file(name), want) if exists else False
        changed = self._set_node(self.paths.node(minor), minor, want)
        if exists:
            changed |= _keep_modify_off(self.paths.proc_file(name))
        return changed

    def _set_node(self, node: Path, minor: int, want: NodeMode) -> bool:
        try:
            st = os.lstat(node)
        except FileNotFoundError:
            if want == CLOSED:
                return False  # absent is as closed as root-only: nvidia-modprobe makes it when needed
            old = os.umask(0)
            try:
                os.mknod(node, stat.S_IFCHR | want.mode, os.makedev(self.major, minor))
            finally:
                os.umask(old)
            os.chown(node, want.uid, want.gid, follow_symlinks=False)
            return True
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(self.major, minor):
            raise AccessError(f"{node} is not the driver's capability node {self.major}:{minor}: left alone")
        return _apply(str(node), st, want)


def _apply(path: str, st: os.stat_result, want: NodeMode) -> bool:
    changed = False
    if (st.st_uid, st.st_gid) != (want.uid, want.gid):
        os.chown(path, want.uid, want.gid, follow_symlinks=False)
        changed = True
    if stat.S_IMODE(st.st_mode) != want.mode:
        os.chmod(path, want.mode)  # (checked a character device above: chmod does not follow it anywhere)
        changed = True
    return changed


def _set_file(path: Path, want: NodeMode) -> bool:
    """/proc interface: the capability file's own owner and mode (proc entries take chown and chmod)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise AccessError(f"{path} is not the driver's capability file: left alone")
    return _apply(str(path), st, want)


def _keep_modify_off(path: Path) -> bool:
    """``DeviceFileModify: 0``, as the MIG user guide does it (``chmod +uw`` then write), so that
    nvidia-modprobe does not set the node back to the driver's ``DeviceFileMode``."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False
    if "DeviceFileModify: 0" in text:
        return False
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise AccessError(f"{path} is not the driver's capability file: left alone")
    if not st.st_mode & stat.S_IWUSR:
        os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)
    with open(path, "w") as f:
        f.write("DeviceFileModify: 0\n")
    return True
