"""An in-memory node behind the hardware port, for unit tests of the applier's and the daemon's
decisions that run in milliseconds.

It is not the simulator: no C ABI, no state file, no processes of its own.  It keeps what the
applier reads and changes (MIG mode, GPU and compute instances, processes per MIG device) and refuses
what the driver refuses that the applier's logic depends on: a placement the profile does not offer,
one that overlaps an instance, a GI destroyed while it holds CIs, a change on a lost GPU.  Behaviour
the driver shows and this does not model is tested through the simulator (tests/test_sim*.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from migd.catalog.models import MODELS, GpuModel, Placement
from migd.hardware.types import ComputeInstance, GpuInfo, GpuInstance, HardwareError, MigDevice, ProcessInfo
from migd.plan.offline import fake_gpu

LOST, INVALID_ARGUMENT, IN_USE = 15, 2, 19  # nvml.h nvmlReturn_t


@dataclass
class FakeGpu:
    model: GpuModel
    mig: bool = False
    gis: dict[int, GpuInstance] = field(default_factory=dict)
    pids: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (gi, ci) -> pids
    lost: bool = False
    next_id: int = 1


class FakeNode:
    """GPUs of catalog models; ``fail_after``: the n-th next change raises (a driver error mid-apply)."""

    def __init__(self, *models: str) -> None:
        self.gpus = [FakeGpu(MODELS[m]) for m in models]
        self.changes = 0  # every accepted change, as the simulator's mutation counter
        self.fail_after: int | None = None

    # -- reading ------------------------------------------------------------------------------------
    def gpu_count(self) -> int:
        return len(self.gpus)

    def _g(self, index: int) -> FakeGpu:
        g = self.gpus[index]
        if g.lost:
            raise HardwareError(f"GPU {index}: nvmlDeviceGetHandleByIndex failed: NVML_ERROR_GPU_IS_LOST",
                                code=LOST, gpu=index)
        return g

    def gpu(self, index: int) -> GpuInfo:
        g = self._g(index)
        info = fake_gpu(g.model, index, g.mig)
        return GpuInfo(**{**info.__dict__, "uuid": f"GPU-fake-{index}"})

    def list_gpu_instances(self, index: int) -> list[GpuInstance]:
        return sorted(self._g(index).gis.values(), key=lambda x: x.id)

    def list_mig_devices(self, index: int) -> list[MigDevice]:
        g = self._g(index)
        return [MigDevice(index, gi.id, ci.id, f"MIG-fake-{index}-{gi.id}-{ci.id}", "fake", 0, 0,
                          tuple(ProcessInfo(pid, None, gi.id, ci.id) for pid in g.pids.get((gi.id, ci.id), ())))
                for gi in g.gis.values() for ci in gi.compute_instances]

    def gpu_processes(self, index: int) -> list[ProcessInfo]:
        g = self._g(index)
        return [ProcessInfo(pid, None, gi, ci) for (gi, ci), pids in g.pids.items() for pid in pids]

    # -- changing -----------------------------------------------------------------------------------
    def _change(self, index: int) -> FakeGpu:
        g = self._g(index)
        if self.fail_after is not None:
            self.fail_after -= 1
            if self.fail_after < 0:
                self.fail_after = None
                raise HardwareError(f"GPU {index}: change failed: NVML_ERROR_UNKNOWN", code=999, gpu=index)
        self.changes += 1
        return g

    def set_mig_mode(self, index: int, enabled: bool) -> bool:
        g = self._change(index)
        if g.gis:
            raise HardwareError(f"GPU {index}: MIG mode change with instances: NVML_ERROR_IN_USE", code=IN_USE)
        g.mig = enabled
        return True

    def reset_gpu(self, index: int) -> None:
        self._change(index)

    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> int:
        g = self._change(index)
        prof = g.model.profile_by_id(profile_id)
        taken = {s for gi in g.gis.values() for s in range(gi.placement.start, gi.placement.end)}
        if not g.mig or prof is None or placement not in prof.placements or \
                taken & set(range(placement.start, placement.end)):
            raise HardwareError(f"GPU {index}: placement {placement} refused: NVML_ERROR_INVALID_ARGUMENT",
                                code=INVALID_ARGUMENT, gpu=index)
        gi_id, g.next_id = g.next_id, g.next_id + 1
        g.gis[gi_id] = GpuInstance(gi_id, profile_id, placement)
        return gi_id

    def create_compute_instance(self, index: int, gi_id: int, ci_profile_id: int,
                                placement: Placement | None = None) -> int:
        g = self._change(index)
        gi = g.gis[gi_id]
        prof = g.model.profile_by_id(gi.profile_id)
        cp = prof.ci_by_id(ci_profile_id) if prof else None
        if cp is None:
            raise HardwareError(f"GPU {index}: CI profile {ci_profile_id}: NVML_ERROR_INVALID_ARGUMENT",
                                code=INVALID_ARGUMENT, gpu=index)
        pl = placement or cp.placements[0]
        ci_id = max((c.id for c in gi.compute_instances), default=-1) + 1
        g.gis[gi_id] = GpuInstance(gi.id, gi.profile_id, gi.placement,
                                   (*gi.compute_instances, ComputeInstance(ci_id, ci_profile_id, pl)))
        return ci_id

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        g = self._change(index)
        if g.pids.get((gi_id, ci_id)):
            raise HardwareError(f"GPU {index}: CI {ci_id} in use: NVML_ERROR_IN_USE", code=IN_USE, gpu=index)
        gi = g.gis[gi_id]
        g.gis[gi_id] = GpuInstance(gi.id, gi.profile_id, gi.placement,
                                   tuple(c for c in gi.compute_instances if c.id != ci_id))

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        g = self._change(index)
        if g.gis[gi_id].compute_instances:
            raise HardwareError(f"GPU {index}: GI {gi_id} has CIs: NVML_ERROR_IN_USE", code=IN_USE, gpu=index)
        del g.gis[gi_id]

    # -- the outside world --------------------------------------------------------------------------
    def run(self, index: int, gi_id: int, ci_id: int = 0, pid: int = 4242) -> None:
        self.gpus[index].pids.setdefault((gi_id, ci_id), []).append(pid)

    def layout(self, index: int) -> list[tuple[str, int]]:
        g = self.gpus[index]
        return sorted((g.model.profile_by_id(gi.profile_id).name, gi.placement.start)  # type: ignore[union-attr]
                      for gi in g.gis.values())
