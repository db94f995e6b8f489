"""The GPU-wide fault marks, owned in one place.

The fault watch sets a mark from its own thread when a fatal Xid arrives; an operator clears it
(``migctl clear-fault``); status and scrapes read copies; and an apply checks it at the last moment
before every change to a GPU, holding the lock the watch takes to set it (``_marking``) through the
change.  So a fatal Xid that lands while an apply waits for busy instances is seen before the next
step, never 15 ms after it.  Readers take only the short lock over the marks themselves (``_data``):
with one lock for both, a scrape waited out every GPU's change, and /metrics, /healthz and the page
stopped answering for the whole of a slow apply.

A mark is only as early as the watch's reading of the event, and the fatal Xid most likely to come
while an apply waits is the one that ends the awaited work (Xid 79 takes every process with it): the
wait ends the moment the event is delivered.  So before its first change an apply asks for the marks
as of every event delivered by then (:meth:`FaultMarks.caught_up`), which waits for the watch to read
them all: the mark wins that race by construction, not by which thread wakes first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from migd.isolation.xids import FaultMark, utc_iso

log = logging.getLogger("migd.faults")
CATCH_UP_S = 10.0  # the watch reads a pending event within ~0.1 s; this long means it is stuck in NVML


class FaultMarks:
    def __init__(self) -> None:
        self._marking = threading.Lock()  # held through a guarded change: no mark is set meanwhile
        self._lock = threading.Lock()  # over the dict alone: never held for longer than a copy
        self._marks: dict[str, FaultMark] = {}
        self._reader: Callable[[float], bool] | None = None  # the running fault watch's catch-up
        # how a mark's time reads in its words (refusals, ``unhealthy``, the log): UTC, or on migd's own
        # clock (--now, --time-scale), which the daemon sets, so that one screen shows one clock
        self.shown: Callable[[float], str] = utc_iso

    def read_by(self, catch_up: Callable[[float], bool] | None) -> None:
        """The fault watch that sets these marks, while it runs (None: none runs, as in migctl's own
        apply): ``catch_up(timeout_s)`` returns once it has read every event delivered before the call
        (False: it did not in time)."""
        self._reader = catch_up

    def mark(self, uuid: str, mark: FaultMark) -> None:
        with self._marking, self._lock:
            self._marks[uuid] = mark

    def clear(self, uuid: str) -> bool:
        """Whether there was a mark to clear."""
        with self._lock:
            return self._marks.pop(uuid, None) is not None

    def snapshot(self) -> dict[str, FaultMark]:
        """A copy: iterating it never races the watch."""
        with self._lock:
            return dict(self._marks)

    def reasons(self) -> dict[str, str]:
        return {uuid: mark.text(self.shown) for uuid, mark in self.snapshot().items()}

    def caught_up(self) -> dict[str, str]:
        """:meth:`reasons` once the watch has read every event the driver delivered before this call:
        what an apply reads right before its first change.  A watch that does not catch up in
        ``CATCH_UP_S`` is said, and the marks it has set are the answer (each change still checks)."""
        reader = self._reader
        if reader is not None and not reader(CATCH_UP_S):
            log.warning("the fault watch did not read the driver's pending events (stopping, or not in %gs); "
                        "going on with the fault marks set so far", CATCH_UP_S)
        return self.reasons()

    @contextmanager
    def guard(self, uuid: str) -> Iterator[str | None]:
        """The GPU's mark (None: healthy), with marking held off until the block ends: a caller that
        finds none makes its change before any new mark can be set."""
        with self._marking:
            with self._lock:
                mark = self._marks.get(uuid)
            yield None if mark is None else mark.text(self.shown)
