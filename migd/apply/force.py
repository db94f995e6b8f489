"""The busy policy ``force``: stop the processes on instances an apply must destroy.  Loud, and careful
about whom it signals: this ends someone's work.  Every signal sent is logged with its GPU and kept
(:class:`~migd.apply.result.Signalled`), so the apply's document and migctl's output say which PID got
which signal, and when."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

from migd.apply.result import Signalled
from migd.hardware.inventory import read_all
from migd.hardware.ports import GpuReader

log = logging.getLogger(__name__)


def stop_processes(backend: GpuReader, pids: list[int], grace_s: float,
                   holding: Callable[[], set[int]] | None = None, sent: list[Signalled] | None = None) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL what is left; each signal sent is appended to ``sent``.

    Each signal goes only to a process NVML lists on the GPUs at that moment, or that ``holding``
    finds holding a capability node then, through a pidfd opened before that reading: a PID whose
    process exited and was reused by an unrelated one is never signalled."""
    def busy() -> dict[int, int | None]:
        held = holding() if holding is not None else set()
        return {**{pid: None for pid in held}, **_gpu_pids(backend)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        fds = _pidfds(pids)
        on_gpu = busy()
        for pid, fd in fds.items():
            try:
                if pid not in on_gpu:
                    log.info("on-busy force: PID %d has left the GPU and its nodes; not sending %s", pid, sig.name)
                    continue
                gpu = on_gpu[pid]
                log.warning("%son-busy force: sending %s to PID %d", "" if gpu is None else f"GPU {gpu}: ",
                            sig.name, pid)
                signal.pidfd_send_signal(fd, sig)
                if sent is not None:
                    sent.append(Signalled(pid, sig.name, time.time(), gpu))
            except ProcessLookupError:
                pass
            except PermissionError as e:
                log.error("cannot signal PID %d: %s", pid, e)
            finally:
                os.close(fd)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not busy().keys() & set(pids):
                return
            time.sleep(0.1)


def _gpu_pids(backend: GpuReader) -> dict[int, int | None]:
    """Every process NVML lists now, with the GPU it runs on."""
    found, _ = read_all(backend, lambda g: [(p.pid, g.index) for p in backend.gpu_processes(g.index)])
    return {pid: index for each in found for pid, index in each}


def _pidfds(pids: list[int]) -> dict[int, int]:
    """A pidfd per PID that names a live process now (Linux >= 5.3; os.pidfd_open)."""
    out = {}
    for pid in pids:
        try:
            out[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
    return out
