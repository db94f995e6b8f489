"""The daemon's own series: profiles and the time spent in each, transitions, applies, the sampler,
Slurm mode, and what the node runs (``migd_build_info``)."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from migd import __version__
from migd.api.access import AccessView
from migd.api.daemon import Outcome, Progress
from migd.api.demand import DemandView, Source
from migd.api.slurm import Phase, SlurmSnapshot
from migd.numeral import order
from migd.state.live import Status


def build_info(hostname: str) -> Metric:
    try:
        nvml = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        nvml = ""
    g = GaugeMetricFamily("migd_build_info", "migd's version, its Python and nvidia-ml-py, and the node's hostname "
                          "(value 1; join on instance for the hostname)",
                          labels=["version", "python_version", "nvidia_ml_py", "hostname"])
    g.add_metric([__version__, platform.python_version(), nvml, hostname], 1)
    return g


def profile_families(st: Status) -> Iterator[Metric]:
    g = GaugeMetricFamily("migd_profile_desired_info", "Profile the schedule (or an override) wants now",
                          labels=["profile"])
    if st.desired_profile:
        g.add_metric([st.desired_profile], 1)
    yield g
    g = GaugeMetricFamily("migd_profile_applied_info", "Profile last found fully applied", labels=["profile"])
    if st.applied_profile:
        g.add_metric([st.applied_profile], 1)
    yield g
    c = CounterMetricFamily("migd_profile_active_seconds", "Seconds each profile has been the applied one (the "
                            "day/night split of the node's time)", labels=["profile"])
    seconds = dict.fromkeys(st.profile_names, 0.0) | st.profile_time.totals()
    for name, s in sorted(seconds.items()):
        c.add_metric([name], s)
    yield c


def transition_families(st: Status) -> Iterator[Metric]:
    yield GaugeMetricFamily("migd_drift_gpus", "GPUs whose layout differs from the desired profile",
                            value=len(st.drifted))
    manual = st.applying  # (a manual apply through migd waits for busy instances as a transition does)
    yield GaugeMetricFamily("migd_transition_blocked", "1 while a transition or a manual apply waits for busy "
                            "instances", value=1 if st.blocked_since or manual else 0)
    g = GaugeMetricFamily("migd_gpu_blocked_since_timestamp_seconds",
                          "Since when a GPU's change waits for busy instances (the other GPUs went ahead)",
                          labels=["gpu"])
    since = {str(i): b.since for i, b in st.with_progress(Progress.WAITING).items()}
    since.update({i: manual.since for i in manual.waiting if i not in since} if manual else {})
    for i, t in sorted(since.items(), key=lambda kv: order(kv[0])):
        g.add_metric([i], t)
    yield g
    yield GaugeMetricFamily("migd_busy_timeout_seconds", "How long a transition waits for busy instances before "
                            "on_busy decides (config busy_timeout)", value=st.busy_timeout_s)
    yield from retry_families(st)


def retry_families(st: Status) -> Iterator[Metric]:
    """A GPU whose change failed waits out a backoff before its next try (docs/daemon.md)."""
    g = GaugeMetricFamily("migd_gpu_apply_failures", "Attempts in a row that the GPU's change to the active profile "
                          "failed (rolled back, failed or refused); 0 once it succeeds", labels=["gpu"])
    for i, gp in sorted(st.gpus.items()):
        g.add_metric([str(i)], gp.failures if gp.progress is Progress.FAILED else 0)
    yield g
    g = GaugeMetricFamily("migd_gpu_apply_retry_timestamp_seconds", "When a GPU whose change failed is tried again "
                          "(Unix time; only while it waits out its backoff)", labels=["gpu"])
    for i, gp in sorted(st.gpus.items()):
        if gp.progress is Progress.FAILED and gp.next_try is not None:
            g.add_metric([str(i)], gp.next_try)
    yield g


def apply_families(st: Status, histogram: Any, errors: dict[tuple[str, str], int]) -> Iterator[Metric]:
    c = CounterMetricFamily("migd_applies", "Apply attempts by result", labels=["result"])
    for result in Outcome:
        c.add_metric([result.value], st.apply_count.get(result, 0))
    yield c
    last = st.last_apply
    yield GaugeMetricFamily("migd_last_apply_timestamp_seconds", "Unix time of the last apply attempt",
                            value=last.time if last else 0)
    yield GaugeMetricFamily("migd_last_apply_success", "1 unless the last apply attempt failed (failed, rolled_back, "
                            "error); blocked by busy instances or cancelled is not a failure",
                            value=1 if last and not last.result.failed else 0)
    cum, total = histogram.cumulative()
    yield HistogramMetricFamily("migd_apply_duration_seconds", "Duration of apply attempts", buckets=cum,
                                sum_value=total)
    c = CounterMetricFamily("migd_nvml_errors", "NVML calls that failed", labels=["function", "error"])
    for (fn, err), n in sorted(errors.items()):
        c.add_metric([fn, err], n)
    yield c


def sampler_families(sampler: Any) -> Iterator[Metric]:
    yield GaugeMetricFamily("migd_sampler_last_success_timestamp_seconds", "Unix time of the last NVML sample",
                            value=sampler.last_success or 0)
    snap = sampler.snapshot
    yield GaugeMetricFamily("migd_sampler_duration_seconds", "Wall time of the last sampling cycle",
                            value=snap.duration_s if snap else 0)
    yield GaugeMetricFamily("migd_sampler_cpu_seconds", "Process CPU time during the last sampling cycle",
                            value=sampler.cpu_seconds_last)
    yield GaugeMetricFamily("migd_sampler_interval_seconds", "How often the sampler reads NVML (config "
                            "sample_interval)", value=sampler.interval_s)
    yield CounterMetricFamily("migd_sampler_cycles", "Completed NVML sampling cycles", value=sampler.cycles)


def slurm_families(snap: SlurmSnapshot) -> Iterator[Metric]:
    """Slurm mode: where the node's switch stands (every phase listed, so series never vanish)."""
    node, st = snap.node, snap.state
    g = GaugeMetricFamily("migd_slurm_phase", "1 for the Slurm switch phase the node is in", labels=["node", "phase"])
    for phase in Phase:
        g.add_metric([node, phase.value], 1 if st.phase is phase else 0)
    yield g
    g = GaugeMetricFamily("migd_slurm_jobs_waiting", "Jobs holding GPUs that the drained node waits for",
                          labels=["node"])
    g.add_metric([node], float(st.jobs_waiting))
    yield g
    g = GaugeMetricFamily("migd_slurm_gres_in_sync", "1 if Slurm registered the node with the GRES of its layout "
                          "(after migd's last switch)", labels=["node"])
    if st.gres_in_sync is not None:
        g.add_metric([node], 1 if st.gres_in_sync else 0)
    yield g
    g = GaugeMetricFamily("migd_slurm_reserved", "1 while a MAINT reservation holds the node for the next transition",
                          labels=["node"])
    g.add_metric([node], 1 if st.reservation else 0)
    yield g


def demand_families(view: DemandView) -> Iterator[Metric]:
    """The demand mode (docs/demand.md): what the node follows; on the planner, its last decision."""
    g = GaugeMetricFamily("migd_demand_following", "1 for what decides this node's layout: the planner's want, "
                          "the schedule, or held (Slurm unreadable)", labels=["source"])
    for source in Source:
        g.add_metric([source.value], 1 if view.source is source else 0)
    yield g
    plan = view.plan
    if plan is None:
        return
    g = GaugeMetricFamily("migd_demand_wanted_slice_hours", "Work wanted within the horizon per MIG type, fair-"
                          "weighted, at the planner's last decision", labels=["mig_type"])
    for mig_type, hours in plan.wanted_slice_h.items():
        g.add_metric([mig_type], hours)
    yield g
    g = GaugeMetricFamily("migd_demand_decision_changes", "Layout changes the planner's last decision made (or, "
                          "in dry-run, would make)", labels=["mode"])
    g.add_metric([plan.mode], float(len(plan.changes)))
    yield g
    g = GaugeMetricFamily("migd_demand_decision_held", "Paying changes the last decision held back (hysteresis, "
                          "maintenance limit)")
    g.add_metric([], float(len(plan.held)))
    yield g
    g = GaugeMetricFamily("migd_demand_decision_timestamp_seconds", "When the planner last decided")
    g.add_metric([], plan.at)
    yield g
    g = GaugeMetricFamily("migd_demand_slurm_unreadable", "1 if the planner's last read of Slurm failed (no decision)")
    g.add_metric([], 1 if plan.error else 0)
    yield g
    g = GaugeMetricFamily("migd_demand_run_time_share", "Per account with 10 or more ended jobs, the share of its "
                          "time limit the planner expects a job to run (nine in ten stayed within it)",
                          labels=["account"])
    for account, share in sorted((plan.run_share or {}).items()):
        g.add_metric([account], share)
    yield g
    g = GaugeMetricFamily("migd_demand_unoffered_jobs", "Pending jobs per GPU type no candidate layout offers (no "
                          "change serves them), at the planner's last decision", labels=["gpu_type"])
    for gpu_type, jobs in sorted((plan.unoffered or {}).items()):
        g.add_metric([gpu_type], float(jobs))
    yield g
    yield GaugeMetricFamily("migd_demand_untyped_requests", "Pending requests for GPUs without a MIG type (no layout "
                            "is chosen for them), at the planner's last decision", value=float(plan.untyped))
    yield SummaryMetricFamily("migd_demand_time_to_capacity_seconds", "From the oldest pending job a layout change "
                              "was made for to the node serving the new layout", count_value=plan.capacity_count,
                              sum_value=plan.capacity_sum_s)


def access_families(view: AccessView) -> Iterator[Metric]:
    """Access by owner: what is not as the policy says is a page (a node someone swapped, a group
    deleted), seen at the apply or pass that found it."""
    yield GaugeMetricFamily("migd_access_errors", "Capability nodes (or whole GPUs) access by owner could not set, and "
                            "owners whose group or user no longer exists, as of the last apply or pass",
                            value=len(view.errors))
    g = GaugeMetricFamily("migd_access_owner_unresolved", "1 for each owner whose configured group or user no longer "
                          "exists (its instances are closed to all but root)", labels=["owner"])
    for owner in view.unresolved:
        g.add_metric([owner], 1)
    yield g
    yield CounterMetricFamily("migd_access_node_changes", "Capability nodes access by owner has set since start",
                              value=view.changed)
