"""The GPU-wide fault marks, owned in one place under one lock.

The fault watch sets a mark from its own thread when a fatal Xid arrives; an operator clears it
(``migctl clear-fault``); status and scrapes read copies; and an apply checks it at the last moment
before every change to a GPU, holding the same lock the watch takes to set it.  So a fatal Xid that
lands while an apply waits for busy instances is seen before the next step, never 15 ms after it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from migd.isolation.xids import FaultMark


class FaultMarks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[str, FaultMark] = {}

    def mark(self, uuid: str, mark: FaultMark) -> None:
        with self._lock:
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
        return {uuid: str(mark) for uuid, mark in self.snapshot().items()}

    @contextmanager
    def guard(self, uuid: str) -> Iterator[str | None]:
        """The GPU's mark (None: healthy), with marking held off until the block ends: a caller that
        finds none makes its change before any new mark can be set."""
        with self._lock:
            mark = self._marks.get(uuid)
            yield None if mark is None else str(mark)
