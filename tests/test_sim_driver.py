"""The simulated driver's capability tables are the real driver's (the recorded mig-minors table), and
device minors are not NVML indices where a fleet says so.  The minors' test needs root (mknod)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from migd.hardware.caps import CapsPaths
from migd.sim import caps
from migd.sim.backend import sim_backend
from migd.sim.devnodes import capability_minors, mig_minors_text, sys_minors_text
from migd.sim.fleets import FLEET_MINORS
from migd.sim.state import StateStore
from tests.helpers import Migctl, need_root

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RECORDED = FIXTURES / "h100-sxm5-580.159.04-driver-files.txt"


def recorded(section: str) -> str:
    """One ``### section`` (or ``== file``) of the driver-files recording, its lines up to the next."""
    lines = RECORDED.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line in (f"### {section}", f"== {section}")) + 1
    out: list[str] = []
    for line in lines[start:]:
        if line.startswith(("###", "==")) or (not line and out and section.startswith("/proc/driver/nvidia/params")):
            break
        out.append(line)
    return "".join(line + "\n" for line in out if line)


def test_the_mig_minors_table_is_the_recorded_one() -> None:
    """All 32 GPU minors, whatever the node has, byte for byte as driver 580.159.04 wrote it; the
    imex capability is in sys-minors (its DeviceFileMinor 4323 as recorded), not in mig-minors."""
    assert mig_minors_text() == (FIXTURES / "h100-sxm5-580.159.04-mig-minors.txt").read_text()
    assert mig_minors_text(1) == mig_minors_text()  # the GPU count callers pass changes nothing
    assert sys_minors_text() == "fabric-imex-mgmt 4323\n"
    assert recorded("/proc/driver/nvidia/capabilities/fabric-imex-mgmt").startswith("DeviceFileMinor: 4323\n")
    assert capability_minors()["gpu31/gi14/ci7/access"] == 4322


ONE_7G = """apiVersion: migd/v1
kind: Profile
name: one
gpus:
  - select: {index: [0]}
    mig: enabled
    instances:
      - {profile: 7g, count: 1}
"""


def test_device_minors_are_not_nvml_indices(tmp_path: Path) -> None:
    """dgx-a100: NVML index 0 is the driver's GPU minor 2; its information file, capabilities and MIG
    device table all say 2."""
    need_root("real character devices (mknod)")
    m = Migctl(tmp_path, "dgx-a100")
    profile = tmp_path / "one.yaml"
    profile.write_text(ONE_7G)
    assert m("apply", str(profile)).code == 0
    backend = sim_backend(m.state, "dgx-a100")
    try:
        minors = [backend.minor_number(i) for i in range(backend.gpu_count())]
    finally:
        backend.close()
    assert minors == FLEET_MINORS["dgx-a100"] and all(i != minor for i, minor in enumerate(minors))
    root = Path(tempfile.mkdtemp(prefix="migd-drv-", dir="/tmp"))
    try:
        root.chmod(0o755)
        caps.enable(StateStore(m.state), root)
        paths = CapsPaths(root)
        gpu0 = StateStore(m.state).read().gpus[0]
        assert paths.gpu_information(gpu0.bus_id).read_text().endswith("Device Minor: \t 2\n")
        gi = gpu0.gis[0].id
        assert paths.proc_file(f"gpu2/gi{gi}/access").exists() and not (paths.proc_caps / f"gpu0/mig/gi{gi}").exists()
        _, (gpu, got_gi, _) = next(iter(caps.mig_devices(root).items()))
        assert (gpu, got_gi) == (2, gi)
    finally:
        shutil.rmtree(root, ignore_errors=True)
