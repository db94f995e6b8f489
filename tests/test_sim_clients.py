"""Any NVML client runs over the simulator: every function pynvml wraps resolves in
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

from migd.sim import world
from migd.sim.entry_board import pynvml_names
from migd.sim.state import StateStore
from tests.helpers import PROFILES, Migctl

pytestmark = pytest.mark.integration  # nvidia-smi, gpustat, nvitop as programs


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
    from migd.sim import world
    from migd.sim.backend import load_library
    load_library(tmp_path / "s.json", "dgx-h100")
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        world.set_lost(StateStore(tmp_path / "s.json"), 1)
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


# Where nvidia-smi 570.148.08 draws its column bars (a public recording of an A100 80GB PCIe in MIG mode,
# the README of ztouchnetworks/k8s-dra-driver-gpu; migd/sim/smi_table.py): the GPU table, the MIG
# devices table, every line 91 characters.
GPU_BARS, MIG_BARS = [0, 42, 67, 90], [0, 19, 54, 66, 90]


def _bars(line: str) -> list[int]:
    return [i for i, c in enumerate(line) if c in "|+"]


def test_plain_nvidia_smi_prints_the_gpu_mig_and_process_tables(tmp_path: Path) -> None:
    """Plain `nvidia-smi` as an operator reads it: one row per GPU, one per MIG device with the GI and CI
    migctl status names, and each CUDA process on its MIG device (a real one by its name), in the R570
    layout."""
    m = Migctl(tmp_path, "mixed")  # 2 x A100-SXM4-40GB + 2 x H100
    assert m("apply", str(PROFILES / "balanced.yaml")).code == 0
    whole = tmp_path / "whole.yaml"  # GPU 3 back to whole-GPU mode
    whole.write_text("version: v1\nmig-configs:\n  whole:\n    - devices: [3]\n      mig-enabled: false\n")
    assert m("apply", str(whole), "--config", "whole").code == 0
    status = m("status", "-o", "json").json()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        store = StateStore(m.state)
        world.start_process(store, 0, status["gpus"][0]["instances"][1]["gi_id"], 0, 1536, pid=sleeper.pid)
        world.start_process(store, 3, None, 0, 512)  # a made-up pid on the GPU in whole-GPU mode
        r = _smi(m.state)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 0 and r.stderr == "", r
    lines = r.stdout.splitlines()
    assert lines[2].startswith("| NVIDIA-SMI 580.105.08") and "CUDA Version: 13.0" in lines[2]
    assert all(len(line) == 91 for line in lines[1:] if line.strip()), [ln for ln in lines if len(ln) != 91]
    gpu_rows = [ln for ln in lines if _bars(ln) == GPU_BARS and ln[1:5].strip().isdigit()]
    assert [int(ln[1:5]) for ln in gpu_rows] == [0, 1, 2, 3]
    modes = [ln.split("|")[3].strip() for ln in lines if ln.endswith("Enabled |") or ln.endswith("Disabled |")]
    assert modes == ["Enabled" if g["mig"]["current"] else "Disabled" for g in status["gpus"]]
    mig_rows = [ln for ln in lines if _bars(ln) == MIG_BARS and ln[1:4].strip().isdigit()]
    want = [(g["index"], gi["gi_id"], ci["ci_id"], ci["memory_total_bytes"] >> 20)
            for g in status["gpus"] for gi in g["instances"] for ci in gi["compute_instances"]]
    got = [(int(ln[1:4]), int(ln[4:9]), int(ln[9:13]), int(ln.split("/")[1].split("MiB")[0])) for ln in mig_rows]
    assert sorted(got) == sorted(want) and len(got) == 12  # 4 MIG devices on each of GPUs 0-2
    procs = lines[lines.index(next(ln for ln in lines if ln.startswith("| Processes:"))):]
    row = next(ln for ln in procs if str(sleeper.pid) in ln)
    gi = status["gpus"][0]["instances"][1]["gi_id"]
    assert row.split()[1:8] == ["0", str(gi), "0", str(sleeper.pid), "C", "sleep", "1536MiB"], row
    fake = next(ln for ln in procs if ln.startswith("|    3  N/A  N/A"))
    assert fake.split()[5:8] == ["C", "N/A", "512MiB"], fake


def test_nvidia_smi_help_and_list_are_the_real_tools_forms(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "dgx-h100")
    assert m("apply", str(PROFILES / "night.yaml")).code == 0
    help_text = _smi(m.state, "--help").stdout
    assert help_text.splitlines()[0] == "NVIDIA System Management Interface -- v580.105.08"
    listed = _smi(m.state, "--list-gpus")
    assert listed.returncode == 0 and listed.stdout == _smi(m.state, "-L").stdout
    first = listed.stdout.splitlines()[:2]
    assert first[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-") and first[1].startswith("  MIG ")
    one = _smi(m.state, "--id=3", "mig", "-lgi")
    assert one.returncode == 0 and one.stdout == _smi(m.state, "-i", "3", "mig", "-lgi").stdout
    bad = _smi(m.state, "--bogus")
    assert bad.returncode == 2 and "nvidia-smi -h lists what it answers" in bad.stderr
