"""The device files a simulated node would have, for tools that look at /dev (Slurm's gres.conf).

The driver's ``/proc/driver/nvidia-caps/mig-minors`` lists every MIG capability and the minor of
its ``/dev/nvidia-caps/nvidia-cap<minor>`` node.  This table follows the layout NVIDIA's driver
writes (config 1, monitor 2, then per GPU minor and GI id the GI's access cap and its eight CI
caps: gpu0/gi2/access is 21, as in the MIG user guide's example); the exact table of a given
driver is **unconfirmed** here.  migd itself never computes a minor: it reads this file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from migd.hardware.caps import ci_cap, gi_cap

GIS_PER_GPU = 15  # GI ids 0..14 (the memory-slice tree: sim/gpu.py gi_id_for)
CIS_PER_GI = 8


def mig_minors_text(gpus: int) -> str:
    lines, minor = ["config 1", "monitor 2"], 3
    for g in range(gpus):
        for gi in range(GIS_PER_GPU):
            lines.append(f"{gi_cap(g, gi)} {minor}")
            minor += 1
            for ci in range(CIS_PER_GI):
                lines.append(f"{ci_cap(g, gi, ci)} {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def make_device_nodes(root: Path, gpus: int, caps_major: int = 511) -> Path:
    """``root/nvidia<N>`` (char 195:N) and ``root/nvidia-caps/nvidia-cap<M>`` for every minor, plus
    ``root/mig-minors``; needs CAP_MKNOD (root), as the nodes are real character devices."""
    caps = root / "nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    for g in range(gpus):
        _mknod(root / f"nvidia{g}", 195, g)
    text = mig_minors_text(gpus)
    for line in text.splitlines():
        minor = int(line.split()[1])
        _mknod(caps / f"nvidia-cap{minor}", caps_major, minor)
    (root / "mig-minors").write_text(text)
    return root / "mig-minors"


def _mknod(path: Path, major: int, minor: int) -> None:
    if not path.exists():
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
