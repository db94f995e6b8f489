"""The Xid classes migd knows, and the mark a GPU-wide fault leaves (NVIDIA's Xid catalog,
docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog").

Counters start at 0 for every known class on every GPU, so ``increase()`` sees the first Xid
(Prometheus takes a series' first sample as its start: a counter born at 1 shows no increase).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# GPU-wide Xids after which the GPU needs attention (reset, drain) before anything else:
# 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92/94/95 ECC
# (high single-bit rate, contained, uncontained), 119/120 GSP errors.
FATAL_GPU_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
# Xids an application's fault raises, which NVML attributes to the GPU instance it ran in: 13 graphics
# engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup.
INSTANCE_XIDS = frozenset({13, 31, 43, 45})
KNOWN_XIDS = tuple(sorted(FATAL_GPU_XIDS | INSTANCE_XIDS))


@dataclass(frozen=True)
class FaultMark:
    """Why a GPU is marked unhealthy: the GPU-wide Xid and when (reconfiguring it is refused)."""

    xid: int
    at: float

    def __str__(self) -> str:  # the reason migd.daemon/v1's ``unhealthy`` and the log give
        return self.text(utc_iso)

    def text(self, shown: Callable[[float], str]) -> str:
        """The mark in words, its time as ``shown`` renders a Unix time (migd's own clock, when it runs one)."""
        return fault_text(self.xid, shown(self.at))


def utc_iso(epoch: float) -> str:
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(epoch))


def fault_text(xid: int, at: str) -> str:
    """A fault mark in words, ``at`` as the reader's clock shows it (``migctl daemon``: migd's own)."""
    return f"Xid {xid} (GPU-wide) at {at}"
