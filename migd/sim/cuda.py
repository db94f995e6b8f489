"""A simulated CUDA program: ``python -m migd.sim.cuda --caps-root ROOT [--device MIG-UUID] [--mib N]
-- COMMAND...`` starts COMMAND as a CUDA process on one MIG device of a simulated node whose
capability tree (``migd.sim.caps``) lives under ROOT, as the user who runs it.

What the CUDA driver does first, it does: find the MIG device (``--device``, else the first entry of
``CUDA_VISIBLE_DEVICES``), open its GPU-instance and compute-instance capabilities (the /dev nodes,
or the /proc files with the /proc interface), and give up when the kernel refuses either: CUDA then
sees no device ("no CUDA-capable device is detected", CUDA_ERROR_NO_DEVICE, exit 100; the exact
wording a real driver gives for a refused capability is not documented).  On success it leaves a
claim for the simulated driver (which checks it again with this process's credentials) and becomes
COMMAND, keeping its pid, so the simulated GPU shows it until it exits.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from migd.hardware.caps import CapsPaths, ci_cap, gi_cap, read_minors, uses_devfs
from migd.sim.caps import CLAIMS, mig_devices

NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE


def _refuse(why: str) -> int:
    print(f"CUDA error: no CUDA-capable device is detected (migd-sim: {why})", file=sys.stderr)
    return NO_DEVICE


def _open_cap(path: Path) -> str | None:
    """None when the kernel lets this process open ``path`` (a simulated node has no driver behind
    it: ENXIO then), else why not."""
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ENODEV):
            return None
        return f"{path}: {e.strerror}"
    return None


def attach(root: Path, device: str) -> str | None:
    """Open ``device``'s capabilities: None, or why the kernel (or the driver) refused."""
    table = mig_devices(root)
    if device not in table:
        return f"{device} is not a MIG device of this node"
    gpu, gi, ci = table[device]
    paths = CapsPaths(root)
    devfs, minors = uses_devfs(paths), read_minors(paths.mig_minors)
    for name in (gi_cap(gpu, gi), ci_cap(gpu, gi, ci)):
        why = _open_cap(paths.opened(name, minors[name], devfs))
        if why is not None:
            return f"no access to capability {name} ({why})"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m migd.sim.cuda", description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps-root", required=True, type=Path)
    ap.add_argument("--device", default=None, help="MIG-UUID (default: CUDA_VISIBLE_DEVICES' first)")
    ap.add_argument("--mib", type=int, default=256, help="memory the program uses (default 256)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    device = args.device or (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if not cmd or not device:
        ap.error("needs a MIG device (--device or CUDA_VISIBLE_DEVICES) and -- COMMAND")
    why = attach(args.caps_root, device)
    if why is not None:
        return _refuse(why)
    claim = args.caps_root / CLAIMS / str(os.getpid())
    fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(f"{device} {args.mib}\n")
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)
    return 0  # (not reached)


if __name__ == "__main__":
    sys.exit(main())
