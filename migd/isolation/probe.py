"""Optional probe: a tiny CUDA workload in each MIG instance, where a CUDA-capable Python stack exists."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass

from migd.hardware.inventory import survey
from migd.hardware.ports import GpuReader
from migd.kinds import Word

_SNIPPET = "import torch; x = torch.ones(1 << 20, device='cuda'); assert float(x.sum()) == float(1 << 20)"


class ProbeStatus(Word):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  # no CUDA-capable Python stack here


@dataclass(frozen=True)
class ProbeRun:
    """The workload in one MIG device (``error``: the last line it wrote to stderr, or the timeout)."""

    gpu: int
    gi: int
    ci: int
    mig_uuid: str
    ok: bool
    error: str | None


@dataclass(frozen=True)
class Probe:
    status: ProbeStatus
    detail: str
    results: tuple[ProbeRun, ...]


def run_probe(backend: GpuReader, timeout_s: float = 120.0) -> Probe:
    """Run the snippet once per MIG device (CUDA_VISIBLE_DEVICES=<MIG UUID>); skipped without torch+CUDA."""
    if importlib.util.find_spec("torch") is None:
        return Probe(ProbeStatus.SKIPPED, "no CUDA-capable Python stack (torch is not installed)", ())
    results = []
    for g in survey(backend).gpus:  # a lost GPU runs nothing: the status and audit report it
        if not g.mig_current:
            continue
        for d in backend.list_mig_devices(g.index):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": d.uuid}
            try:
                p = subprocess.run([sys.executable, "-c", _SNIPPET], env=env, capture_output=True, text=True,
                                   timeout=timeout_s, check=False)
                ok, err = p.returncode == 0, (p.stderr.strip().splitlines() or [""])[-1]
            except subprocess.TimeoutExpired:
                ok, err = False, f"timed out after {timeout_s:g}s"
            results.append(ProbeRun(g.index, d.gi_id, d.ci_id, d.uuid, ok, None if ok else err))
    failed = [r for r in results if not r.ok]
    return Probe(ProbeStatus.FAILED if failed else ProbeStatus.OK,
                 f"{len(results) - len(failed)}/{len(results)} instances ran the workload", tuple(results))
