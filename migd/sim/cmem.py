"""C memory as the simulated NVML library sees it: pointers checked, handles as real addresses.

The real libnvidia-ml dereferences whatever the caller passes.  A caller that hands it a
struct *by value* where nvml.h declares a pointer (``const nvmlGpuInstancePlacement_t *``)
makes the library read an address built from the struct's bytes (for placement {start=1,
size=1} on x86-64: 0x100000001): a segfault, or garbage accepted.  The simulator reads no
address it has not checked: it probes the bytes through ``/proc/self/mem`` first and reports
an unmapped or NULL pointer as an ABI violation, loudly, instead of crashing or guessing.  A page
found readable once is trusted afterwards (see :class:`Memory`).
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

from migd.sim.gpu import NvmlFail

C = TypeVar("C", bound=Any)
_MIN_ADDRESS = 0x10000  # the kernel never maps the first 64 KiB (vm.mmap_min_addr)
_PAGE_SHIFT = mmap.PAGESIZE.bit_length() - 1
_PAGES_KEPT = 4096  # pages known readable, forgotten all at once when there are more


class AbiViolation(NvmlFail):
    """The caller broke the C contract of an NVML entry point (bad pointer, wrong struct version)."""

    def __init__(self, message: str) -> None:
        super().__init__(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Memory:
    """Checked access to the caller's memory."""

    def __init__(self) -> None:
        self._mem: int | None = None
        # Pages a probe found readable.  A pointer into one is not probed again (a system call on
        # every simulated NVML call).  If such a page is unmapped later and a caller then
        # passes a pointer into it, the simulator crashes on it as the real library would; garbage
        # from a struct passed by value (0x100000001) lies in no page a caller's buffer used.
        self._pages: set[int] = set()
        self._open()
        # /proc/self/mem is bound to the process that opened it: a forked child must open its own.
        os.register_at_fork(after_in_child=self._open)
        self.violations: list[str] = []
        self._lock = threading.Lock()

    def _open(self) -> None:
        self._pages = set()
        if self._mem is not None:
            os.close(self._mem)
        try:
            self._mem = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._mem = None  # no procfs: fall back to the NULL/low-address check alone

    def readable(self, addr: int | None, size: int) -> bool:
        if not addr or addr < _MIN_ADDRESS:
            return False
        if self._mem is None:
            return True
        first, last = addr >> _PAGE_SHIFT, (addr + size - 1) >> _PAGE_SHIFT
        pages = self._pages
        if first in pages and last in pages:
            return True
        try:
            if len(os.pread(self._mem, size, addr)) != size:
                return False
        except (OSError, OverflowError, ValueError):
            return False
        if len(pages) >= _PAGES_KEPT:
            pages.clear()
        pages.update(range(first, last + 1))
        return True

    def at(self, fn: str, what: str, addr: int | None, ctype: type[C]) -> C:
        """The ``ctype`` object the caller's pointer ``addr`` points to; an ABI violation if it can't."""
        if not self.readable(addr, ctypes.sizeof(ctype)):
            raise self.violation(f"{fn}: argument '{what}' is not a valid pointer to {ctype.__name__} "
                                 f"({_hex(addr)}); a struct passed by value where nvml.h declares a pointer?")
        obj: C = ctype.from_address(addr)
        return obj

    def optional(self, fn: str, what: str, addr: int | None, ctype: type[C]) -> C | None:
        """Like :meth:`at`, for pointers nvml.h allows to be NULL."""
        return None if not addr else self.at(fn, what, addr, ctype)

    def versioned(self, fn: str, what: str, addr: int | None, ctype: type[C], version: int) -> C:
        """A versioned struct: nvml.h requires ``.version`` set "prior to calling this function"."""
        obj = self.at(fn, what, addr, ctype)
        if obj.version != version:
            raise self.violation(f"{fn}: {what}.version is {obj.version:#x}, expected {version:#x}")
        return obj

    def write_string(self, fn: str, addr: int | None, length: int, text: str) -> None:
        """Copy a NUL-terminated string into a caller buffer of ``length`` bytes."""
        raw = text.encode() + b"\0"
        if length < len(raw):
            raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        buf = self.at(fn, "buffer", addr, ctypes.c_char * len(raw))
        ctypes.memmove(ctypes.addressof(buf), raw, len(raw))

    def violation(self, message: str) -> AbiViolation:
        with self._lock:
            self.violations.append(message)
            del self.violations[:-100]
        print(f"migd-sim: NVML ABI violation: {message}", file=sys.stderr, flush=True)
        if os.environ.get("MIGD_SIM_ABI_ABORT") == "1":
            os.abort()  # as the real library would crash the caller
        return AbiViolation(message)


def _hex(addr: int | None) -> str:
    return "NULL" if not addr else f"{addr:#x}"


@dataclass(frozen=True)
class Ref:
    """What a handle stands for."""

    kind: str  # gpu | gi | ci | mig | eventset | gpm
    gpu: int = -1
    gi_serial: int = -1
    ci_serial: int = -1


class Handles:
    """Opaque handles that are real addresses in library-owned memory, like the driver's.

    A handle is reused for the same object, dropped when its object goes (``drop``), and the
    arena is bounded: handles of objects that no longer exist are collected when it fills."""

    SLOTS = 1 << 16

    def __init__(self) -> None:
        self._arena = ctypes.create_string_buffer((self.SLOTS + 1) * 16)
        self._base = ctypes.addressof(self._arena)
        self._by_addr: dict[int, Ref] = {}
        self._by_ref: dict[Ref, int] = {}
        self._free: collections.deque[int] = collections.deque()  # FIFO: a stale handle is not reused soon
        self._next = 0
        self._lock = threading.Lock()

    def address(self, ref: Ref) -> int:
        with self._lock:
            addr = self._by_ref.get(ref)
            if addr is None:
                addr = self._allocate()
                self._by_addr[addr] = ref
                self._by_ref[ref] = addr
            return addr

    def _allocate(self) -> int:
        # Fresh slots first, freed ones (oldest first) only when the arena is used up: a handle
        # the caller kept after its object went stays invalid for as long as possible.
        if self._next < self.SLOTS:
            self._next += 1
            return self._base + 16 * self._next
        if self._free:
            return self._free.popleft()
        raise NvmlFail(pynvml.NVML_ERROR_MEMORY)

    def ref(self, addr: int | None, *kinds: str) -> Ref:
        """The object behind a handle; nvml.h answers INVALID_ARGUMENT for an invalid handle."""
        ref = self._by_addr.get(addr or 0)
        if ref is None or ref.kind not in kinds:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ref

    def drop(self, keep: Any) -> int:
        """Forget every handle for which ``keep(ref)`` is false; returns how many went."""
        with self._lock:
            gone = [a for a, r in self._by_addr.items() if not keep(r)]
            for a in gone:
                del self._by_ref[self._by_addr.pop(a)]
                self._free.append(a)
            return len(gone)

    def __len__(self) -> int:
        return len(self._by_addr)

    def clear(self) -> None:
        self.drop(lambda r: False)
