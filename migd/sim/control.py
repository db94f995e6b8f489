"""What the outside world does to a simulated node: workloads, faults, resets.

These functions change the shared state file directly, so a test can start a process
on a MIG device, arm an NVML failure or raise an Xid while ``migd`` runs in another
process.  None of them is reachable from migd's production code path.
"""

from __future__ import annotations

import os

import pynvml

from migd.sim.caps_tree import sync as sync_caps
from migd.sim.entry import proc_start_time, reap
from migd.sim.state import SimFault, SimGpu, SimProcess, SimState, StateStore

GPU_WIDE = 0xFFFFFFFF


class SimError(Exception):
    pass


def _gpu(state: SimState, index: int) -> SimGpu:
    if not 0 <= index < len(state.gpus):
        raise SimError(f"no simulated GPU {index}")
    return state.gpus[index]


def start_process(store: StateStore, gpu: int, gi: int | None = None, ci: int = 0, used_mib: int | None = 1024,
                  pid: int | None = None) -> int:
    """Put a CUDA process on MIG device (gi, ci) of ``gpu`` (or on the whole non-MIG GPU).

    With ``pid`` the entry is a real OS process (e.g. a ``sleep`` a test started) that the
    simulated driver forgets once it exits; without, a fake pid that lives until stopped."""
    with store.transaction() as s:
        g = _gpu(s, gpu)
        if gi is not None:
            inst = g.gi(gi)
            if inst is None or not any(c.id == ci for c in inst.cis):
                raise SimError(f"GPU {gpu} has no MIG device gi={gi} ci={ci}")
        elif g.mig_current:
            raise SimError(f"GPU {gpu} is in MIG mode: name a MIG device")
        if pid is None:
            s.next_pid += 1
        g.processes.append(SimProcess(pid=pid or s.next_pid, gi=gi, ci=ci if gi is not None else None,
                                      used_mib=used_mib, real=pid is not None,
                                      started=proc_start_time(pid) if pid is not None else None))
        return pid or s.next_pid


def stop_process(store: StateStore, pid: int) -> None:
    with store.transaction() as s:
        for g in s.gpus:
            g.processes = [p for p in g.processes if p.pid != pid]


def fail_call(store: StateStore, fn: str, code: int, nth: int = 1, gpu: int | None = None) -> None:
    """Make the ``nth`` next call of pynvml function ``fn`` (optionally on one GPU) raise ``code``.

    ``fn="*mutation*"`` counts every mutating call (create/destroy/set mode) instead."""
    with store.transaction() as s:
        s.faults.append(SimFault(fn=fn, nth=nth, code=code, gpu=gpu))


def crash_after_mutations(store: StateStore, n: int | None) -> None:
    """SIGKILL whichever process makes the ``n``-th next mutating NVML call, right after it lands."""
    with store.transaction() as s:
        s.crash_after_mutations = n


def fill_disk_after_mutations(store: StateStore, n: int, path: str | os.PathLike[str]) -> None:
    """After the ``n``-th next mutating NVML call, the calling process fills the file system that
    holds ``path`` (a file written there until ENOSPC): a disk that runs full in the middle of an apply."""
    with store.transaction() as s:
        s.fill_after_mutations = [n, os.fspath(path)]


def raise_xid(store: StateStore, gpu: int, xid: int, gi: int | None = None, ci: int | None = None,
              leak_to: tuple[int, ...] = ()) -> None:
    """An Xid on instance ``gi`` (None: GPU-wide).  Processes of the hit instance die;
    ``leak_to`` names neighbour GIs the fault also breaks (an isolation breach)."""
    with store.transaction() as s:
        g = _gpu(s, gpu)
        hit = set(leak_to) | ({gi} if gi is not None else {x.id for x in g.gis})
        for x in g.gis:
            if x.id in leak_to:
                x.faulted = True
        g.processes = [p for p in g.processes if p.gi not in hit]
        s.add_event(gpu, pynvml.nvmlEventTypeXidCriticalError, xid,
                    GPU_WIDE if gi is None else gi, GPU_WIDE if ci is None else ci)


def set_lost(store: StateStore, gpu: int, lost: bool = True) -> None:
    with store.transaction() as s:
        _gpu(s, gpu).lost = lost


def reset_gpu(store: StateStore, gpu: int, despite_clients: bool = False) -> None:
    """``nvidia-smi -r``: applies a pending MIG mode and loses every GI/CI (facts: rules.mig_mode).

    Refused while a process runs on the GPU or any process holds NVML open (nvidia-smi: the GPU
    "is currently in use by another process"; NVIDIA's mig-parted shuts NVML down first).
    ``despite_clients`` stands for what NVML clients cannot prevent: a driver recovery, or an
    administrator who resets the GPU behind migd's back."""
    failure = None
    with store.transaction() as s:
        reap(s)
        g = _gpu(s, gpu)
        for f in list(s.faults):
            if f.fn == "nvidia-smi -r" and (f.gpu is None or f.gpu == gpu):
                f.calls += 1
                if f.calls >= f.nth:
                    s.faults.remove(f)
                    failure = f"GPU {g.bus_id}: {pynvml.NVMLError(f.code)}"  # persisted with the fault's removal
                break
        if failure is None:
            if g.processes or (s.clients and not despite_clients):
                holders = sorted({str(p.pid) for p in g.processes} | set(s.clients))
                raise SimError(f"Unable to reset GPU {g.bus_id} because it's being used by some other process "
                               f"(e.g. CUDA application, monitoring application like another instance of "
                               f"nvidia-smi): PIDs {', '.join(holders)}")
            g.reset()
            s.add_event(gpu, pynvml.nvmlEventMigConfigChange, 0, GPU_WIDE, GPU_WIDE)
            if s.caps_root:
                sync_caps(s)
    if failure is not None:
        raise SimError(failure)


def set_mutation_delay(store: StateStore, seconds: float) -> None:
    """Make every mutating NVML call take ``seconds`` (a slow driver), to signal a process mid-apply."""
    with store.transaction() as s:
        s.mutation_delay_s = seconds
