"""``migctl status``: the table or document, read here or from migd; ``--mine``: the MIG devices the
calling user may use, as the kernel will decide it when their CUDA program starts.

A CUDA process on a MIG device opens four files (NVIDIA's MIG user guide, "Device Nodes and
Capabilities"; ``migd.hardware.caps``): ``/dev/nvidiactl`` and ``/dev/nvidia<N>`` read-write (N: the
GPU's device minor, from the driver's ``/proc/driver/nvidia/gpus/<bus>/information`` "Device Minor",
not its NVML index), and the GPU-instance and compute-instance capabilities read-only.  Each is asked
with ``access(2)`` and this process's effective ids: nothing here repeats migd's policy, and a node
an administrator changed by hand answers truthfully.

Those nodes are not all there yet, nor final: CUDA runs ``nvidia-modprobe`` (setuid root), which
makes a missing node and sets an existing one back to the driver's owner and mode whenever
modification is on (``nvidia-modprobe-utils.c``: ``init_device_file_parameters``, ``mknod_helper``,
``nvidia_cap_mknod``).  So an absent node is no refusal by itself, and a node's mode now may not be
the one the next CUDA program meets: :func:`predict` models what nvidia-modprobe will leave, and that
prediction is what counts.  What changes a listed device's answer, and every GPU-wide refusal, is
said on stderr (``note: ...``), so stdout stays one ``CUDA_VISIBLE_DEVICES`` line per device.

Exit: 0 some device is yours, 1 none is, 4 (``HARDWARE``) the driver's files cannot be read here
(no driver, or files this user may not read): then nobody can tell, and "none" would be a guess.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TypeVar

from migd.api.status import Gpu, Instance, StatusDoc
from migd.ctl.remote import caps_root, out
from migd.ctl.text import mine_table, status_table
from migd.exits import Exit, partly
from migd.hardware.caps import CapsPaths, caps_major, ci_cap, gi_cap, modprobe_fields, read_minors, uses_devfs
from migd.numeral import is_whole
from migd.printable import shown

NV_MAJOR = 195  # nvidia-modprobe-utils.h NV_MAJOR_DEVICE_NUMBER: /dev/nvidia<N> is 195:N
CTL_MINOR = 255  # /dev/nvidiactl is 195:255
RW, RO = os.R_OK | os.W_OK, os.R_OK  # CUDA opens nvidiactl and nvidia<N> read-write, a capability read-only
T = TypeVar("T")


def status_out(args: argparse.Namespace, doc: StatusDoc) -> int:
    """``migctl status``'s table or document; ``--mine``: only what this user may open (:func:`mine_out`)."""
    if not args.mine:
        out(args, doc, status_table(doc, args.verbose))
        return partly(Exit.OK, doc.unreadable, bool(doc.gpus))
    return mine_out(args, doc, CapsPaths(Path(caps_root(args))))


def mine_out(args: argparse.Namespace, doc: StatusDoc, paths: CapsPaths) -> int:
    """``--mine`` in any format: the same exit for the table and the documents (0 some, 1 none, 4 unknown)."""
    try:
        mine = usable(doc, paths, Who.me())
    except DriverUnreadable as e:
        print(shown(f"{e}: which MIG devices are yours cannot be told"), file=sys.stderr)
        return Exit.HARDWARE
    out(args, mine.doc, mine_table(mine.doc, os.geteuid(), os.getgroups()))
    for n in mine.notes:
        print(shown(n.note()), file=sys.stderr)
    return Exit.OK if mine.doc.gpus else Exit.NOT_APPLIED


class DriverUnreadable(Exception):
    """A driver file this process cannot read (or that is not there): which devices are the caller's is
    unknown, which is not the same as "none" (a distinct exit)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"cannot read the driver's files ({path}: {why})")


def _read(path: Path, read: Callable[[Path], T]) -> T:
    try:
        return read(path)
    except OSError as e:
        raise DriverUnreadable(path, e.strerror or str(e)) from None


# --- what nvidia-modprobe will do: pure -------------------------------------------------------------

@dataclass(frozen=True)
class Owner:
    """A node's owner, group and permission bits."""

    uid: int
    gid: int
    mode: int

    def __str__(self) -> str:
        return f"{_name(self.uid, 'pwd')}:{_name(self.gid, 'grp')} {self.mode:04o}"


def _name(n: int, db: str) -> str:
    """A user or group by name where this machine knows it (people read the notes), else its number."""
    try:
        return pwd.getpwuid(n).pw_name if db == "pwd" else grp.getgrgid(n).gr_name
    except KeyError:
        return str(n)


@dataclass(frozen=True)
class Recipe:
    """What nvidia-modprobe would give a node, and whether it touches the node at all (``modify``):
    ``rule`` says which field decided, for the notes; ``anyone``: for every user's CUDA programs, not only
    the caller's (then "nothing will make it" is "not for you", not "for nobody")."""

    owner: Owner
    modify: bool
    rule: str
    anyone: bool = True


DEFAULTS = Owner(0, 0, 0o666)  # NV_DEVICE_FILE_UID/GID/MODE: what nvidia-modprobe uses with no file
AS_IS = Recipe(DEFAULTS, False, "the /proc interface: no node")
def recipe(text: str | None, where: str) -> Recipe:
    """``init_device_file_parameters``: DeviceFileUID/GID/Mode and ModifyDeviceFiles (or DeviceFileModify;
    the last read wins) over the defaults; ``text`` None: no file to read (fopen fails), the defaults."""
    uid, gid, mode, modify, key = DEFAULTS.uid, DEFAULTS.gid, DEFAULTS.mode, 1, ""
    for name, value in modprobe_fields(text or ""):
        if name == "DeviceFileUID":
            uid = value
        elif name == "DeviceFileGID":
            gid = value
        elif name == "DeviceFileMode":
            mode = value
        elif name in ("ModifyDeviceFiles", "DeviceFileModify"):
            modify, key = value, name
    rule = f"{key} {modify} in {where}" if key else f"{where} is absent: nvidia-modprobe's defaults" \
        if text is None else f"{where} names no ModifyDeviceFiles: on by default"
    return Recipe(Owner(uid, gid, mode & 0o7777), modify == 1, rule)


def cap_recipe(text: str, real_may_read: bool) -> Recipe:
    """``nvidia_cap_mknod``: nothing unless the caller's *real* uid may read the capability's /proc file
    and its first ``DeviceFileMinor`` is one; then as :func:`recipe` with the file's fields (it has no
    UID/GID: root's)."""
    if not real_may_read:
        return Recipe(DEFAULTS, False, "your real uid may not read its /proc file", anyone=False)
    if next((value for name, value in modprobe_fields(text) if name == "DeviceFileMinor"), -1) < 0:
        return Recipe(DEFAULTS, False, "its /proc file names no DeviceFileMinor, so nvidia-modprobe leaves it")
    return recipe(text, "its /proc file")


class Found(Enum):
    """What ``lstat`` finds at a node's path."""

    ABSENT = "absent"
    DEVICE = "the driver's device"
    SYMLINK = "a symbolic link, not the driver's node (not followed)"
    OTHER = "not the driver's node (another file or device)"


class Fate(Enum):
    KEPT = "kept"  # there, and nvidia-modprobe leaves it as it is
    MADE = "made"  # absent, and nvidia-modprobe makes it
    RESET = "reset"  # there, and nvidia-modprobe sets it back (or removes and remakes it)
    NONE = "none"  # absent, and nothing makes it: nobody can open it, not even root
    FOREIGN = "foreign"  # not the driver's node, left there: not counted


@dataclass(frozen=True)
class Outcome:
    fate: Fate
    owner: Owner | None  # the node CUDA will open; None: none it could use


def predict(found: Found, now: Owner | None, r: Recipe) -> Outcome:
    """The node the next CUDA program meets, after nvidia-modprobe (``mknod_helper``): with modification
    off, what is there; on, the recipe's owner and mode, made if absent, set back if they differ,
    removed and remade if not the driver's device.  A symbolic link is refused whatever the recipe:
    someone put it there, and nothing here follows it (as migd's access by owner does not)."""
    if found is Found.SYMLINK:
        return Outcome(Fate.FOREIGN, None)
    if not r.modify:
        if found is Found.DEVICE:
            return Outcome(Fate.KEPT, now)
        return Outcome(Fate.NONE if found is Found.ABSENT else Fate.FOREIGN, None)
    if found is Found.ABSENT:
        return Outcome(Fate.MADE, r.owner)
    if found is Found.DEVICE and now is not None and (now.uid, now.gid, now.mode & 0o777) == \
            (r.owner.uid, r.owner.gid, r.owner.mode):
        return Outcome(Fate.KEPT, now)
    return Outcome(Fate.RESET, r.owner)


@dataclass(frozen=True)
class Who:
    """The ids the kernel checks an open against: effective uid, and the effective and supplementary gids."""

    uid: int
    groups: frozenset[int]

    @staticmethod
    def me() -> Who:
        return Who(os.geteuid(), frozenset({os.getegid(), *os.getgroups()}))


def permits(owner: Owner, who: Who, want: int) -> bool:
    """The kernel's check of owner, group and mode bits (root may open any device: CAP_DAC_OVERRIDE)."""
    if who.uid == 0:
        return True
    bits = owner.mode >> 6 if who.uid == owner.uid else owner.mode >> 3 if owner.gid in who.groups else owner.mode
    return bits & want == want


@dataclass(frozen=True)
class Node:
    """One of the four files, judged: as it stands, what nvidia-modprobe will make of it, and whether the
    caller may open it then (``yours``) and now.  ``gate``: nvidiactl or a GPU's node, refusing every
    device behind it."""

    what: str
    path: Path
    found: Found
    now: Owner | None
    recipe: Recipe
    outcome: Outcome
    yours: bool
    yours_now: bool
    gate: bool

    def noted(self, device: bool) -> bool:
        """Said on stderr: a GPU-wide refusal or prediction; a capability not there for anyone or not the
        driver's; a capability nvidia-modprobe will make or set back, where its ``device`` (GI and CI) is
        the caller's now or then (another team's devices are not the caller's business)."""
        fate = self.outcome.fate
        if fate in (Fate.NONE, Fate.FOREIGN):
            return True
        if self.gate:
            return fate is not Fate.KEPT or not self.yours
        return fate is not Fate.KEPT and device

    def note(self) -> str:
        now = str(self.now) if self.found is Found.DEVICE else self.found.value
        to = "replaces it with the driver's device" if self.found is Found.OTHER else "sets it back to"
        none = "nothing will make it" if self.recipe.anyone else "nvidia-modprobe makes it for none of your programs"
        then = {Fate.MADE: f"; nvidia-modprobe (run by CUDA) will make it {self.outcome.owner}",
                Fate.RESET: f"; at the next CUDA start nvidia-modprobe {to} {self.outcome.owner}",
                Fate.NONE: f"; {none}"}.get(self.outcome.fate, "")
        rule = f" ({self.recipe.rule})" if then else ""
        nobody = "nobody can open it, not even root" if self.recipe.anyone else "not open to you"
        verdict = {Fate.NONE: nobody, Fate.FOREIGN: "not counted"}.get(
            self.outcome.fate, "open to you" if self.yours else "not open to you")
        return f"note: {self.what}: {self.path}: {now}{then}{rule}: {verdict}"


def look(path: Path, rdev: tuple[int, int]) -> tuple[Found, Owner | None]:
    """``lstat``: never follows a link.  A directory on the way this user may not search is unreadable."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Found.ABSENT, None
    except OSError as e:
        raise DriverUnreadable(path, e.strerror or str(e)) from None
    if stat.S_ISLNK(st.st_mode):
        return Found.SYMLINK, None
    if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(*rdev):
        return Found.OTHER, None
    return Found.DEVICE, Owner(st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))


def _access(path: Path, want: int) -> bool:
    """The kernel's own answer (ACLs included), with this process's effective ids."""
    return os.access(path, want, effective_ids=os.access in os.supports_effective_ids)


def judge(what: str, path: Path, rdev: tuple[int, int], r: Recipe, who: Who, want: int, gate: bool) -> Node:
    found, now = look(path, rdev)
    outcome = predict(found, now, r)
    yours_now = found is Found.DEVICE and _access(path, want)
    yours = yours_now if outcome.fate is Fate.KEPT else outcome.owner is not None and permits(outcome.owner, who, want)
    return Node(what, path, found, now, r, outcome, yours, yours_now, gate)


def proc_gate(what: str, path: Path) -> Node:
    """The deprecated /proc interface: the capability is the /proc file itself, opened as it stands
    (nvidia-modprobe makes no node for it)."""
    st = _read(path, os.lstat)
    if not stat.S_ISREG(st.st_mode):
        found = Found.SYMLINK if stat.S_ISLNK(st.st_mode) else Found.OTHER
        return Node(what, path, found, None, AS_IS, Outcome(Fate.FOREIGN, None), False, False, False)
    owner = Owner(st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    yours = _access(path, RO)
    return Node(what, path, Found.DEVICE, owner, AS_IS, Outcome(Fate.KEPT, owner), yours, yours, False)


# --- the driver's files, and the walk over a status document ----------------------------------------

@dataclass(frozen=True)
class Driver:
    """What the driver says once per call: capability minors, the interface, the caps major, the registry."""

    paths: CapsPaths
    minors: dict[str, int]
    devfs: bool
    major: int
    registry: Recipe

    @staticmethod
    def read(paths: CapsPaths) -> Driver:
        minors = _read(paths.mig_minors, read_minors)
        devfs = _read(paths.devfs_param, lambda _: uses_devfs(paths))
        major = _read(paths.devices, _caps_major) if devfs else 0
        try:
            text: str | None = paths.params.read_text()
        except FileNotFoundError:
            text = None  # nvidia-modprobe's fopen fails too: its defaults
        except OSError as e:  # (it reads as root what this user may not: unknown)
            raise DriverUnreadable(paths.params, e.strerror or str(e)) from None
        return Driver(paths, minors, devfs, major, recipe(text, "/proc/driver/nvidia/params"))

    def gpu_minor(self, pci_bus_id: str) -> int:
        """The GPU's device minor, from its /proc information file."""
        path = self.paths.gpu_information(pci_bus_id)
        for line in _read(path, Path.read_text).splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor" and is_whole(value.strip(), 9):
                return int(value)
        raise DriverUnreadable(path, "no Device Minor line")

    def cap(self, name: str, what: str, who: Who) -> Node:
        if name not in self.minors:
            raise DriverUnreadable(self.paths.mig_minors, f"no {name} line")
        proc = self.paths.proc_file(name)
        if not self.devfs:
            return proc_gate(what, proc)
        r = cap_recipe(_read(proc, Path.read_text), os.access(proc, os.R_OK))  # (real ids, as nvidia-modprobe)
        minor = self.minors[name]
        return judge(what, self.paths.node(minor), (self.major, minor), r, who, RO, False)


def _caps_major(devices: Path) -> int:
    try:
        return caps_major(devices)
    except FileNotFoundError as e:  # (the file missing has a strerror, and _read says so; not listed has none)
        raise (e if e.strerror else DriverUnreadable(devices, "no nvidia-caps character device listed")) from None


@dataclass(frozen=True)
class Mine:
    """The status document holding only what is the caller's, and the nodes worth a note (each once)."""

    doc: StatusDoc
    notes: tuple[Node, ...]


def usable(doc: StatusDoc, paths: CapsPaths, who: Who) -> Mine:
    """``doc`` with only the compute instances ``who`` may use (and the GPU instances holding them);
    GPUs left with none are left out.  Raises :class:`DriverUnreadable` rather than guess."""
    driver = Driver.read(paths)
    ctl = judge("all GPUs", paths.ctl_node, (NV_MAJOR, CTL_MINOR), driver.registry, who, RW, True)
    notes: dict[Path, Node] = {ctl.path: ctl} if ctl.noted(True) else {}
    gpus = []
    for g in doc.gpus:
        kept = _gpu(g, driver, who, notes)
        if kept is not None and ctl.yours:
            gpus.append(kept)
    return Mine(replace(doc, gpus=tuple(gpus)), tuple(notes.values()))


def _gpu(g: Gpu, driver: Driver, who: Who, notes: dict[Path, Node]) -> Gpu | None:
    """One GPU with only the caller's devices (None: none); the nodes worth a note added to ``notes``."""
    minor = driver.gpu_minor(g.pci_bus_id)
    node = judge(f"GPU {g.index}", driver.paths.gpu_node(minor), (NV_MAJOR, minor), driver.registry, who, RW, True)
    if node.noted(True):
        notes.setdefault(node.path, node)
    instances: list[Instance] = []
    for gi in g.instances:
        at = f"GPU {g.index} GI {gi.gi_id}"
        gi_node, cis = driver.cap(gi_cap(minor, gi.gi_id), at, who), []
        for c in gi.compute_instances:
            ci_node = driver.cap(ci_cap(minor, gi.gi_id, c.ci_id), f"{at} CI {c.ci_id}", who)
            then, now = gi_node.yours and ci_node.yours, gi_node.yours_now and ci_node.yours_now
            notes.update((n.path, n) for n in (gi_node, ci_node) if n.noted(then or now) and n.path not in notes)
            if then:
                cis.append(c)
        if cis:
            instances.append(replace(gi, compute_instances=tuple(cis)))
    return replace(g, instances=tuple(instances)) if instances and node.yours else None
