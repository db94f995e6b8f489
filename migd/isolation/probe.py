"""Optional probe: a tiny CUDA workload in each MIG instance, where a CUDA-capable Python stack exists."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

from migd.hardware.inventory import survey
from migd.hardware.ports import GpuReader

_SNIPPET = "import torch; x = torch.ones(1 << 20, device='cuda'); assert float(x.sum()) == float(1 << 20)"


def run_probe(backend: GpuReader, timeout_s: float = 120.0) -> dict[str, Any]:
    """Run the snippet once per MIG device (CUDA_VISIBLE_DEVICES=<MIG UUID>); skipped without torch+CUDA."""
    if importlib.util.find_spec("torch") is None:
        return {"status": "skipped", "detail": "no CUDA-capable Python stack (torch is not installed)", "results": []}
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
            results.append({"gpu": g.index, "gi": d.gi_id, "ci": d.ci_id, "mig_uuid": d.uuid, "ok": ok,
                            "error": None if ok else err})
    failed = [r for r in results if not r["ok"]]
    status = "failed" if failed else "ok"
    return {"status": status, "detail": f"{len(results) - len(failed)}/{len(results)} instances ran the workload",
            "results": results}
