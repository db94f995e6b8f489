"""Any NVML client runs over the simulator (issue 31, item 4): every function pynvml wraps resolves in
the simulated library, as in a real libnvidia-ml (none answers FUNCTION_NOT_FOUND), and independent,
unmodified NVML clients from PyPI (nvitop, gpustat) list every GPU and MIG device of a simulated fleet
in MIG mode without a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from migd.sim.entry_board import pynvml_names
from migd.sim.state import StateStore
from tests.helpers import PROFILES, Migctl


def test_every_function_pynvml_wraps_resolves(tmp_path: Path) -> None:
    from migd.sim.backend import load_library
    load_library(tmp_path / "s.json", "dgx-h100")
    names = sorted(pynvml_names())
    assert len(names) > 300  # (nvidia-ml-py 13.x wraps about 400)
    missing = []
    for name in names:
        try:
            pynvml._nvmlGetFunctionPointer(name)
        except pynvml.NVMLError_FunctionNotFound:
            missing.append(name)
    assert missing == []


def test_an_unmodelled_function_answers_as_a_driver_does(tmp_path: Path) -> None:
    """NOT_SUPPORTED after the checks every entry point makes: a lost GPU is lost, a bad handle invalid."""
    from migd.sim import control
    from migd.sim.backend import load_library
    load_library(tmp_path / "s.json", "dgx-h100")
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        control.set_lost(StateStore(tmp_path / "s.json"), 1)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        assert pynvml.nvmlSystemGetCudaDriverVersion() == 13000  # driver 580: CUDA 13.0
    finally:
        pynvml.nvmlShutdown()


def _client(tool: str) -> list[str]:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (it is in the test extra)")
    return [tool]


@pytest.mark.parametrize("fleet", ["dgx-h100", "dgx-a100"])
def test_nvitop_lists_every_gpu_and_mig_device(tmp_path: Path, fleet: str) -> None:
    m = Migctl(tmp_path, fleet)
    assert m("apply", str(PROFILES / "day.yaml")).code == 0  # 8 GPUs x 7 MIG devices
    p = subprocess.run([sys.executable, "-m", "migd.sim.cli", "exec", "--sim-state", str(m.state), "--",
                        *_client("nvitop"), "-1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]
    gpus = [line for line in p.stdout.splitlines() if line.startswith("│ ") and "Enabled" in line]
    devices = [line for line in p.stdout.splitlines() if "1g.10gb @ GI/CI:" in line]
    assert len(gpus) == 8 and len(devices) == 56, p.stdout
    assert "Driver Version: 580.105.08" in p.stdout and "CUDA Driver Version: 13.0" in p.stdout


@pytest.mark.parametrize("fleet", ["dgx-h100", "dgx-a100"])
def test_gpustat_lists_every_gpu_in_mig_mode(tmp_path: Path, fleet: str) -> None:
    m = Migctl(tmp_path, fleet)
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    p = subprocess.run([sys.executable, "-m", "migd.sim.cli", "exec", "--sim-state", str(m.state), "--",
                        *_client("gpustat"), "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    assert {g["uuid"] for g in doc["gpus"]} == {g.uuid for g in StateStore(m.state).read().gpus}


def _smi(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "migd.sim.cli", "exec", "--sim-state", str(state), "--",
                           "nvidia-smi", *args], capture_output=True, text=True, timeout=120)


def test_the_fake_nvidia_smi_answers_query_gpu_as_an_nvml_client(tmp_path: Path) -> None:
    """`--query-gpu=... --format=csv`: values separated by ", ", a header with units in brackets,
    noheader and nounits dropping them, [N/A] where NVML answers NOT_SUPPORTED (utilization under MIG)."""
    m = Migctl(tmp_path, "dgx-h100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    fields = "index,name,memory.total,utilization.gpu,mig.mode.current,power.draw"
    r = _smi(m.state, f"--query-gpu={fields}", "--format=csv")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "index, name, memory.total [MiB], utilization.gpu [%], mig.mode.current, power.draw [W]"
    assert lines[1] == "0, NVIDIA H100 80GB HBM3, 81559 MiB, [N/A], Enabled, 90.00 W" and len(lines) == 9
    r = _smi(m.state, "-i", "3", "--query-gpu", "index,memory.total,power.draw", "--format=csv,noheader,nounits")
    assert r.returncode == 0 and r.stdout == "3, 81559, 90.00\n", r
    bad = _smi(m.state, "--query-gpu=index,bogus", "--format=csv")
    assert bad.returncode == 2 and bad.stderr.startswith('Field "bogus" is not a valid field to query.'), bad


def test_gputil_reads_the_simulated_fleet_through_the_fake_nvidia_smi(tmp_path: Path) -> None:
    """GPUtil (PyPI, unmodified) parses `nvidia-smi --query-gpu ... --format=csv,noheader,nounits`."""
    pytest.importorskip("GPUtil", reason="GPUtil is not installed (gputil is in the test extra)")
    m = Migctl(tmp_path, "dgx-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    code = "import GPUtil, json; print(json.dumps([[g.id, g.uuid, g.name, g.memoryTotal] for g in GPUtil.getGPUs()]))"
    p = subprocess.run([sys.executable, "-m", "migd.sim.cli", "exec", "--sim-state", str(m.state), "--",
                        sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    gpus = json.loads(p.stdout)
    assert [g[0] for g in gpus] == list(range(8)) and {g[2] for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert [g[1] for g in gpus] == [g.uuid for g in StateStore(m.state).read().gpus]
