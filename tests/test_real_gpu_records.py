"""The sampler over the simulator asks what it asked of a real GPU, and exports the same series.

``tests/fixtures/h100-sxm5-580.159.04-sampler-*.json`` are ``bench/sampler_probe.py`` on a real H100
80GB HBM3 (driver 580.159.04, MIG off, read-only, 2026-11-24; ``-busy`` with a CUDA process holding
memory).  The probe run here over the simulated ``single-h100`` must match them call for call; so must
the run over ``hgx-h200`` match ``h200-580.159.04-sampler-idle.json`` (a real H200, same driver, MIG
off, 2026-11-28), except in the GPU count (the simulated fleet has eight)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO

FIXTURES = Path(__file__).parent / "fixtures"


def recorded(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"h100-sxm5-580.159.04-sampler-{name}.json").read_text()))


def shape(exposition: list[str]) -> list[str]:
    """Each series' name and label names: values, UUIDs and bus ids differ from GPU to GPU."""
    return [re.sub(r'="[^"]*"', "", line.rsplit(" ", 1)[0]) for line in exposition
            if not line.startswith(("migd_sampler_", "migd_build_info"))]


@pytest.mark.integration
def test_simulated_sampling_matches_the_real_h100_run() -> None:
    r = subprocess.run([sys.executable, "bench/sampler_probe.py", "--sim", "single-h100"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    sim, real = json.loads(r.stdout), recorded("idle")
    assert real["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and not real["gpus"][0]["mig"]
    assert sim["first_cycle"] == real["first_cycle"]
    assert sim["steady_cycle"] == real["steady_cycle"] == {
        "nvmlDeviceGetCount": 1, "nvmlDeviceGetMigMode": 1, "nvmlDeviceGetComputeRunningProcesses": 1}
    assert sim["gpus"] == real["gpus"]
    # migd_applies_total's results are migd's own words, not the GPU's: the recording (2026-11-24) predates
    # the "cancelled" outcome, so every result it has must still be exported, and all else match exactly.
    own = re.compile(r'^migd_applies_total\{result="(\w+)"\}')
    assert shape([ln for ln in sim["exposition"] if not own.match(ln)]) == \
        shape([ln for ln in real["exposition"] if not own.match(ln)])
    results = {m.group(1) for ln in real["exposition"] if (m := own.match(ln))}
    assert len(results) == 6 and results <= {m.group(1) for ln in sim["exposition"] if (m := own.match(ln))}
    assert sim["refused_entry_points"] == real["refused_entry_points"]  # same pynvml: same guard


def test_the_real_driver_listed_a_cuda_process_with_mig_off() -> None:
    """What the simulator does for a process on a GPU with MIG off (GPU-wide, counted per GPU)."""
    busy = recorded("busy")
    assert busy["gpus"][0]["processes"] == 1
    assert 'migd_gpu_processes{gpu="0"' in "\n".join(busy["exposition"])
    assert shape(busy["exposition"]) == shape(recorded("idle")["exposition"])


@pytest.mark.integration
def test_simulated_sampling_asks_an_h200_what_the_real_one_was_asked() -> None:
    r = subprocess.run([sys.executable, "bench/sampler_probe.py", "--sim", "hgx-h200"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    sim, real = json.loads(r.stdout), json.loads((FIXTURES / "h200-580.159.04-sampler-idle.json").read_text())
    assert real["gpus"] == [{"index": 0, "name": "NVIDIA H200", "mig": False, "instances": 0, "processes": 0}]
    assert sim["gpus"][0] == real["gpus"][0] and len(sim["gpus"]) == 8
    gpus = 8  # per-GPU calls scale with the count; per-node calls (the count itself) do not
    per_gpu = {k: v for k, v in real["first_cycle"].items() if k != "nvmlDeviceGetCount"}
    assert sim["first_cycle"] == {"nvmlDeviceGetCount": 1, **{k: v * gpus for k, v in per_gpu.items()}}
    assert sim["steady_cycle"] == {"nvmlDeviceGetCount": 1, "nvmlDeviceGetMigMode": gpus,
                                   "nvmlDeviceGetComputeRunningProcesses": gpus}
    one = [ln for ln in sim["exposition"] if 'gpu="' not in ln or 'gpu="0"' in ln]
    assert shape(one) == shape(real["exposition"])


def _recorded_runs() -> dict[str, str]:
    """``h200-580.159.04-migctl.txt``: migctl's reading commands on the real H200, MIG off, each output
    under ``$ migctl CMD`` and followed by ``rc=N``."""
    text = (FIXTURES / "h200-580.159.04-migctl.txt").read_text()
    runs = re.findall(r"^\$ migctl ([^\n]+)\n(.*?)^rc=(\d+)$", text, flags=re.M | re.S)
    return {cmd: out + f"rc={rc}" for cmd, out, rc in runs}


def test_migctl_plans_on_the_simulated_h200_what_it_planned_on_the_real_one(tmp_path: Path) -> None:
    """The same profiles planned over the simulated hgx-h200 and over a real H200's driver (MIG off): the
    same operations, placements and compute instances for GPU 0, and the same exits."""
    from tests.helpers import Migctl

    real, m = _recorded_runs(), Migctl(tmp_path, "hgx-h200")
    sim = m("plan", "profiles/balanced.yaml", "-o", "json")
    doc = json.loads(real["plan profiles/balanced.yaml -o json"].rsplit("rc=", 1)[0])
    assert sim.code == 0 and real["plan profiles/balanced.yaml -o json"].endswith("rc=0")
    ours, theirs = sim.json()["gpus"][0], doc["gpus"][0]
    assert {k: v for k, v in ours.items() if k != "uuid"} == {k: v for k, v in theirs.items() if k != "uuid"}
    for cmd, gpu in (("plan profiles/day.yaml", "GPU 0 "), ("plan profiles/night.yaml", "GPU 0 "),
                     ("assert profiles/night.yaml", "GPU 0: ")):
        said = next(ln for ln in real[cmd].splitlines() if ln.startswith(gpu)).removeprefix(gpu)
        r = m(*cmd.split())
        assert f"{gpu.strip().replace('0', '0-7')} {said}" in r.out.splitlines(), cmd  # (the eight alike, grouped)
        assert real[cmd].endswith(f"rc={int(r.code)}"), cmd
