"""--on-busy force: stop the processes on instances an apply must destroy.  Loud, and careful
about whom it signals: this ends someone's work."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

from migd.hardware.inventory import read_all
from migd.hardware.ports import GpuReader

log = logging.getLogger(__name__)


def stop_processes(backend: GpuReader, pids: list[int], grace_s: float,
                   holding: Callable[[], set[int]] | None = None) -> None:
    """--on-busy force: SIGTERM, wait, then SIGKILL.  Logged loudly: this ends someone's work.

    Each signal goes only to a process NVML lists on the GPUs at that moment, or that ``holding``
    finds holding a capability node then, through a pidfd opened before that reading: a PID whose
    process exited and was reused by an unrelated one is never signalled."""
    def busy() -> set[int]:
        return _gpu_pids(backend) | (holding() if holding is not None else set())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        fds = _pidfds(pids)
        on_gpu = busy()
        for pid, fd in fds.items():
            try:
                if pid not in on_gpu:
                    log.info("on-busy=force: pid %d has left the GPU and its nodes; not sending %s", pid, sig.name)
                    continue
                log.warning("on-busy=force: sending %s to pid %d", sig.name, pid)
                signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                pass
            except PermissionError as e:
                log.error("cannot signal pid %d: %s", pid, e)
            finally:
                os.close(fd)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not busy() & set(pids):
                return
            time.sleep(0.1)


def _gpu_pids(backend: GpuReader) -> set[int]:
    pids, _ = read_all(backend, lambda g: [p.pid for p in backend.gpu_processes(g.index)])
    return {pid for each in pids for pid in each}


def _pidfds(pids: list[int]) -> dict[int, int]:
    """A pidfd per PID that names a live process now (Linux >= 5.3; os.pidfd_open)."""
    out = {}
    for pid in pids:
        try:
            out[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
    return out
