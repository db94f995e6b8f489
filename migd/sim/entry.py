"""What every C entry point of the simulated library shares: its declaration and helpers.

An entry point is a plain function ``impl(call, *raw_c_args)`` declared with the C
prototype from nvml.h (argument types only: every NVML function returns ``nvmlReturn_t``).
Handles and pointers arrive as integer addresses, exactly as the C library receives them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from migd.sim.state import SimProcess, SimState

ANY_MUTATION = "*mutation*"  # fault target: whichever mutating call comes next

# C argument types, named as nvml.h names them.
HANDLE = ctypes.c_void_p  # nvmlDevice_t, nvmlGpuInstance_t, ... (opaque pointers)
PTR = ctypes.c_void_p  # any T *
UINT = ctypes.c_uint
ULL = ctypes.c_ulonglong
GPU_WIDE = 0xFFFFFFFF


@dataclass(frozen=True)
class Export:
    name: str
    argtypes: tuple[Any, ...]
    impl: Callable[..., Any]
    handle_kinds: tuple[str, ...] = ()  # the first argument is a handle of one of these kinds
    mutating: bool = False  # counts towards crash_after_mutations and the mutation delay
    needs_init: bool = True  # nvml.h: UNINITIALIZED "if library has not been successfully initialized"
    returns_string: bool = False  # nvmlErrorString returns const char *, not nvmlReturn_t
    writes: bool = False  # changes the shared state though not a mutation (init/shutdown register the caller)
    # Reads the state only (unless a fault or a real process's exit is pending): may run without the
    # file lock when nobody wrote since the state was last read.  Derived once: asked on every call.
    read_only: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "read_only", not (self.mutating or self.writes))


def exporter(table: list[Export]) -> Callable[..., Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """A decorator that declares C entry points into ``table``."""

    def export(*argtypes: Any, name: str | None = None, handle: tuple[str, ...] = (), mutating: bool = False,
               needs_init: bool = True, returns_string: bool = False, writes: bool = False,
               aliases: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            for n in (name or fn.__name__, *aliases):
                table.append(Export(n, tuple(argtypes), fn, handle, mutating, needs_init, returns_string, writes))
            return fn
        return wrap
    return export


def put(obj: Any, **fields: Any) -> None:
    """Write fields of a caller-owned C struct."""
    for k, v in fields.items():
        setattr(obj, k, v)


def proc_start_time(pid: int) -> int | None:
    """A process's start time in clock ticks (/proc/PID/stat field 22): tells a reused PID apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _alive(p: SimProcess) -> bool:
    """A fake process lives until stopped; a real one until it exits (its PID may then name another)."""
    if not p.real:
        return True
    now = proc_start_time(p.pid)
    return now is not None and (p.started is None or now == p.started)


def reap_processes(state: SimState) -> bool:
    """Like the driver, forget the contexts of processes that have exited (checked on every call)."""
    changed = False
    for g in state.gpus:
        for p in g.processes:  # a plain loop: this runs on every call, mostly over no processes
            if p.real:
                alive = [q for q in g.processes if _alive(q)]
                if len(alive) != len(g.processes):
                    g.processes, changed = alive, True
                break
    return changed


def reap_clients(state: SimState) -> bool:
    """Forget NVML sessions of processes that have exited (or whose PID now names another process).
    Only a mode change and a reset look at the clients, so only they pay for this."""
    changed = False
    for pid, (start, _) in list(state.clients.items()):
        now = proc_start_time(int(pid))
        if now is None or (start and now != start):
            del state.clients[pid]
            changed = True
    return changed


def reap(state: SimState) -> bool:
    return reap_processes(state) | reap_clients(state)
