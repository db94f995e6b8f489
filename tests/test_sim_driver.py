"""The simulated driver's capability tables are the real driver's: the recorded mig-minors table."""

from __future__ import annotations

from pathlib import Path

from migd.sim.devnodes import capability_minors, mig_minors_text, sys_minors_text

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
