"""The simulated libnvidia-ml: C entry points that the real, unmodified ``pynvml`` loads.

``pynvml`` keeps the loaded library in ``pynvml.nvmlLib`` and fetches each function with
``getattr(nvmlLib, name)``, exactly as from ``CDLL("libnvidia-ml.so.1")``.  :func:`load`
puts a :class:`SimLibrary` there.  Each attribute is a real C function pointer with no
``argtypes`` (what CDLL gives), backed by a ctypes callback declared with nvml.h's
prototype: arguments cross a true C ABI, so a struct passed by value where a pointer is
due arrives as a garbage address (see :mod:`migd.sim.cmem`).  Every name pynvml resolves is
exported; one a test marks missing (an older driver) raises ``AttributeError``, which pynvml
turns into NVML_ERROR_FUNCTION_NOT_FOUND.  One library per process, like a loaded shared object.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pynvml

from migd.sim import entry_board, entry_devices, entry_instances, entry_telemetry
from migd.sim.caps_claims import adopt_claims
from migd.sim.caps_tree import sync as sync_caps
from migd.sim.cmem import Handles, Memory, Ref
from migd.sim.entry import ANY_MUTATION, Export, proc_start_time, reap_processes
from migd.sim.gpu import NvmlFail, SimGpu
from migd.sim.interrupts import raise_after_return, watch_unraisable
from migd.sim.state import SimState, StateStore

_SUCCESS = int(pynvml.NVML_SUCCESS)
_MODELLED: dict[str, Export] = {e.name: e for m in (entry_devices, entry_instances, entry_telemetry, entry_board)
                                for e in m.ENTRIES}
# Every name pynvml resolves is exported, as by a real libnvidia-ml: what is not modelled answers
# NOT_SUPPORTED (entry_board.fallbacks), never FUNCTION_NOT_FOUND.
EXPORTS: dict[str, Export] = {**{e.name: e for e in entry_board.fallbacks(frozenset(_MODELLED))}, **_MODELLED}


class _CFunction(ctypes._CFuncPtr):  # type: ignore[name-defined,misc]
    """A foreign function with no argtypes: what ``CDLL`` hands out for every symbol."""

    _flags_ = ctypes._FUNCFLAG_CDECL  # type: ignore[attr-defined]
    _restype_ = ctypes.c_int


@functools.cache
def base_name(symbol: str) -> str:
    """``nvmlDeviceGetCount_v2`` -> ``nvmlDeviceGetCount``: faults name the API, not its version."""
    return re.sub(r"(_v\d+|(?<=Info)V)$", "", symbol)


@dataclass(slots=True)
class Call:
    """One C call in flight: its entry point, the library, and the state it may open."""

    lib: SimLibrary
    export: Export
    gpu: int | None
    delay_s: float = 0.0
    entered: bool = False
    first: tuple[int | None, Ref] | None = None  # the first argument's handle, as resolved to find the GPU

    @property
    def mem(self) -> Memory:
        return self.lib.mem

    @property
    def handles(self) -> Handles:
        return self.lib.handles

    def state(self) -> AbstractContextManager[SimState]:
        """One transaction over the shared state; the first also runs the per-call checks.

        An NVML error ends the call but still commits the state: entry points check before they
        change anything, and a fault that fired must stay consumed."""
        return _CallState(self)

    def gpu_of(self, state: SimState, addr: int | None, *kinds: str) -> tuple[SimGpu, Ref]:
        kinds = kinds or ("gpu",)
        first = self.first
        if first is not None and first[0] == addr and first[1].kind in kinds:
            ref = first[1]  # resolved already (the handle table is the library's: only the state can change)
        else:
            ref = self.handles.ref(addr, *kinds)
        if not 0 <= ref.gpu < len(state.gpus):
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return state.gpus[ref.gpu], ref

    def handle(self, ref: Ref) -> int:
        return self.handles.address(ref)


class _CallState:
    """:meth:`Call.state` as a class (it runs on every simulated call): commit on success or on an
    NVML error, which then propagates; any other exception leaves the state unwritten.  A read-only
    entry point on a quiet cached state takes the store's short path (:meth:`StateStore.enter_quiet`)."""

    __slots__ = ("call", "txn", "state", "store")

    def __init__(self, call: Call) -> None:
        self.call = call

    def __enter__(self) -> SimState:
        call = self.call
        self.store = store = call.lib.store
        quiet = store.enter_quiet() if call.export.read_only else None
        if quiet is not None:
            self.txn, self.state = None, quiet
        else:
            self.txn = txn = store.transaction()
            self.state = txn.__enter__()
        state = self.state
        state.touched = False
        if not call.entered:  # once per C call, however often it opens the state
            call.entered = True
            try:
                call.lib.enter(call, state)
            except NvmlFail:
                self._leave(None, None, None)
                raise
            except BaseException as e:
                self._leave(type(e), e, e.__traceback__)
                raise
        return state

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        call, state = self.call, self.state
        if exc_type is None and call.export.mutating:
            try:
                call.lib.mutated(state)
            except BaseException as e:
                self._leave(type(e), e, e.__traceback__)
                raise
            call.delay_s = state.mutation_delay_s
            state.touched = True
        if exc_type is None or issubclass(exc_type, NvmlFail):
            self._leave(None, None, None)
        else:
            self._leave(exc_type, exc, tb)

    def _leave(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self.txn is None:
            self.store.exit_quiet(self.state, ok=exc_type is None)
        else:
            self.txn.__exit__(exc_type, exc, tb)


class SimLibrary:
    """The simulated NVML shared library: exported symbols over a :class:`StateStore`."""

    def __init__(self, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.mem = Memory()
        self.handles = Handles()
        self.samples: dict[int, Any] = {}  # GPM sample address -> (buffer, reading or None)
        self.eventsets: dict[int, Any] = {}  # event set address -> (buffer, cursor and masks)
        self.init_count = 0
        self._lock = threading.Lock()
        self._missing = frozenset(store.read().missing_symbols)
        self._functions: dict[str, Any] = {}
        self._callbacks: list[Any] = []  # keep the C trampolines alive
        self.calls: Counter[str] = Counter()  # entry point -> calls made (tests count what an action costs)
        self._calls_lock = threading.Lock()  # GPU workers call in parallel
        # MIGD_SIM_CALL_LOG: a file each call is appended to as "<thread name>\t<entry point>", so a test
        # can tell which of a daemon's threads reach NVML (docs/simulator.md)
        self._call_log = os.environ.get("MIGD_SIM_CALL_LOG")

    # -- what pynvml sees ---------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in EXPORTS or name in self._missing:
            raise AttributeError(name)
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self._make(EXPORTS[name])
        return fn

    def _make(self, export: Export) -> Any:
        restype = ctypes.c_void_p if export.returns_string else ctypes.c_int
        proto = ctypes.CFUNCTYPE(restype, *export.argtypes)
        dispatch = self._dispatch

        def entry(*raw: Any) -> int:
            try:
                return dispatch(export, raw)
            except KeyboardInterrupt:  # landed outside the entry point's own handler
                raise_after_return()
                return int(pynvml.NVML_ERROR_UNKNOWN)
        entry.migd_sim_entry = True  # type: ignore[attr-defined]  # recognised by the unraisable hook
        trampoline = proto(entry)
        self._callbacks.append(trampoline)
        fn = _CFunction(ctypes.cast(trampoline, ctypes.c_void_p).value)
        if export.returns_string:
            fn.restype = ctypes.c_char_p
        return fn

    def _dispatch(self, export: Export, raw: tuple[Any, ...]) -> int:
        """Run one entry point; every failure becomes a return code, as C has no exceptions."""
        with self._calls_lock:
            self.calls[export.name] += 1
        if self._call_log:
            _log_call(self._call_log, export.name)
        try:
            if export.returns_string:
                return int(export.impl(self, *raw))
            if export.handle_kinds:
                ref = self.handles.ref(raw[0], *export.handle_kinds)
                call = Call(self, export, None if ref.gpu < 0 else ref.gpu, first=(raw[0], ref))
            else:
                call = Call(self, export, None)
            export.impl(call, *raw)
            if call.delay_s > 0:
                try:
                    time.sleep(call.delay_s)  # a slow driver, outside the state lock
                except KeyboardInterrupt:  # the call already took effect: it succeeds, Ctrl-C follows it
                    raise_after_return()
            return _SUCCESS
        except NvmlFail as e:
            return e.code
        except KeyboardInterrupt:
            # A real library runs no Python, so Ctrl-C reaches the caller after the call returns.
            # A callback cannot raise (ctypes would print it and return 0, i.e. SUCCESS): fail the
            # call (it was cut short before taking effect), and raise it in the caller once it returned.
            raise_after_return()
            return int(pynvml.NVML_ERROR_UNKNOWN)
        except Exception:  # a simulator bug: say so, and fail the call as the driver would
            print(f"migd-sim: internal error in {export.name}:\n{traceback.format_exc()}", file=sys.stderr)
            return int(pynvml.NVML_ERROR_UNKNOWN)

    # -- per-call checks ----------------------------------------------------------------------------
    def enter(self, call: Call, state: SimState) -> None:
        """Initialised, injected faults, lost GPUs: the checks every entry point makes."""
        if call.export.needs_init and self.init_count <= 0:
            raise NvmlFail(pynvml.NVML_ERROR_UNINITIALIZED)
        if not self.store.known_quiet(state) and reap_processes(state):
            state.touched = True
        if state.caps_root and adopt_claims(state):  # CUDA processes that opened their MIG device
            state.touched = True
        if not state.faults:
            return self._check_lost(call, state)
        name, base = call.export.name, base_name(call.export.name)
        for fault in list(state.faults):
            if (fault.fn in (name, base) or (fault.fn == ANY_MUTATION and call.export.mutating)) and \
                    (fault.gpu is None or fault.gpu == call.gpu):
                fault.calls += 1
                state.touched = True
                if fault.calls >= fault.nth:
                    state.faults.remove(fault)
                    raise NvmlFail(fault.code)
        self._check_lost(call, state)

    @staticmethod
    def _check_lost(call: Call, state: SimState) -> None:
        if call.gpu is not None and state.gpus[call.gpu].lost:
            raise NvmlFail(pynvml.NVML_ERROR_GPU_IS_LOST)

    def mutated(self, state: SimState) -> None:
        state.mutations += 1
        if state.caps_root:  # the driver makes and removes instances' /proc capability files with them
            sync_caps(state)
        fill = state.fill_after_mutations
        if fill is not None:
            fill[0] -= 1
            if fill[0] <= 0:
                state.fill_after_mutations = None
                _fill_file_system(fill[1])
        if state.crash_after_mutations is not None:
            state.crash_after_mutations -= 1
            if state.crash_after_mutations <= 0:
                state.crash_after_mutations = None
                self.store.write_held(state)  # the driver already did it: the change survives the crash
                os.kill(os.getpid(), signal.SIGKILL)

    # -- library lifetime ---------------------------------------------------------------------------
    def register_client(self, state: SimState, pid: int, delta: int) -> None:
        """Processes with NVML initialised hold the GPUs: a reset is refused while any does."""
        key = str(pid)
        start, count = state.clients.get(key, [proc_start_time(pid) or 0, 0])
        count += delta
        if count > 0:
            state.clients[key] = [start, count]
        else:
            state.clients.pop(key, None)
        state.touched = True

    def bind(self, store: StateStore) -> None:
        """Point the library at another simulated node (handles of the old one become invalid)."""
        with self._lock:
            if store is self.store or (store.path is not None and store.path == self.store.path):
                return
            if self.init_count > 0:
                with self.store.transaction() as old:
                    self.register_client(old, os.getpid(), -self.init_count)
                with store.transaction() as new:
                    self.register_client(new, os.getpid(), self.init_count)
            self.store = store
            self.handles.clear()
            self.samples.clear()
            self.eventsets.clear()
            self._missing = frozenset(store.read().missing_symbols)


def _fill_file_system(path: str) -> None:
    """Write zeros to ``path`` until the file system says ENOSPC (fault injection: disk full)."""
    block = b"\0" * 65536
    with contextlib.suppress(OSError), open(path, "ab") as f:
        while True:
            f.write(block)
            f.flush()


_LIBRARY: SimLibrary | None = None
_LOAD_LOCK = threading.Lock()


def load(store: StateStore, clock: Callable[[], float] | None = None) -> SimLibrary:
    """Make ``store``'s simulated node the NVML library this process's pynvml talks to
    (``clock`` stands in for the GPU's own timestamps in GPM samples)."""
    global _LIBRARY
    with _LOAD_LOCK:
        if pynvml.nvmlLib is not None and pynvml.nvmlLib is not _LIBRARY:
            raise RuntimeError("pynvml already loaded the real libnvidia-ml in this process")
        if _LIBRARY is None:
            _LIBRARY = SimLibrary(store)
            watch_unraisable(lambda fn: getattr(fn, "migd_sim_entry", False))
        else:
            _LIBRARY.bind(store)
        _LIBRARY.clock = clock or time.time
        pynvml.nvmlLib = _LIBRARY
        if _LIBRARY._missing:
            pynvml._nvmlGetFunctionPointer_cache.clear()  # the cache pynvml keeps per loaded library
        return _LIBRARY


def loaded() -> SimLibrary | None:
    return _LIBRARY


def _log_call(path: str, name: str) -> None:
    """One line per call, in one append (lines from parallel threads never interleave)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{threading.current_thread().name}\t{name}\n".encode())
    finally:
        os.close(fd)
