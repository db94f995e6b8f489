"""Read-only: migd's metrics sampler and /metrics families over the real NVML, on a real GPU.

Run on a machine with an NVIDIA GPU (``python3 bench/sampler_probe.py``).  Every pynvml entry point
that could change the GPU (Set*, Create*, Destroy*, Reset*, Clear*, Register*Event is allowed: it
only subscribes) is replaced by one that raises before NVML is reached, so a bug here cannot
reconfigure the GPU.  It prints the NVML calls per sampling cycle, each GPU's sample and the
``migd_*`` families of one exposition.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_MUTATING = re.compile(r"^nvml(Device|GpuInstance|ComputeInstance|Unit|System|Vgpu|Gpm)?"
                       r"(Set|Create|Destroy|Reset|Clear)")


def guard_read_only() -> list[str]:
    """Replace every mutating pynvml function with one that refuses; the names replaced."""
    refused = []
    for name in dir(pynvml):
        if _MUTATING.match(name) and callable(getattr(pynvml, name)):
            def refuse(*_: Any, _name: str = name) -> Any:
                raise RuntimeError(f"read-only probe refused {_name}")
            setattr(pynvml, name, refuse)
            refused.append(name)
    return refused


def _backend(sim: str | None) -> Any:
    from migd.hardware.nvml.backend import NvmlBackend
    if sim is None:
        return NvmlBackend()
    import tempfile

    from migd.sim.backend import sim_backend
    return sim_backend(Path(tempfile.mkdtemp()) / "state.json", sim)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="read-only: migd's metrics sampler over the real NVML (every "
                                             "mutating pynvml entry point refused)")
    ap.add_argument("--sim", metavar="FLEET", help="the same over the simulator (the fleet as it starts: MIG off), "
                                                  "which tests/test_real_gpu_records.py holds to the real run")
    args = ap.parse_args(argv)
    from migd.hardware.types import HardwareError
    try:
        return probe(args.sim)
    except HardwareError as e:
        print(f"sampler_probe: {e}", file=sys.stderr)
        return 4


def probe(sim: str | None) -> int:
    refused = guard_read_only()
    from prometheus_client import CollectorRegistry, generate_latest

    from migd.metrics.collector import MigdCollector
    from migd.metrics.sampler import NvmlErrorCounter, Sampler
    from migd.state.live import Status

    backend = _backend(sim)
    calls: dict[str, int] = {}
    unlocked = backend.nvml.unlocked

    def counted(fn: Any, *args: Any, **kw: Any) -> Any:
        calls[fn.__name__] = calls.get(fn.__name__, 0) + 1
        return unlocked(fn, *args, **kw)

    backend.nvml.unlocked = counted
    sampler = Sampler(backend, threading.RLock(), dict, interval_s=1.0)
    first = sampler.sample_once()
    opened = dict(calls)
    calls.clear()
    time.sleep(1.0)
    second = sampler.sample_once()
    steady = dict(calls)
    registry = CollectorRegistry()
    registry.register(MigdCollector(sampler, Status, NvmlErrorCounter(), hostname="probe"))
    text = generate_latest(registry).decode()
    sampler.close()
    backend.close()
    print(json.dumps({
        "refused_entry_points": len(refused), "nvidia_ml_py": _version("nvidia-ml-py"),
        "first_cycle": opened, "steady_cycle": steady,
        "first_took_s": round(first.duration_s, 4), "steady_took_s": round(second.duration_s, 4),
        "gpus": [{"index": g.info.index, "name": g.info.name, "mig": g.info.mig_current,
                  "instances": len(g.instances), "processes": g.processes} for g in second.gpus],
        "unread": [repr(u) for u in second.unread],
        "exposition": [line for line in text.splitlines() if line.startswith("migd_")],
    }, indent=1))
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import version
    return version(dist)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
