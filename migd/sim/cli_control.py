"""``migd-sim process|xid|lose|return|slow|driver``: what the world does to a simulated node, from a shell.

Each subcommand is one call of :mod:`migd.sim.world` (``driver``: of :mod:`migd.sim.caps`) on the node
that ``migd`` and ``migctl`` run against (``--sim FLEET``, its state file under ``$TMPDIR/migd-sim-UID/``,
or ``--sim-state PATH``), so an operator rehearsing day one can start a workload, raise an Xid, lose a
GPU, slow the driver down or load it with its device files while migd runs, without writing Python.
Bad input is one line on stderr and exit 2, and then nothing in the simulated state has changed: every
check runs inside the transaction that would write it (``driver``: before it writes anything).
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from migd import cliargs
from migd.errors import ValidationError
from migd.numeral import whole
from migd.paths import sim_root
from migd.printable import clipped
from migd.sim import caps, world
from migd.sim.state import FLEETS, StateStore
from migd.trust import check_above, ensure_private_dir

MAX_SLOW_S = 60.0  # a typo (3000 for 3) would hold every apply for hours: beyond this is refused


class BadInput(Exception):
    """What the command line refuses: one line, exit 2, nothing changed."""


def add_node_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sim", metavar="FLEET", default=os.environ.get("MIGD_SIM"),
                   help="the simulated node migd and migctl were given as --sim FLEET (default: $MIGD_SIM)")
    p.add_argument("--sim-state", metavar="PATH", default=os.environ.get("MIGD_SIM_STATE"),
                   help="its state file, where migd and migctl were given --sim-state (default: $MIGD_SIM_STATE)")


def _node(args: argparse.Namespace) -> StateStore:
    """The node's state file, which must exist: these commands act on a node, they never make one."""
    if args.sim_state:
        path, how = Path(args.sim_state), f"--sim FLEET --sim-state {args.sim_state}"
    elif args.sim:
        if args.sim not in FLEETS:
            raise BadInput(f"unknown fleet {args.sim!r} (known: {', '.join(sorted(FLEETS))})")
        path, how = sim_root() / f"{args.sim}.json", f"--sim {args.sim}"
    else:
        raise BadInput("which simulated node? give --sim FLEET (as migd and migctl were given) or --sim-state PATH")
    if not path.is_file():
        raise BadInput(f"no simulated node at {path}: run migd or migctl with {how} first")
    if not args.sim_state:
        try:
            ensure_private_dir(sim_root(), "the simulator's directory")
        except ValidationError as e:
            raise BadInput(str(e)) from None
    try:
        store = StateStore(path)
        store.read()
    except KeyError as e:
        raise BadInput(f"{path} is not a simulator state file (no {e})") from None
    except (OSError, ValueError, TypeError) as e:
        raise BadInput(f"{path} is not a simulator state file ({e})") from None
    return store


def _mig_device(store: StateStore, uuid: str) -> tuple[int, int, int]:
    for g in store.read().gpus:
        for gi, ci in g.mig_devices():
            if g.mig_uuid(gi, ci) == uuid:
                return g.index, gi.id, ci.id
    raise BadInput(f"no MIG device {uuid} on this node (migctl status lists them)")


def _target(args: argparse.Namespace, store: StateStore) -> tuple[int, int | None, int | None]:
    """(GPU, GI, CI) from ``--device MIG-...`` or ``--gpu N [--gi G [--ci C]]``."""
    if args.device is not None:
        if args.gpu is not None or args.gi is not None or args.ci is not None:
            raise BadInput("give --device MIG-... or --gpu N [--gi G --ci C], not both")
        return _mig_device(store, args.device)
    if args.gpu is None:
        raise BadInput("which GPU? give --gpu N (with --gi G for a MIG device) or --device MIG-...")
    if args.ci is not None and args.gi is None:
        raise BadInput("--ci names a compute instance of a GPU instance: give --gi too")
    return args.gpu, args.gi, args.ci


def _memory(text: str) -> int | None:
    if text == "unknown":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB or 'unknown'") from None


def _seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(s) and 0 <= s <= MAX_SLOW_S):
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and {MAX_SLOW_S:g} seconds")
    return s


def process_start(args: argparse.Namespace, store: StateStore) -> str:
    gpu, gi, ci = _target(args, store)
    pid = world.start_process(store, gpu, gi, 0 if ci is None else ci, args.memory, args.pid, check=True)
    return str(pid)


def process_stop(args: argparse.Namespace, store: StateStore) -> str:
    world.stop_process(store, args.pid, must_exist=True)
    return f"process {args.pid} stopped"


def xid(args: argparse.Namespace, store: StateStore) -> str:
    gpu, gi, ci = _target(args, store)
    leak = tuple(args.leak_to or ())
    world.raise_xid(store, gpu, args.xid, gi, ci, leak, check=True)
    where = f"GPU {gpu}" + (" (GPU-wide)" if gi is None else f" GI {gi}" + (f" CI {ci}" if ci is not None else ""))
    return f"Xid {args.xid} on {where}" + (f"; it also broke GI {', '.join(map(str, leak))}" if leak else "")


def lose(args: argparse.Namespace, store: StateStore) -> str:
    was = world.set_lost(store, args.gpu, True)
    return f"GPU {args.gpu} " + ("was already lost" if was else
                                "lost: every NVML call on it answers GPU_IS_LOST until `migd-sim return`")


def give_back(args: argparse.Namespace, store: StateStore) -> str:
    was = world.set_lost(store, args.gpu, False)
    return f"GPU {args.gpu} " + ("answers again, as it was when lost" if was else "was not lost")


def slow(args: argparse.Namespace, store: StateStore) -> str:
    world.set_mutation_delay(store, args.seconds)
    return f"every mutating NVML call now takes {args.seconds:g} s" if args.seconds else \
        "mutating NVML calls take no extra time"


BOOTED = ".migd-sim-driver"  # what a boot leaves in its root: a later boot may clear that root again
BOOT_DIRS = frozenset({"proc", "dev", "sys", "run", BOOTED})


def driver(args: argparse.Namespace, store: StateStore) -> str:
    """The node's driver loaded with its files (/proc, /dev, /sys) under ``--caps-root``, as a boot makes
    them, so ``access:`` in migd.yaml and ``migctl status --mine`` can be tried.  A boot clears what it
    makes there, as root: the directory must be new, empty or a boot's own, and root's throughout, never
    a tree it could wipe or another user could point elsewhere."""
    if os.geteuid() != 0:
        raise BadInput("needs root: the driver's device nodes are made with mknod (run it with sudo)")
    root = _boot_root(args.caps_root)
    fd = os.open(root / BOOTED, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:  # (first: a boot that fails part-way may be run again over its own files)
        f.write("a simulated NVIDIA driver's files, made by migd-sim driver\n")
    caps.enable(store, root, setuid_modprobe=False)
    return (f"the simulated driver's files are under {root}: proc/driver/nvidia*, dev/nvidia-caps (no setuid "
            f"nvidia-modprobe, as on the recorded H100); give migd `access: {{root: {root}}}` to serve them")


def _boot_root(given: str) -> Path:
    """``given`` made (0755) or checked: root's and writable by nobody else, as is every directory above it
    (a sticky one aside) and every entry in it (an earlier boot's own, nothing else); no symbolic link on
    the way.  Checked before anything is made: a refused directory is left as it was, or never made."""
    root = Path(os.path.abspath(given))
    if root == Path("/"):
        raise BadInput("the root directory is no place for a simulated driver: give a new or empty directory")
    if os.path.realpath(root) != str(root):
        raise BadInput(f"{root} passes through a symbolic link: give the real path ({os.path.realpath(root)})")
    try:
        check_above(root, "directory given")
        root.mkdir(mode=0o755)
    except FileExistsError:
        pass
    except ValidationError as e:
        raise BadInput(str(e)) from None
    except OSError as e:
        raise BadInput(f"{root}: cannot make it ({e.strerror})") from None
    _root_only(root, os.lstat(root), "a boot writes there as root, so it must be root's and writable by nobody else "
               "(give a new directory)")
    held = {e.name: e for e in os.scandir(root)}
    if held and (BOOTED not in held or not set(held) <= BOOT_DIRS):
        raise BadInput(f"{root} holds {', '.join(sorted(set(held) - {BOOTED}))[:200]}: give a new or empty "
                       "directory (a boot clears its proc, dev and run/nvidia-sim)")
    for name, entry in held.items():
        _root_only(root / name, entry.stat(follow_symlinks=False), "not what a boot made: give a new or empty "
                   "directory", regular=name == BOOTED)
    return root


def _root_only(path: Path, st: os.stat_result, why: str, regular: bool = False) -> None:
    """``path`` (``st``: its lstat) a directory (a regular file if ``regular``) of root's that nobody else may
    write, or refused with ``why``."""
    kind = stat.S_ISREG if regular else stat.S_ISDIR
    if not kind(st.st_mode) or st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        what = "a regular file" if regular else "a directory"
        raise BadInput(f"{path} is {what if kind(st.st_mode) else 'not ' + what}, uid {st.st_uid}'s, mode "
                       f"{stat.S_IMODE(st.st_mode):04o}: {why}")

Handler = Callable[[argparse.Namespace, StateStore], str]


def _whole(text: str) -> int:
    """A GPU index, instance id, pid or Xid: ASCII digits, at most nine (``int`` took ``٣`` as 3, and an Xid of
    23 digits was cut to 64 bits where migd read it)."""
    number = whole(text.strip(), 9)
    if number is None:
        raise ValueError(f"must be a whole number of at most 9 digits, not {clipped(text)!r}")
    return number


index = cliargs.typed(_whole)


def _target_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", type=index, metavar="N", help="the GPU's index (as migctl status numbers them)")
    p.add_argument("--gi", type=index, metavar="G", help="a GPU instance of it (the GI column of migctl status)")
    p.add_argument("--ci", type=index, metavar="C", help="a compute instance of that GI (default: 0)")
    p.add_argument("--device", metavar="MIG-UUID", help="the MIG device instead of --gpu/--gi/--ci")


def add_commands(sub: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    """The subcommands, each with ``handler`` set to the function that runs it."""
    proc = sub.add_parser("process", help="start or stop a simulated CUDA process")
    psub = proc.add_subparsers(dest="action", required=True, metavar="start|stop")
    start = psub.add_parser("start", parents=[common], help="a fake CUDA process on a GPU or MIG device; "
                            "prints its pid")
    _target_options(start)
    start.add_argument("--memory", type=_memory, default=1024, metavar="MIB",
                       help="GPU memory it uses, in MiB, or 'unknown' (default: %(default)s)")
    start.add_argument("--pid", type=index, help="list this running process instead of a fake pid (forgotten "
                       "when it exits)")
    start.set_defaults(handler=process_start)
    stop = psub.add_parser("stop", parents=[common], help="end a simulated process")
    stop.add_argument("pid", type=index, metavar="PID")
    stop.set_defaults(handler=process_stop)
    x = sub.add_parser("xid", parents=[common], help="raise an Xid on a GPU (GPU-wide) or on an instance")
    x.add_argument("xid", type=index, metavar="XID", help="the Xid number (79: fallen off the bus; 31: page fault)")
    _target_options(x)
    x.add_argument("--leak-to", type=index, action="append", metavar="GI",
                   help="another GPU instance the fault also breaks (an isolation breach); repeatable")
    x.set_defaults(handler=xid)
    for name, fn, what in (("lose", lose, "the GPU falls off the bus (NVML: GPU_IS_LOST)"),
                           ("return", give_back, "a lost GPU answers again")):
        p = sub.add_parser(name, parents=[common], help=what)
        p.add_argument("--gpu", type=index, metavar="N", required=True, help="the GPU's index")
        p.set_defaults(handler=fn)
    d = sub.add_parser("driver", parents=[common], help="load the node's driver with its /proc and /dev files "
                       "under ROOT (root only)")
    d.add_argument("--caps-root", metavar="ROOT", required=True, help="a new or empty directory (or an earlier "
                   "boot's)")
    d.set_defaults(handler=driver)
    s = sub.add_parser("slow", parents=[common], help="every mutating NVML call takes SECONDS (0: normal)")
    s.add_argument("seconds", type=_seconds, metavar="SECONDS")
    s.set_defaults(handler=slow)


def run(args: argparse.Namespace) -> int:
    handler: Handler = args.handler
    try:
        print(handler(args, _node(args)))
    except (BadInput, world.SimError) as e:
        name = " ".join(x for x in (args.command, getattr(args, "action", None)) if x)
        print(f"migd-sim {name}: {e}", file=sys.stderr)
        return 2
    return 0
