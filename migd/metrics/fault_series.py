"""Fault series: Xids, isolation breaches, GPU-wide fault marks, audit findings.

Counters exist from the start at 0 for every known label set (each GPU with each known Xid class,
each live GPU instance with each instance-scoped class, each GPU's breaches), so ``increase()``
counts the first event.  Labels carry identities only: a fault mark's time is a value, its Xid a
label from a small fixed set, and audit findings are counted per (GPU, check), one series each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from migd.isolation.audit import SEVERITY, Check
from migd.isolation.xids import INSTANCE_XIDS, KNOWN_XIDS, FaultMark
from migd.metrics.snapshot import Snapshot
from migd.numeral import order

Gpu = tuple[str, str]  # (index, uuid)


def known_gpus(snap: Snapshot | None, events: Any) -> list[Gpu]:
    """Every GPU the last snapshot read, and any other an event named (a lost one)."""
    gpus = {str(g.info.index): g.info.uuid for g in snap.gpus} if snap else {}
    for uuid, index in events.gpu_of.items():
        gpus.setdefault(index, uuid)
    return sorted(gpus.items(), key=lambda kv: order(kv[0]))


def xid_families(snap: Snapshot | None, events: Any, gpus: list[Gpu]) -> Iterator[Metric]:
    every = CounterMetricFamily("migd_xid_events", "Xid errors on a GPU, GPU-wide or in one of its instances",
                                labels=["gpu", "gpu_uuid", "xid"])
    inst = CounterMetricFamily("migd_instance_xid_events", "Xid errors NVML attributed to a GPU instance",
                               labels=["gpu", "gpu_uuid", "gi", "xid"])
    breaches = CounterMetricFamily("migd_isolation_breaches", "Instance-scoped faults that affected another "
                                   "instance of the GPU", labels=["gpu", "gpu_uuid"])
    live_gis = [(str(g.info.index), g.info.uuid, str(i.gi_id)) for g in snap.gpus for i in g.instances] if snap else []
    with events.lock:
        counts = dict.fromkeys(((g, u, str(x)) for g, u in gpus for x in KNOWN_XIDS), 0) | dict(events.xids)
        inst_counts = dict.fromkeys(((g, u, gi, str(x)) for g, u, gi in live_gis for x in sorted(INSTANCE_XIDS)), 0)
        inst_counts |= dict(events.instance_xids)
        breach_counts = dict.fromkeys(gpus, 0) | dict(events.breaches)
        last = sorted(events.last_event.items())
    for key, n in sorted(counts.items()):
        every.add_metric(list(key), n)
    for ikey, n in sorted(inst_counts.items()):
        inst.add_metric(list(ikey), n)
    for gkey, n in sorted(breach_counts.items()):
        breaches.add_metric(list(gkey), n)
    seen = GaugeMetricFamily("migd_last_event_timestamp_seconds", "Unix time of the last NVML event by kind",
                             labels=["gpu", "kind"])
    for (gpu, kind), t in last:
        seen.add_metric([gpu, kind], t)
    yield from (every, inst, breaches, seen)


def unhealthy_families(marks: dict[str, FaultMark], gpus: list[Gpu]) -> Iterator[Metric]:
    flag = GaugeMetricFamily("migd_gpu_unhealthy", "1 while a GPU-wide fault blocks reconfiguration of the GPU "
                             "(until migctl clear-fault)", labels=["gpu", "gpu_uuid"])
    since = GaugeMetricFamily("migd_gpu_unhealthy_since_timestamp_seconds", "When the GPU-wide fault that "
                              "marked the GPU happened, and its Xid", labels=["gpu", "gpu_uuid", "xid"])
    index = {uuid: gpu for gpu, uuid in gpus}
    for gpu, uuid in gpus:
        flag.add_metric([gpu, uuid], 1 if uuid in marks else 0)
    for uuid, mark in sorted(marks.items()):
        if uuid not in index:
            flag.add_metric(["", uuid], 1)
        since.add_metric([index.get(uuid, ""), uuid, str(mark.xid)], mark.at)
    yield from (flag, since)


def audit_families(findings: Iterable[Any], gpus: list[Gpu]) -> Iterator[Metric]:
    fam = GaugeMetricFamily("migd_audit_findings", "Fault-isolation audit findings by GPU and check (details: "
                            "migctl isolation)", labels=["gpu", "check", "severity"])
    counts = {(gpu, c.value, SEVERITY[c].value): 0 for gpu, _ in gpus for c in Check}
    for f in findings:
        key = (str(f.gpu), f.check.value, f.severity.value)
        counts[key] = counts.get(key, 0) + 1
    for key, n in sorted(counts.items()):
        fam.add_metric(list(key), n)
    yield fam
