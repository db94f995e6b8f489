"""What the fault watch counts: Xids per GPU and instance, isolation breaches, last-event times.

Written by the watch's thread through :meth:`EventCounters.xid` and :meth:`EventCounters.breach`, read
by the metrics under the same lock; ``version`` changes with every write, so a scrape re-renders only
when something was counted.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class EventCounters:
    """Xid counters per GPU/instance/Xid and last-event times (fed by the fault watch)."""

    xids: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # gpu, gpu_uuid, xid: every Xid
    gpu_of: dict[str, str] = field(default_factory=dict)  # gpu uuid -> index, as the events named them
    instance_xids: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)  # gpu, gpu_uuid, gi, xid
    version: int = 0  # bumped (under the lock) whenever anything here changes
    last_event: dict[tuple[str, str], float] = field(default_factory=dict)  # (gpu, kind) -> time
    breaches: Counter[tuple[str, str]] = field(default_factory=Counter)  # gpu, gpu_uuid
    lock: threading.Lock = field(default_factory=threading.Lock)

    def event(self, gpu: int, uuid: str, kind: str, at: float, xid: int | None = None,
              gi: int | None = None) -> None:
        """One event from NVML: its time, and for an Xid its count (per instance where NVML names one)."""
        with self.lock:
            self.last_event[(str(gpu), kind)] = at
            self.version += 1
            self.gpu_of[uuid] = str(gpu)
            if xid is not None:
                self.xids[(str(gpu), uuid, str(xid))] += 1
                if gi is not None:
                    self.instance_xids[(str(gpu), uuid, str(gi), str(xid))] += 1

    def breach(self, gpu: int, uuid: str) -> None:
        with self.lock:
            self.breaches[(str(gpu), uuid)] += 1
            self.version += 1
