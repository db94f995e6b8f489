"""One GPU's operations as NVML calls, and the reading that checks them: the apply's smallest steps.

Each change is made only if the GPU carries no GPU-wide fault mark, checked under the marks' own
lock (``FaultGate``): the fault watch cannot mark the GPU between the check and the change.
"""

from __future__ import annotations

from typing import TypeVar

from migd.apply.result import FaultGate, GpuFaulted
from migd.hardware.ports import ApplyPort, GpuReader, GpuWriter, read_state
from migd.hardware.types import GpuState, HardwareError
from migd.plan.planner import GpuPlan, Op, OpKind

T = TypeVar("T")


def _given(value: T | None) -> T:
    """An operation field its kind requires (the planner always sets it)."""
    if value is None:
        raise HardwareError("internal error: an operation lacks a field its kind requires")
    return value


def run_op(backend: GpuWriter, op: Op, gi_ids: dict[int, int]) -> bool:
    """Run one operation; False only for a MIG mode change that waits for a reset."""
    b, i, k = backend, op.gpu, op.kind
    if k is OpKind.DESTROY_CI:
        b.destroy_compute_instance(i, _given(op.gi_id), _given(op.ci_id))
    elif k is OpKind.DESTROY_GI:
        b.destroy_gpu_instance(i, _given(op.gi_id))
    elif k is OpKind.SET_MIG:
        return b.set_mig_mode(i, _given(op.mig))
    elif k is OpKind.RESET:
        b.reset_gpu(i)
    elif k is OpKind.CREATE_GI:
        gi_ids[_given(op.gi_start)] = b.create_gpu_instance(i, _given(op.profile_id), _given(op.placement))
    elif k is OpKind.CREATE_CI:
        b.create_compute_instance(i, gi_ids[_given(op.gi_start)], _given(op.profile_id), op.placement)
    return True


def guarded(backend: ApplyPort, faults: FaultGate | None, uuid: str, op: Op, gi_ids: dict[int, int]) -> bool:
    """:func:`run_op`, only if the GPU carries no GPU-wide fault mark (GpuFaulted otherwise)."""
    if faults is None:
        return run_op(backend, op, gi_ids)
    with faults.guard(uuid) as fault:
        if fault is not None:
            raise GpuFaulted(f"GPU {op.gpu}: GPU-wide fault {fault}: not changed further (migctl clear-fault "
                             "after checking it)", gpu=op.gpu)
        return run_op(backend, op, gi_ids)


def verify(backend: GpuReader, plan: GpuPlan) -> GpuState:
    """Read the GPU back and compare it with the plan: the reading feeds the isolation audit."""
    seen = read_state(backend, backend.gpu(plan.gpu.index))
    gpu = seen.gpu
    if gpu.mig_current != plan.desired.mig:
        raise HardwareError(f"GPU {gpu.index}: MIG mode is {'on' if gpu.mig_current else 'off'} after apply",
                            gpu=gpu.index)
    if not gpu.mig_current:
        return seen
    actual = sorted((g.profile_id, g.placement.start, tuple(sorted((c.profile_id, c.placement.start)
                                                                  for c in g.compute_instances)))
                    for g in seen.instances)
    want = sorted((t.gi_profile_id, t.placement.start, tuple(sorted((pid, pl.start) for pid, pl in t.ci)))
                  for t in plan.targets)
    if actual != want:
        raise HardwareError(f"GPU {gpu.index}: layout after apply differs from the plan: {actual} != {want}",
                            gpu=gpu.index)
    return seen
