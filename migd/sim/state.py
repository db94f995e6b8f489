"""Simulated GPU state, persisted in one JSON file so several processes share it.

The simulated NVML C library (:mod:`migd.sim.library`) and the fake ``nvidia-smi`` both open the
same file under an exclusive ``flock``; every API call is one short transaction.  The
file also carries fault-injection orders, which is how a test process arms a fault that
fires inside a separate ``migd``/``migctl`` process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migd.errors import ValidationError
from migd.sim.filewatch import FileWatch
from migd.sim.fleets import CATALOG_FLEETS, DEFAULT_FLEET, DRIVER_VERSION, FLEET_MINORS, FLEETS, PASSTHROUGH_FLEETS
from migd.sim.gpu import SimCi, SimGi, SimGpu, SimProcess
from migd.trust import open_regular

__all__ = ["CATALOG_FLEETS", "FLEETS", "PASSTHROUGH_FLEETS", "DEFAULT_FLEET", "SimCi", "SimGi", "SimGpu",
           "SimProcess", "SimFault", "SimState", "StateStore", "new_state", "open_store"]

MAX_EVENTS = 200
MAX_STATE_BYTES = 64 << 20  # a node of 8 GPUs, every instance and event kept, is some 100 KB
MAX_CONFIG_EVENTS = 32  # MIG-config-change events are a hint to re-read; Xids are kept longer


@dataclass
class SimFault:
    fn: str  # pynvml function name, or "nvidia-smi -r"
    nth: int  # fail the nth call made after the fault was armed (1 = next call)
    code: int  # NVML error code
    calls: int = 0
    gpu: int | None = None  # only count calls on this GPU (None: any)


@dataclass
class SimState:
    fleet: str
    gpus: list[SimGpu]
    serial: int = 0
    seq: int = 0
    events: list[dict[str, int]] = field(default_factory=list)
    faults: list[SimFault] = field(default_factory=list)
    crash_after_mutations: int | None = None  # SIGKILL the calling process after this many more
    fill_after_mutations: list[Any] | None = None  # [n, path]: fill path's file system after n more mutations
    mutations: int = 0
    next_pid: int = 5_000_000  # fake pids sit above the kernel's maximum pid_max (2**22): never a real process
    mutation_delay_s: float = 0.0  # how long each mutating call takes (lets tests signal mid-apply)
    passthrough: bool = False  # a pass-through VM: Ampere mode changes wait for a reset
    driver_version: str = DRIVER_VERSION
    missing_symbols: list[str] = field(default_factory=list)  # an older libnvidia-ml lacks these entry points
    clients: dict[str, list[int]] = field(default_factory=dict)  # pid -> [start time, nvmlInit count]
    caps_root: str | None = None  # nvidia-capabilities under this root (migd.sim.caps), or none
    caps_synced: list[str] = field(default_factory=list)  # the capabilities its /proc tree has now
    touched: bool = field(default=True, repr=False, compare=False)  # not persisted: "write me back"

    @property
    def quiet(self) -> bool:
        """Nothing armed that a read would trip (a fault), no real process whose exit a read would
        notice and no capability tree whose claims a read would adopt: reading changes nothing."""
        return not self.faults and not self.caps_root and not any(p.real for g in self.gpus for p in g.processes)

    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def add_event(self, gpu: int, event_type: int, data: int, gi: int, ci: int) -> None:
        self.seq += 1
        self.events.append({"seq": self.seq, "gpu": gpu, "type": event_type, "data": data, "gi": gi, "ci": ci})
        config = [e for e in self.events if e["type"] == 0x100]  # nvmlEventMigConfigChange
        if len(config) > MAX_CONFIG_EVENTS:
            drop = {id(e) for e in config[:-MAX_CONFIG_EVENTS]}
            self.events = [e for e in self.events if id(e) not in drop]
        del self.events[:-MAX_EVENTS]

    def to_json(self) -> dict[str, Any]:
        # Hand-rolled: dataclasses.asdict deep-copies the event log on every NVML call.
        return {
            "fleet": self.fleet, "serial": self.serial, "seq": self.seq, "events": self.events,
            "crash_after_mutations": self.crash_after_mutations, "mutations": self.mutations,
            "fill_after_mutations": self.fill_after_mutations,
            "next_pid": self.next_pid, "faults": [vars(f) for f in self.faults],
            "mutation_delay_s": self.mutation_delay_s, "passthrough": self.passthrough,
            "driver_version": self.driver_version, "missing_symbols": self.missing_symbols, "clients": self.clients,
            "caps_root": self.caps_root, "caps_synced": self.caps_synced,
            "gpus": [{**{k: v for k, v in vars(g).items() if k not in ("gis", "processes")},
                      "processes": [vars(p) for p in g.processes],
                      "gis": [{**{k: v for k, v in vars(gi).items() if k != "cis"},
                               "cis": [vars(c) for c in gi.cis]} for gi in g.gis]} for g in self.gpus]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SimState:
        gpus = []
        for g in raw["gpus"]:
            gis = [SimGi(**{**gi, "cis": [SimCi(**ci) for ci in gi["cis"]]}) for gi in g["gis"]]
            procs = [SimProcess(**p) for p in g["processes"]]
            gpus.append(SimGpu(**{**g, "gis": gis, "processes": procs}))
        faults = [SimFault(**f) for f in raw.get("faults", [])]
        rest = {k: v for k, v in raw.items() if k not in ("gpus", "faults")}
        return cls(gpus=gpus, faults=faults, **rest)


def new_state(fleet: str = DEFAULT_FLEET, mig_enabled: bool = False) -> SimState:
    """A freshly booted node of the named fleet: no instances, MIG mode as given."""
    if fleet not in FLEETS:
        raise ValueError(f"unknown simulated fleet {fleet!r}; known: {', '.join(sorted(FLEETS))}")
    gpus = []
    minors = FLEET_MINORS.get(fleet, list(range(len(FLEETS[fleet]))))
    for i, key in enumerate(FLEETS[fleet]):
        gpu_uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"migd-sim/{fleet}/{i}"))
        # DGX-style bus ids: 0000:07,0f,47,4e,87,90,b7,bd (any distinct values would do)
        bus = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)[i % 8] + 0x100 * (i // 8)
        gpus.append(SimGpu(index=i, model=key, uuid=gpu_uuid, bus_id=f"00000000:{bus:02X}:00.0",
                           mig_current=mig_enabled, mig_pending=mig_enabled, minor=minors[i]))
    return SimState(fleet=fleet, gpus=gpus, passthrough=fleet in PASSTHROUGH_FLEETS)


_PID = [os.getpid()]  # this process's pid, kept current across fork (getpid is a system call)
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


class StateStore:
    """Transactions over the simulated state: in memory, or in a JSON file shared by processes.

    A file store keeps the parsed state in memory and re-reads the file only when a writer changed
    it: every write bumps a generation counter kept in the lock file, read with one
    ``pread`` under the lock.  (The file's inode and mtime cannot stand in for it: ``os.replace``
    frees inode numbers for reuse and mtimes tick coarsely.)  So every writer goes through a
    StateStore: the simulated library, ``migd.sim.world``, the fake nvidia-smi and tests do."""

    def __init__(self, path: str | os.PathLike[str] | None = None, state: SimState | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.RLock()
        self._memory = state
        self._changed = threading.Condition(self._lock)  # an in-memory store's writes wake its waiters
        self._memory_generation = 0
        self._cache: tuple[int, SimState, bool] | None = None  # (generation, parsed state, state.quiet)
        self._watches = threading.local()  # per waiting thread: its inotify watch of the lock file
        # (pid that opened it, lock file descriptor, its generation mapped): a forked child opens its own
        self._lock_fd: tuple[int, int, mmap.mmap] | None = None
        if self.path is None and state is None:
            raise ValueError("StateStore needs a path or an initial state")
        if self.path is not None:
            self._path_str = str(self.path)
            self._lock_path = str(self.path.with_name(self.path.name + ".lock"))
            if state is not None:
                self.save(state)

    def save(self, state: SimState) -> None:
        with self._lock:
            if self.path is None:
                self._memory = state
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._file_lock() as fd:
                self._write(fd, state)

    def _fd(self) -> int:
        pid = _PID[0]
        if self._lock_fd is None or self._lock_fd[0] != pid:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)  # generation 0 (only ever extends: a concurrent first write stays)
            # The generation is read through a shared mapping: a memory read, not a system call, on
            # every simulated NVML call; writers pwrite it, which the mapping sees at once.
            self._lock_fd = (pid, fd, mmap.mmap(fd, 8, access=mmap.ACCESS_READ))
            weakref.finalize(self, os.close, fd)
        return self._lock_fd[1]

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[int]:
        fd = self._fd()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _generation_of(self, fd: int) -> int:
        """The generation in the lock file ``fd``, read through this store's mapping of it."""
        opened = self._lock_fd
        if opened is None or opened[1] != fd:
            raise RuntimeError("the lock file is not this store's")
        return int.from_bytes(opened[2][:8], "little")

    def generation(self) -> int:
        """A number that changes with every write (read without the lock: a torn read only means
        'changed', and the caller looks again)."""
        if self.path is None:
            return self._memory_generation
        return self._generation_of(self._fd())

    def _read(self, fd: int) -> SimState:
        generation = self._generation_of(fd)
        if self._cache is not None and self._cache[0] == generation:
            return self._cache[1]  # nobody wrote since we parsed it
        try:
            fd_state, _ = open_regular(self._path_str, lead="it ")  # (a FIFO blocked, /dev/zero never ended)
            with open(fd_state, "rb", closefd=True) as f:
                raw = f.read(MAX_STATE_BYTES + 1)
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"over {MAX_STATE_BYTES >> 20} MiB: no simulated node's state is")
            state = SimState.from_json(json.loads(raw))
            self._cache = (generation, state, state.quiet)
            return state
        except FileNotFoundError:
            raise FileNotFoundError(f"simulator state {self.path} does not exist; create it with "
                                    f"`migctl --sim FLEET --sim-state {self.path} status`") from None
        except ValidationError as e:
            raise ValueError(e.message) from None

    def _write(self, fd: int, state: SimState) -> None:
        assert self.path is not None
        tmp = f"{self.path.parent}/.{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        raw = json.dumps(state.to_json(), separators=(",", ":")).encode()
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(raw)
        os.replace(tmp, self._path_str)
        generation = self._generation_of(fd) + 1
        os.pwrite(fd, generation.to_bytes(8, "little"), 0)
        self._cache = (generation, state, state.quiet)

    def transaction(self, write: bool = True) -> AbstractContextManager[SimState]:
        """The current state, under the thread and file locks; on normal exit persisted (if
        ``write``).  A class, not a generator: every simulated NVML call opens one (a read-only
        one on a quiet state takes :meth:`enter_quiet` instead)."""
        if self.path is None:
            return _MemoryTransaction(self, write)
        return _FileTransaction(self, write)

    def enter_quiet(self) -> SimState | None:
        """For a caller that promises not to change the state: if nobody wrote since it was last
        read and nothing pending could change it (an armed fault, a real process that may exit),
        the cached state, with the thread lock held but not the file lock; None, nothing held,
        otherwise (the caller then opens a :meth:`transaction`).  Leave with :meth:`exit_quiet`."""
        if self.path is None:
            return None
        self._lock.acquire()
        try:
            fd = self._fd()
            cached = self._cache
            if cached is not None and cached[2] and cached[0] == self._generation_of(fd):
                state = cached[1]
                state.touched = True
                return state
        except BaseException:
            self._lock.release()
            raise
        self._lock.release()
        return None

    def exit_quiet(self, state: SimState, ok: bool) -> None:
        """Leave :meth:`enter_quiet` (``ok``: no exception, or an NVML error: the state stays cached;
        otherwise it is dropped): a read-only entry point must not have changed the state."""
        try:
            if not ok:
                self._cache = None  # the body may have half-changed the cached object
            elif state.touched:
                self._cache = None
                raise RuntimeError("migd-sim: a read-only entry point changed the shared state")
        finally:
            self._lock.release()

    def known_quiet(self, state: SimState) -> bool:
        """Whether ``state`` is the one last read or written and was :attr:`SimState.quiet` then
        (its process list is as parsed or written: no real process to reap; an in-memory store
        does not keep the answer)."""
        cached = self._cache
        return cached is not None and cached[1] is state and cached[2]

    def write_held(self, state: SimState) -> None:
        """Persist now, from inside a transaction (the lock is already held)."""
        if self.path is not None:
            self._write(self._fd(), state)

    def read(self) -> SimState:
        with self.transaction(write=False) as s:
            return s

    def wait_changed(self, seen: int, timeout_s: float) -> None:
        """Return once the generation differs from ``seen`` or ``timeout_s`` passed: inotify on the
        lock file, not a poll of the state; a 20 ms poll of the generation where
        inotify is unavailable."""
        deadline = time.monotonic() + timeout_s
        if self.path is None:
            with self._changed:
                self._changed.wait_for(lambda: self._memory_generation != seen, timeout_s)
            return
        watch: FileWatch | None = getattr(self._watches, "watch", None)
        if watch is None:  # one per waiting thread, kept: it goes when the thread does
            watch = self._watches.watch = FileWatch(self._lock_path)
        while self.generation() == seen:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if watch.works:
                watch.wait(left)
            else:
                time.sleep(min(0.02, left))


class _MemoryTransaction:
    __slots__ = ("store", "write")

    def __init__(self, store: StateStore, write: bool) -> None:
        self.store, self.write = store, write

    def __enter__(self) -> SimState:
        store = self.store
        store._lock.acquire()
        if store._memory is None:
            store._lock.release()
            raise ValueError("in-memory StateStore without a state")
        return store._memory

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        store = self.store
        try:
            if exc_type is None and self.write:
                store._memory_generation += 1
                store._changed.notify_all()
        finally:
            store._lock.release()


class _FileTransaction:
    """Thread lock, then the file lock, then the state (parsed again only if someone wrote)."""

    __slots__ = ("store", "write", "fd", "state")

    def __init__(self, store: StateStore, write: bool) -> None:
        self.store, self.write = store, write

    def __enter__(self) -> SimState:
        store = self.store
        store._lock.acquire()
        try:
            self.fd = fd = store._fd()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                self.state = store._read(fd)
            except BaseException:
                fcntl.flock(fd, fcntl.LOCK_UN)
                raise
        except BaseException:
            store._lock.release()
            raise
        self.state.touched = True
        return self.state

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        store, state = self.store, self.state
        try:
            if exc_type is not None:
                store._cache = None  # the body may have half-changed the cached object
            elif self.write and state.touched:
                store._write(self.fd, state)
            elif not self.write:
                state.touched = True
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            store._lock.release()


def open_store(path: str | os.PathLike[str], fleet: str = DEFAULT_FLEET, mig_enabled: bool = False) -> StateStore:
    """Open a shared state file, creating it for ``fleet`` if it does not exist yet."""
    p = Path(path)
    if p.exists():
        return StateStore(p)
    return StateStore(p, new_state(fleet, mig_enabled))
