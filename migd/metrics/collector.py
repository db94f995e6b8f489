"""A prometheus-client custom collector over the sampler's snapshot and the daemon's status.

Series are rebuilt from the snapshot on every rendering, so an instance's series vanish with
the instance.  Nothing here is a global metric object and nothing here calls NVML.  The families
live in gpus.py (the snapshot), daemonstate.py and fault_series.py (the daemon's own state).
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from migd.isolation.events import EventCounters
from migd.metrics import daemonstate, fault_series, gpus
from migd.metrics.sampler import NvmlErrorCounter, Sampler

APPLY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


@dataclass
class ApplyHistogram:
    """Apply durations, observed by the daemon's thread and read by scrapes."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(APPLY_BUCKETS) + 1))
    total: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, seconds: float) -> None:
        with self.lock:
            self.buckets[bisect.bisect_left(APPLY_BUCKETS, seconds)] += 1
            self.total += seconds

    def cumulative(self) -> tuple[list[tuple[str, int]], float]:
        with self.lock:
            counts, total = list(self.buckets), self.total
        return list(zip([*map(str, APPLY_BUCKETS), "+Inf"], itertools.accumulate(counts), strict=True)), total


class MigdCollector(Collector):
    def __init__(self, sampler: Sampler, status: Callable[[], Any], errors: NvmlErrorCounter,
                 events: EventCounters | None = None, audit: Callable[[], list[Any]] | None = None,
                 hostname: str = "") -> None:
        self.sampler = sampler
        self.status = status
        self.errors = errors
        self.events = events or EventCounters()
        self.audit = audit
        self.hostname = hostname
        self.histogram = ApplyHistogram()

    def observe_apply(self, result: object, outcome: str, seconds: float) -> None:
        """The daemon's on_apply callback."""
        self.histogram.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        yield from self.slow_families()
        yield from self.live_families()

    def slow_families(self) -> Iterator[Metric]:
        """What changes with a sampler snapshot or a fault event: most of the bytes, rendered once
        per :meth:`version`."""
        snap = self.sampler.snapshot
        yield from gpus.snapshot_families(snap, self.hostname)
        st = self.status()
        known = fault_series.known_gpus(snap, self.events)
        yield from fault_series.xid_families(snap, self.events, known)
        yield from fault_series.unhealthy_families(st.unhealthy.snapshot(), known)
        if self.audit is not None:
            yield from fault_series.audit_families(self.audit(), known)

    def version(self) -> tuple[Any, ...]:
        """What the slow families are made of: a new snapshot, an event counted, a fault mark set or
        cleared, a new audit."""
        marks = tuple(sorted(self.status().unhealthy.snapshot().items()))
        return self.sampler.snapshot, self.events.version, marks, tuple(self.audit()) if self.audit else ()

    def live_families(self) -> Iterator[Metric]:
        """The daemon's own series (status, applies, the sampler): few, and current at every scrape."""
        st = self.status()
        yield daemonstate.build_info(self.hostname)
        yield from daemonstate.profile_families(st)
        yield from daemonstate.transition_families(st)
        yield from daemonstate.apply_families(st, self.histogram, self.errors.snapshot())
        yield from daemonstate.sampler_families(self.sampler)
        if st.access is not None:
            yield from daemonstate.access_families(st.access)
        if st.slurm is not None:
            yield from daemonstate.slurm_families(st.slurm)
        if st.demand is not None:
            yield from daemonstate.demand_families(st.demand)


class Part(Collector):
    """One part of a collector as a collector of its own (the server renders the parts separately)."""

    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return self.families()
