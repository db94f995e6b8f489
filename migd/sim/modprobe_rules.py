"""nvidia-modprobe's rules for making the NVIDIA device files of a simulated node (``migd.sim.caps``),
exactly as nvidia-modprobe does: :func:`run` is ``nvidia-modprobe.c`` ``main`` for ``-c``/``-f``, with
the calling process's ids.

Why a module of its own: these are the rules, apart from who may run them.  The command
(``migd.sim.modprobe``) and the setuid helper (``migd.sim.modprobe_helper``, which runs :func:`run` for
ordinary users as a setuid-root binary would) stand on it; it reads the driver's files only through
``migd.sim.caps_tree``, the lowest of the simulated driver's modules.

Source: NVIDIA/nvidia-modprobe tag 580.159.04 (the recorded driver's release), ``nvidia-modprobe.c``
``main`` and ``modprobe-utils/nvidia-modprobe-utils.c``; each function below is the C function of the
same name, every path under ROOT instead of /:

- ``-c MINOR`` (``nvidia_mknod``): ``/dev/nvidia<MINOR>`` (``/dev/nvidiactl`` for 255), char major 195,
  owner, group and mode from the registry ``/proc/driver/nvidia/params`` (``ModifyDeviceFiles``,
  ``DeviceFileUID``/``GID``/``Mode``).
- ``-f CAP_FILE`` (``nvidia_cap_mknod``): refused unless CAP_FILE starts with ``/proc/driver/nvidia``,
  has no ``./``, and the caller's **real** uid may read it (``access(R_OK)``); the minor is its
  ``DeviceFileMinor``, the major ``nvidia-caps`` of ``/proc/devices``; ``/dev/nvidia-caps`` is made
  0755 root:root if absent; then ``/dev/nvidia-caps/nvidia-cap<minor>`` with CAP_FILE's
  ``DeviceFileMode``, uid and gid 0 (the file names neither).
- Both through ``mknod_helper``: while the parameters' modify flag is not 1, nothing is done to the node
  (not even made when absent); else a node that ``stat`` (which follows symbolic links) shows as the
  right character device with the right mode (``& 0777``) and owner is left alone, a wrong one is
  ``remove``d (a symbolic link itself, not its target) and made again (``mknod`` under the caller's
  umask), then ``chmod`` and ``chown`` (which follow links).  Each success also links
  ``/dev/char/<major>:<minor>`` to the node (``symlink_char_dev``), whose failure is the command's.
- The parameters are read as ``fscanf(fp, "%31[^:]: %u\\n", ...)`` in a loop: up to the first line that
  is not ``name: number`` (``init_device_file_parameters``); an unreadable file leaves the defaults
  (mode 0666, uid 0, gid 0, modify 1).

One deviation: /dev/nvidia<N> and /dev/nvidiactl take the ``nvidia`` major of the simulated
``/proc/devices`` (195, as nvidia-modprobe hard-codes, unless this machine's own driver holds 195: see
``migd.sim.caps.nvidia_major``).  The module is always loaded (``sys/module/nvidia/initstate``):
loading one is not modelled.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from migd.hardware.caps import CapsPaths, modprobe_fields
from migd.sim.caps_tree import proc_read
from migd.sim.devnodes import CTL_MINOR, NVIDIA_MAJOR

NV_DEVICE_FILE_MODE = 0o666  # S_IRUSR|S_IWUSR|S_IRGRP|S_IWGRP|S_IROTH|S_IWOTH
NV_DEVICE_FILE_MODE_MASK = 0o777  # S_IRWXU|S_IRWXG|S_IRWXO
NV_CAPS_MODULE_NAME = "nvidia-caps"


@dataclass(frozen=True)
class FileParams:
    uid: int
    gid: int
    mode: int
    modify: int


def nv_make_device(major: int, minor: int) -> int:
    """NV_MAKE_DEVICE: ``(minor & 0xff) | (major << 8) | ((minor & ~0xff) << 12)``."""
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def _read(paths: CapsPaths, path: Path) -> str:
    """A file as nvidia-modprobe reads it (a capability's /proc file: as the driver serves it)."""
    return proc_read(paths, path) if path.is_relative_to(paths.proc_caps) else path.read_text()


def init_device_file_parameters(paths: CapsPaths, proc_path: Path | None) -> FileParams:
    uid, gid, mode, modify = 0, 0, NV_DEVICE_FILE_MODE, 1
    if proc_path is None:
        return FileParams(uid, gid, mode, modify)
    try:
        text = _read(paths, proc_path)
    except OSError:
        return FileParams(uid, gid, mode, modify)
    for name, raw in modprobe_fields(text):
        value = raw % 2**32  # %u
        if name == "DeviceFileUID":
            uid = value
        if name == "DeviceFileGID":
            gid = value
        if name == "DeviceFileMode":
            mode = value
        if name in ("ModifyDeviceFiles", "DeviceFileModify"):
            modify = value
    return FileParams(uid, gid, mode, modify)


def get_file_state_helper(path: Path, major: int, minor: int, p: FileParams) -> tuple[bool, bool, bool]:
    """(exists, the right character device, the right mode and owner), by ``stat`` (following links)."""
    try:
        st = os.stat(path)
    except OSError:
        return False, False, False
    chr_ok = stat.S_ISCHR(st.st_mode) and st.st_rdev == nv_make_device(major, minor)
    perm_ok = (st.st_mode & NV_DEVICE_FILE_MODE_MASK) == p.mode and st.st_uid == p.uid and st.st_gid == p.gid
    return True, chr_ok, perm_ok


def _remove(path: Path) -> None:
    """C ``remove(3)``: unlink (a symbolic link itself), or rmdir for a directory."""
    try:
        os.unlink(path)
    except IsADirectoryError:
        os.rmdir(path)
    except PermissionError as e:
        if not path.is_dir() or path.is_symlink():
            raise e from None
        os.rmdir(path)


def symlink_char_dev(paths: CapsPaths, major: int, minor: int, dev_path: Path) -> bool:
    """``/dev/char/<major>:<minor>`` -> ``../<the node under /dev>``; False when the node is not a
    character device (or is absent)."""
    dev = paths.dev.parent
    link = dev / "char" / f"{major}:{minor}"
    try:
        dev_status = os.stat(dev_path)
    except OSError:
        return False
    if not stat.S_ISCHR(dev_status.st_mode) or not dev_path.is_relative_to(dev):
        return False
    rel = "../" + str(dev_path.relative_to(dev))
    try:
        _remove(link)
    except OSError:
        pass
    try:
        os.symlink(rel, link)
    except OSError:
        try:
            if os.stat(link).st_ino != dev_status.st_ino:
                return False
        except OSError:
            return False
    return True


def mknod_helper(paths: CapsPaths, major: int, minor: int, path: Path | None, proc_path: Path | None) -> bool:
    if path is None:
        return False
    p = init_device_file_parameters(paths, proc_path)
    if p.modify != 1:  # "If device file modification is not allowed, nothing to do: success."
        return symlink_char_dev(paths, major, minor, path)
    exists, chr_ok, perm_ok = get_file_state_helper(path, major, minor, p)
    if exists and chr_ok and perm_ok:
        return symlink_char_dev(paths, major, minor, path)
    do_mknod = not exists
    if not do_mknod and not chr_ok:  # not a character device, or the wrong one: delete it, make it again
        try:
            _remove(path)
        except OSError:
            return False
        do_mknod = True
    if do_mknod:
        try:
            os.mknod(path, stat.S_IFCHR | p.mode, nv_make_device(major, minor))
        except (OSError, ValueError):
            return False
    try:
        os.chmod(path, p.mode)
        os.chown(path, p.uid, p.gid)
    except (OSError, ValueError):
        if do_mknod:
            try:
                _remove(path)
            except OSError:
                pass
        return False
    return symlink_char_dev(paths, major, minor, path)


def assign_device_file_name(paths: CapsPaths, minor: int) -> Path | None:
    if minor < 0 or minor > CTL_MINOR:
        return None
    return paths.ctl_node if minor == CTL_MINOR else paths.gpu_node(minor)


def nvidia_get_chardev_major(paths: CapsPaths, name: str) -> int:
    """The major of ``name`` in the 'Character devices:' section of /proc/devices, or -1."""
    try:
        lines = paths.devices.read_text().splitlines(keepends=True)
    except OSError:
        return -1
    try:
        start = lines.index("Character devices:\n") + 1
    except ValueError:
        return -1
    for line in lines[start:]:
        if line == "\n":
            break
        found = line.find(name)
        if found >= 0 and line[found + len(name):found + len(name) + 1] == "\n":  # no partial match
            m = re.match(r"\s*([+-]?\d+)\s+\S", line)
            return int(m.group(1)) if m else -1
    return -1


def nvidia_mknod(paths: CapsPaths, minor: int) -> bool:
    major = nvidia_get_chardev_major(paths, "nvidia")  # (the deviation: the module docstring)
    return mknod_helper(paths, major if major >= 0 else NVIDIA_MAJOR, minor, assign_device_file_name(paths, minor),
                        paths.params)


def nvidia_cap_get_device_file_attrs(paths: CapsPaths, cap_file_path: Path) -> tuple[int, int, Path] | None:
    major = nvidia_get_chardev_major(paths, NV_CAPS_MODULE_NAME)
    if major < 0:
        return None
    try:
        text = _read(paths, cap_file_path)
    except OSError:
        return None
    minor = -1
    for name, value in modprobe_fields(text):
        if name == "DeviceFileMinor":
            minor = value
            break
    if minor < 0:
        return None
    return major, minor, paths.node(minor)


def nvidia_cap_mknod(paths: CapsPaths, cap_file_path: str) -> bool:
    # "Verify the path prefix is an absolute path to the NVIDIA driver /proc" (NV_PROC_PATH_PREFIX)
    if not cap_file_path.startswith(str(paths.params.parent)) or "./" in cap_file_path:
        return False
    if not os.access(cap_file_path, os.R_OK):  # "Check if the (real) user has access to the path"
        return False
    attrs = nvidia_cap_get_device_file_attrs(paths, Path(cap_file_path))
    if attrs is None:
        return False
    major, minor, name = attrs
    try:
        os.mkdir(paths.dev, 0o755)
    except FileExistsError:
        pass
    except OSError:
        return False
    else:
        try:
            os.chmod(paths.dev, 0o755)
            os.chown(paths.dev, 0, 0)
        except OSError:
            return False
    return mknod_helper(paths, major, minor, name, Path(cap_file_path))


def nvidia_modprobe(paths: CapsPaths) -> bool:
    """The module is loaded when ``/sys/module/nvidia/initstate`` may be read (``is_kernel_module_loaded``);
    loading it is not modelled."""
    return os.access(paths.devfs_param.parents[1] / "initstate", os.R_OK)


def parser(description: str | None = None) -> argparse.ArgumentParser:
    """The command line of ``python -m migd.sim.modprobe`` (``migd.sim.modprobe``), which :func:`run` takes too."""
    ap = argparse.ArgumentParser(prog="python -m migd.sim.modprobe", description=description)
    ap.add_argument("--caps-root", required=True, type=Path, help="the simulated node's root (migd.sim.caps)")
    ap.add_argument("-c", "--create-nvidia-device-file", dest="minors", type=int, action="append", default=[],
                    metavar="MINOR-NUMBER")
    ap.add_argument("-f", "--nvidia-capability-device-file", dest="cap_files", action="append", default=[],
                    metavar="CAP-FILE-PATH")
    return ap


def run(root: Path, args: Sequence[str]) -> int:
    """nvidia-modprobe.c ``main`` for ``-c``/``-f``, with this process's ids: 0, or 1 on the first failure."""
    ns = parser().parse_args(["--caps-root", str(root), *args])
    paths = CapsPaths(root)
    ok = nvidia_modprobe(paths)
    for minor in ns.minors if ok else ():
        ok = nvidia_mknod(paths, minor)
        if not ok:
            break
    for cap_file in ns.cap_files if ok else ():
        ok = nvidia_cap_mknod(paths, cap_file)
        if not ok:
            break
    return 0 if ok else 1
