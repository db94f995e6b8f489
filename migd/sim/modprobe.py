"""A simulated nvidia-modprobe: ``python -m migd.sim.modprobe --caps-root ROOT [-c MINOR]... [-f CAP_FILE]...``
makes the NVIDIA device files of a simulated node (``migd.sim.caps``) exactly as nvidia-modprobe does.

Why this module is only the command: what nvidia-modprobe does to the files is
``migd.sim.modprobe_rules`` (each function the C function of the same name in nvidia-modprobe 580.159.04),
and who may have it done, the setuid bit, is ``migd.sim.modprobe_helper``.  The command runs as whoever
calls it: as root it makes the files itself, as an ordinary user it asks the node's helper, as a
setuid-root binary would; with no helper on the node (nvidia-modprobe not installed setuid) an ordinary
user's call fails with EPERM.

:func:`run` (the rules with this process's ids) and :func:`request` (as the caller would run the setuid
binary: what the simulated CUDA program does) are named here as well, for their many callers.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence

from migd.sim.modprobe_helper import request
from migd.sim.modprobe_rules import parser, run

__all__ = ["main", "request", "run"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser(__doc__.split("\n\n")[0])
    ns, rest = ap.parse_known_args(argv)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    args = [*(x for m in ns.minors for x in ("-c", str(m))), *(x for f in ns.cap_files for x in ("-f", f))]
    code = request(ns.caps_root, args)
    if code is None:
        print(f"nvidia-modprobe: {os.strerror(errno.EPERM)}: not root, and nvidia-modprobe is not installed "
              f"setuid root on this simulated node", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
