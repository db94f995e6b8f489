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
                  pid: int | None = None, check: bool = False) -> int:
    """Put a CUDA process on MIG device (gi, ci) of ``gpu`` (or on the whole non-MIG GPU).

    With ``pid`` the entry is a real OS process (e.g. a ``sleep`` a test started) that the
    simulated driver forgets once it exits; without, a fake pid that lives until stopped.
    ``check`` (``migd-sim process start``) also refuses what no driver would show: a lost GPU,
    more memory than the device has, a PID that is not running or already listed."""
    with store.transaction() as s:
        g = _gpu(s, gpu)
        if gi is not None:
            inst = g.gi(gi)
            if inst is None or not any(c.id == ci for c in inst.cis):
                raise SimError(f"GPU {gpu} has no MIG device gi={gi} ci={ci}")
        elif g.mig_current:
            raise SimError(f"GPU {gpu} is in MIG mode: name a MIG device")
        if check:
            _check_process(s, g, gi, used_mib, pid)
        if pid is None:
            s.next_pid += 1
        g.processes.append(SimProcess(pid=pid or s.next_pid, gi=gi, ci=ci if gi is not None else None,
                                      used_mib=used_mib, real=pid is not None,
                                      started=proc_start_time(pid) if pid is not None else None))
        return pid or s.next_pid


def _check_process(s: SimState, g: SimGpu, gi: int | None, used_mib: int | None, pid: int | None) -> None:
    if g.lost:
        raise SimError(f"GPU {g.index} is lost: nothing starts on it until it returns")
    inst = g.gi(gi) if gi is not None else None
    room = g.mig_memory_mib(inst) if inst is not None else g.catalog.total_memory_mib
    if used_mib is not None and not 0 <= used_mib <= room:
        raise SimError(f"{used_mib} MiB does not fit: the device has {room} MiB")
    if pid is not None:
        if pid <= 0 or proc_start_time(pid) is None:
            raise SimError(f"no running process {pid} on this machine")
        if any(p.pid == pid for x in s.gpus for p in x.processes):
            raise SimError(f"process {pid} is already on a simulated GPU")


def stop_process(store: StateStore, pid: int, must_exist: bool = False) -> None:
    """Forget process ``pid`` on every GPU (``must_exist``: a PID no GPU lists is an error)."""
    with store.transaction() as s:
        if must_exist and not any(p.pid == pid for g in s.gpus for p in g.processes):
            raise SimError(f"no simulated process {pid} (migctl status lists them)")
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
              leak_to: tuple[int, ...] = (), check: bool = False) -> None:
    """An Xid on instance ``gi`` (None: GPU-wide).  Processes of the hit instance die;
    ``leak_to`` names neighbour GIs the fault also breaks (an isolation breach).  ``check``
    (``migd-sim xid``): instances the GPU does not have are an error, not an event."""
    with store.transaction() as s:
        g = _gpu(s, gpu)
        if check:
            _check_xid(g, xid, gi, ci, leak_to)
        hit = set(leak_to) | ({gi} if gi is not None else {x.id for x in g.gis})
        for x in g.gis:
            if x.id in leak_to:
                x.faulted = True
        g.processes = [p for p in g.processes if p.gi not in hit]
        s.add_event(gpu, pynvml.nvmlEventTypeXidCriticalError, xid,
                    GPU_WIDE if gi is None else gi, GPU_WIDE if ci is None else ci)


def _check_xid(g: SimGpu, xid: int, gi: int | None, ci: int | None, leak_to: tuple[int, ...]) -> None:
    if xid <= 0:
        raise SimError(f"Xid {xid}: an Xid is a positive number (79: fallen off the bus; 31: a page fault)")
    if gi is None and (ci is not None or leak_to):
        raise SimError("a compute instance or a leak names a GPU instance first: give the GI")
    inst = g.gi(gi) if gi is not None else None
    if gi is not None and inst is None:
        raise SimError(f"GPU {g.index} has no GPU instance {gi} (migctl status lists them)")
    if inst is not None and ci is not None and not any(c.id == ci for c in inst.cis):
        raise SimError(f"GPU {g.index} GI {gi} has no compute instance {ci}")
    for other in leak_to:
        if other == gi or g.gi(other) is None:
            raise SimError(f"GPU {g.index} has no other GPU instance {other} for the fault to reach")


def set_lost(store: StateStore, gpu: int, lost: bool = True) -> bool:
    """Mark ``gpu`` lost (every NVML call on it answers GPU_IS_LOST) or back; returns what it was."""
    with store.transaction() as s:
        g = _gpu(s, gpu)
        was, g.lost = g.lost, lost
        return was


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


def driver_not_loaded(store: StateStore, tries: int) -> None:
    """The NVIDIA driver not loaded yet (a late module load, an upgrade): the next ``tries`` nvmlInit calls,
    whichever process makes them, fail with NVML_ERROR_DRIVER_NOT_LOADED; 0 loads it now."""
    with store.transaction() as s:
        s.faults = [f for f in s.faults if f.fn != "nvmlInitWithFlags"]
        s.faults += [SimFault("nvmlInitWithFlags", 1, pynvml.NVML_ERROR_DRIVER_NOT_LOADED) for _ in range(tries)]
