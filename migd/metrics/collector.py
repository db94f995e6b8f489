"""A prometheus-client custom collector over the sampler's snapshot and the daemon's status.

Series are rebuilt from the snapshot on every scrape, so an instance's series vanish with
the instance.  Nothing here is a global metric object and nothing here calls NVML.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from migd.daemon.status import Outcome, Progress
from migd.metrics.sampler import NvmlErrorCounter, Sampler
from migd.slurm.transition import Phase

INSTANCE_LABELS = ["gpu", "gpu_uuid", "gi", "ci", "profile", "mig_uuid", "owner"]
GPU_LABELS = ["gpu", "gpu_uuid"]
APPLY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
ACTIVITY = (("sm_active", "Fraction of time SMs of the instance were busy (GPM)"),
            ("sm_occupancy", "Fraction of warps resident vs the instance's maximum (GPM)"),
            ("graphics_active", "Fraction of time any compute/graphics engine of the instance was active (GPM)"),
            ("tensor_active", "Fraction of time the instance's SMs ran tensor operations (GPM)"),
            ("dram_active", "Fraction of the instance's DRAM bandwidth in use (GPM)"))


@dataclass
class EventCounters:
    """Xid counters per GPU/instance/Xid and last-event times (fed by the fault watch)."""

    xids: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)  # gpu, gpu_uuid, gi, xid
    last_event: dict[tuple[str, str], float] = field(default_factory=dict)  # (gpu, kind) -> time
    breaches: Counter[tuple[str, str]] = field(default_factory=Counter)  # gpu, gpu_uuid
    lock: threading.Lock = field(default_factory=threading.Lock)


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


def _readable(snap: Any) -> Iterator[Metric]:
    up = GaugeMetricFamily("migd_gpu_up", "1 if NVML answered for the GPU in the last sampling cycle",
                           labels=["gpu"])
    lost = GaugeMetricFamily("migd_gpu_lost", "1 if NVML says the GPU is lost (GPU_IS_LOST: fallen off the bus)",
                             labels=["gpu"])
    for g in snap.gpus if snap else ():
        up.add_metric([str(g.info.index)], 1)
        lost.add_metric([str(g.info.index)], 0)
    for u in snap.unread if snap else ():
        up.add_metric([str(u.index)], 0)
        lost.add_metric([str(u.index)], 1 if u.lost else 0)
    yield from (up, lost)


class MigdCollector(Collector):
    def __init__(self, sampler: Sampler, status: Callable[[], Any], errors: NvmlErrorCounter,
                 events: EventCounters | None = None, audit: Callable[[], list[Any]] | None = None) -> None:
        self.sampler = sampler
        self.status = status
        self.errors = errors
        self.events = events or EventCounters()
        self.audit = audit
        self.histogram = ApplyHistogram()

    def observe_apply(self, result: object, outcome: str, seconds: float) -> None:
        """The daemon's on_apply callback."""
        self.histogram.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        yield from self.snapshot_families()
        yield from self.live_families()

    def snapshot_families(self) -> Iterator[Metric]:
        """What the sampler's last snapshot holds: most of the bytes, new once per sampling cycle."""
        yield from self._gpus()

    def live_families(self) -> Iterator[Metric]:
        """The daemon's own series (status, counters, faults): few, and current at every scrape."""
        yield from self._daemon()
        yield from self._faults()


    def _gpus(self) -> Iterator[Metric]:
        snap = self.sampler.snapshot
        info = GaugeMetricFamily("migd_gpu_info", "GPU identity and MIG mode (value 1)",
                                 labels=GPU_LABELS + ["model", "name", "pci_bus_id", "mig_mode_current",
                                                      "mig_mode_pending"])
        mem = GaugeMetricFamily("migd_gpu_memory_total_bytes", "Total GPU memory", labels=GPU_LABELS)
        gpu_procs = GaugeMetricFamily("migd_gpu_processes", "Compute processes on a GPU in non-MIG mode",
                                      labels=GPU_LABELS)
        inst = GaugeMetricFamily("migd_instance_info", "MIG instance with placement and activity source (value 1); "
                                 "activity_source=none means NVML offers no per-instance utilization (Ampere)",
                                 labels=INSTANCE_LABELS + ["placement_start", "placement_size", "activity_source"])
        used = GaugeMetricFamily("migd_instance_memory_used_bytes", "Memory used in the MIG device",
                                 labels=INSTANCE_LABELS)
        total = GaugeMetricFamily("migd_instance_memory_total_bytes", "Memory of the MIG device",
                                  labels=INSTANCE_LABELS)
        procs = GaugeMetricFamily("migd_instance_processes", "Running compute processes in the MIG device",
                                  labels=INSTANCE_LABELS)
        act = {k: GaugeMetricFamily(f"migd_instance_{k}_ratio", h, labels=INSTANCE_LABELS) for k, h in ACTIVITY}
        yield from _readable(snap)
        for g in snap.gpus if snap else ():
            gl = [str(g.info.index), g.info.uuid]
            info.add_metric(gl + [g.info.model_key, g.info.name, g.info.pci_bus_id,
                                  "enabled" if g.info.mig_current else "disabled",
                                  "enabled" if g.info.mig_pending else "disabled"], 1)
            mem.add_metric(gl, g.info.memory_total_bytes)
            if not g.info.mig_current:
                gpu_procs.add_metric(gl, g.processes)
            for i in g.instances:
                labels = gl + [str(i.gi_id), str(i.ci_id), i.profile, i.mig_uuid, i.owner]
                inst.add_metric(labels + [str(i.placement_start), str(i.placement_size), i.activity_source], 1)
                used.add_metric(labels, i.memory_used_bytes)
                total.add_metric(labels, i.memory_total_bytes)
                procs.add_metric(labels, i.processes)
                if i.activity is not None:
                    for k, _ in ACTIVITY:
                        v = getattr(i.activity, k)
                        if v is not None:
                            act[k].add_metric(labels, v)
        yield from (info, mem, gpu_procs, inst, used, total, procs, *act.values())

    def _daemon(self) -> Iterator[Metric]:
        st = self.status()
        g = GaugeMetricFamily("migd_profile_desired_info", "Profile the schedule (or an override) wants now",
                              labels=["profile"])
        if st.desired_profile:
            g.add_metric([st.desired_profile], 1)
        yield g
        g = GaugeMetricFamily("migd_profile_applied_info", "Profile last found fully applied", labels=["profile"])
        if st.applied_profile:
            g.add_metric([st.applied_profile], 1)
        yield g
        yield GaugeMetricFamily("migd_drift_gpus", "GPUs whose layout differs from the desired profile",
                                value=len(st.drifted))
        yield GaugeMetricFamily("migd_transition_blocked", "1 while a transition waits for busy instances",
                                value=1 if st.blocked_since else 0)
        g = GaugeMetricFamily("migd_gpu_blocked_since_timestamp_seconds",
                              "Since when a GPU's change waits for busy instances (the other GPUs went ahead)",
                              labels=["gpu"])
        for i, b in st.with_progress(Progress.WAITING).items():
            g.add_metric([str(i)], b.since)
        yield g
        c = CounterMetricFamily("migd_applies", "Apply attempts by result", labels=["result"])
        for result in Outcome:
            c.add_metric([result.value], st.apply_count.get(result, 0))
        yield c
        last = st.last_apply
        yield GaugeMetricFamily("migd_last_apply_timestamp_seconds", "Unix time of the last apply attempt",
                                value=last.time if last else 0)
        yield GaugeMetricFamily("migd_last_apply_success", "1 if the last apply attempt succeeded",
                                value=1 if last and last.result in (Outcome.SUCCESS, Outcome.UNCHANGED) else 0)
        cum, total = self.histogram.cumulative()
        yield HistogramMetricFamily("migd_apply_duration_seconds", "Duration of apply attempts", buckets=cum,
                                    sum_value=total)
        c = CounterMetricFamily("migd_nvml_errors", "NVML calls that failed", labels=["function", "error"])
        for (fn, err), n in sorted(self.errors.snapshot().items()):
            c.add_metric([fn, err], n)
        yield c
        yield GaugeMetricFamily("migd_sampler_last_success_timestamp_seconds", "Unix time of the last NVML sample",
                                value=self.sampler.last_success or 0)
        snap = self.sampler.snapshot
        yield GaugeMetricFamily("migd_sampler_duration_seconds", "Wall time of the last sampling cycle",
                                value=snap.duration_s if snap else 0)
        yield GaugeMetricFamily("migd_sampler_cpu_seconds", "Process CPU time during the last sampling cycle",
                                value=self.sampler.cpu_seconds_last)
        yield CounterMetricFamily("migd_sampler_cycles", "Completed NVML sampling cycles", value=self.sampler.cycles)
        if st.slurm is not None:
            yield from _slurm(st.slurm)

    def _faults(self) -> Iterator[Metric]:
        ev = self.events
        c = CounterMetricFamily("migd_xid_events", "Xid errors by GPU, GPU instance (gi=\"gpu\" when GPU-wide) and Xid",
                                labels=["gpu", "gpu_uuid", "gi", "xid"])
        b = CounterMetricFamily("migd_isolation_breaches", "Instance-scoped faults that affected another instance",
                                labels=GPU_LABELS)
        last = GaugeMetricFamily("migd_last_event_timestamp_seconds", "Unix time of the last NVML event by kind",
                                 labels=["gpu", "kind"])
        with ev.lock:
            for key, n in sorted(ev.xids.items()):
                c.add_metric(list(key), n)
            for gkey, n in sorted(ev.breaches.items()):
                b.add_metric(list(gkey), n)
            for (gpu, kind), t in sorted(ev.last_event.items()):
                last.add_metric([gpu, kind], t)
        st = self.status()
        un = GaugeMetricFamily("migd_gpu_unhealthy", "1 while a GPU-wide fault blocks reconfiguration of the GPU",
                               labels=["gpu_uuid", "reason"])
        for uuid, reason in sorted(st.unhealthy.items()):
            un.add_metric([uuid, reason], 1)
        yield from (c, b, last, un)
        if self.audit is not None:
            f = GaugeMetricFamily("migd_audit_findings", "Fault-isolation audit findings by GPU and check",
                                  labels=["gpu", "check", "severity"])
            for finding in self.audit():
                f.add_metric([str(finding.gpu), finding.check.value, finding.severity.value], 1)
            yield f



def _slurm(doc: dict[str, Any]) -> Iterator[Metric]:
    """Slurm mode: where the node's switch stands (every phase listed, so series never vanish)."""
    node = str(doc.get("node", ""))
    g = GaugeMetricFamily("migd_slurm_phase", "1 for the Slurm switch phase the node is in", labels=["node", "phase"])
    for phase in Phase:
        g.add_metric([node, phase.value], 1 if doc.get("phase") == phase.value else 0)
    yield g
    g = GaugeMetricFamily("migd_slurm_jobs_waiting", "Jobs holding GPUs that the drained node waits for",
                          labels=["node"])
    g.add_metric([node], float(doc.get("jobs_waiting") or 0))
    yield g
    g = GaugeMetricFamily("migd_slurm_gres_in_sync", "1 if Slurm registered the node with the GRES of its layout "
                          "(after migd's last switch)", labels=["node"])
    if doc.get("gres_in_sync") is not None:
        g.add_metric([node], 1 if doc["gres_in_sync"] else 0)
    yield g
    g = GaugeMetricFamily("migd_slurm_reserved", "1 while a MAINT reservation holds the node for the next transition",
                          labels=["node"])
    g.add_metric([node], 1 if doc.get("reservation") else 0)
    yield g


class Part(Collector):
    """One part of a collector as a collector of its own (the server renders the parts separately)."""

    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return self.families()
