"""Series from the sampler's snapshot: GPUs, their GPU instances, the compute instances inside.

Each series belongs to the level its value belongs to: a GPU instance's memory, GPM
activity and size are exported once per GI (``migd_instance_*``), a compute instance's processes
once per CI (``migd_compute_instance_*``), so summing over instances never counts a GI twice.
Sizes are values, not only labels: ``sum by (owner) (migd_instance_compute_slices)`` is an
owner's share, and ``migd_instance_gpu_fraction`` the GPUs it holds.  Labels are stable
identities (no times, no free text).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from migd.metrics.snapshot import GiSample, GpuSample, Snapshot
from migd.printable import shown

GPU_LABELS = ["gpu", "gpu_uuid"]
GI_LABELS = GPU_LABELS + ["gi", "profile", "owner"]
CI_LABELS = GPU_LABELS + ["gi", "ci", "mig_uuid", "owner"]
ACTIVITY = (("sm_active", "Fraction of time the GPU instance's SMs were busy (GPM)"),
            ("sm_occupancy", "Fraction of warps resident vs the GPU instance's maximum (GPM)"),
            ("graphics_active", "Fraction of time any compute/graphics engine of the GPU instance was active (GPM)"),
            ("tensor_active", "Fraction of time the GPU instance's SMs ran tensor operations (GPM)"),
            ("dram_active", "Fraction of the GPU instance's DRAM bandwidth in use (GPM)"))


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def readable_families(snap: Snapshot | None) -> Iterator[Metric]:
    up = _gauge("migd_gpu_up", "1 if NVML answered for the GPU in the last sampling cycle", ["gpu"])
    lost = _gauge("migd_gpu_lost", "1 if NVML says the GPU is lost (GPU_IS_LOST: fallen off the bus)", ["gpu"])
    for g in snap.gpus if snap else ():
        up.add_metric([str(g.info.index)], 1)
        lost.add_metric([str(g.info.index)], 0)
    for u in snap.unread if snap else ():
        up.add_metric([str(u.index)], 0)
        lost.add_metric([str(u.index)], 1 if u.lost else 0)
    yield from (up, lost)


def gpu_families(snap: Snapshot | None, hostname: str) -> Iterator[Metric]:
    info = _gauge("migd_gpu_info", "GPU identity, MIG mode and the node's hostname (value 1)",
                  GPU_LABELS + ["model", "name", "pci_bus_id", "mig_mode_current", "mig_mode_pending", "hostname"])
    mem = _gauge("migd_gpu_memory_total_bytes", "Total GPU memory", GPU_LABELS)
    procs = _gauge("migd_gpu_processes", "Compute processes on a GPU in non-MIG mode", GPU_LABELS)
    compute = _gauge("migd_gpu_compute_slices", "Compute slices the GPU offers to MIG (7 on an A100 or H100)",
                     GPU_LABELS)
    memory = _gauge("migd_gpu_memory_slices", "Memory slices the GPU offers to MIG (8 on an A100 or H100)",
                    GPU_LABELS)
    for g in snap.gpus if snap else ():
        gl = [str(g.info.index), g.info.uuid]
        info.add_metric(gl + [g.info.model_key, shown(g.info.name), g.info.pci_bus_id,  # (NVML's free text)
                              "enabled" if g.info.mig_current else "disabled",
                              "enabled" if g.info.mig_pending else "disabled", hostname], 1)
        mem.add_metric(gl, g.info.memory_total_bytes)
        if not g.info.mig_current:
            procs.add_metric(gl, g.processes)
        if g.compute_slices:
            compute.add_metric(gl, g.compute_slices)
            memory.add_metric(gl, g.memory_slices)
    yield from (info, mem, procs, compute, memory)


def instance_families(snap: Snapshot | None) -> Iterator[Metric]:
    """One series per GPU instance for what belongs to the GI."""
    info = _gauge("migd_instance_info", "GPU instance with its placement and activity source (value 1); "
                  "activity_source=none: NVML offers no per-instance utilization (Ampere)",
                  GI_LABELS + ["placement_start", "placement_size", "activity_source"])
    size = {k: _gauge(f"migd_instance_{k}", h, GI_LABELS) for k, h in (
        ("compute_slices", "Compute slices the GPU instance holds"),
        ("memory_slices", "Memory slices the GPU instance holds"),
        ("gpu_fraction", "Share of its GPU the GPU instance holds (compute slices / the GPU's compute slices)"))}
    used = _gauge("migd_instance_memory_used_bytes", "Memory used in the GPU instance (shared by its CIs)", GI_LABELS)
    total = _gauge("migd_instance_memory_total_bytes", "Memory of the GPU instance", GI_LABELS)
    occupied = _gauge("migd_instance_occupied", "1 if any process runs in the GPU instance: an occupancy proxy "
                      "where no utilization exists (A100), not a utilization", GI_LABELS)
    act = {k: _gauge(f"migd_instance_{k}_ratio", h, GI_LABELS) for k, h in ACTIVITY}
    for g in snap.gpus if snap else ():
        for i in g.instances:
            labels = _gi_labels(g, i)
            info.add_metric(labels + [str(i.placement_start), str(i.placement_size), str(i.activity_source)], 1)
            size["compute_slices"].add_metric(labels, i.compute_slices)
            size["memory_slices"].add_metric(labels, i.memory_slices)
            if g.compute_slices:
                size["gpu_fraction"].add_metric(labels, i.compute_slices / g.compute_slices)
            if i.memory_total_bytes is not None and i.memory_used_bytes is not None:
                used.add_metric(labels, i.memory_used_bytes)
                total.add_metric(labels, i.memory_total_bytes)
            occupied.add_metric(labels, 1 if i.processes else 0)
            for k, _ in ACTIVITY:
                v = getattr(i.activity, k) if i.activity is not None else None
                if v is not None:
                    act[k].add_metric(labels, v)
    yield from (info, *size.values(), used, total, occupied, *act.values())


def compute_instance_families(snap: Snapshot | None) -> Iterator[Metric]:
    """One series per compute instance for what belongs to the CI: its identity and processes."""
    info = _gauge("migd_compute_instance_info", "Compute instance (MIG device) with its profile (value 1)",
                  CI_LABELS + ["profile"])
    procs = _gauge("migd_compute_instance_processes", "Running compute processes in the compute instance",
                   CI_LABELS)
    for g in snap.gpus if snap else ():
        for i in g.instances:
            for c in i.cis:
                labels = [str(g.info.index), g.info.uuid, str(i.gi_id), str(c.ci_id), c.mig_uuid, i.owner]
                info.add_metric(labels + [c.profile], 1)
                procs.add_metric(labels, c.processes)
    yield from (info, procs)


def _gi_labels(g: GpuSample, i: GiSample) -> list[str]:
    return [str(g.info.index), g.info.uuid, str(i.gi_id), i.profile, i.owner]


def snapshot_families(snap: Snapshot | None, hostname: str) -> Iterator[Metric]:
    yield from readable_families(snap)
    yield from gpu_families(snap, hostname)
    yield from instance_families(snap)
    yield from compute_instance_families(snap)
