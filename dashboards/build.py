#!/usr/bin/env python3
"""Writes dashboards/migd.json, the Grafana dashboard, from the panel list below.

    python3 dashboards/build.py          # rewrite migd.json
    python3 dashboards/build.py --check  # exit 1 if migd.json is not what this writes

Every expression is run against a real Prometheus by tests/test_prometheus.py, and the JSON is
type-checked against Grafana's published dashboard schema (@grafana/schema) by
tests/test_dashboard_schema.py.  Recording rules named here live in prometheus/migd.rules.yml.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("migd.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
NODE = 'instance=~"$node"'
SEL = f'{NODE}, gpu=~"$gpu", owner=~"$owner"'


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries | table | stat | state-timeline | bargauge
    targets: tuple[tuple[str, str], ...]  # (expr, legend)
    unit: str = ""
    description: str = ""
    width: int = 12
    stacked: bool = False
    options: dict[str, Any] = field(default_factory=dict)


ROWS: list[tuple[str, list[Panel]]] = [
    ("Instances", [
        Panel("SM activity per GPU instance (GPM, Hopper+)", "timeseries",
              ((f"migd_instance_sm_active_ratio{{{SEL}}}", "{{gpu}}/{{gi}} {{profile}} {{owner}}"),), "percentunit",
              "Absent on A100: NVML has no per-instance utilization under MIG there (see the activity source "
              "table)."),
        Panel("Tensor activity per GPU instance (GPM)", "timeseries",
              ((f"migd_instance_tensor_active_ratio{{{SEL}}}", "{{gpu}}/{{gi}} {{profile}} {{owner}}"),),
              "percentunit"),
        Panel("DRAM bandwidth per GPU instance (GPM)", "timeseries",
              ((f"migd_instance_dram_active_ratio{{{SEL}}}", "{{gpu}}/{{gi}} {{profile}} {{owner}}"),), "percentunit"),
        Panel("Memory used per GPU instance", "timeseries",
              ((f"migd_instance_memory_used_bytes{{{SEL}}}", "{{gpu}}/{{gi}} {{profile}} {{owner}}"),), "bytes"),
        Panel("Memory used / total per GPU instance", "timeseries",
              ((f"migd_instance_memory_used_bytes{{{SEL}}} / migd_instance_memory_total_bytes{{{SEL}}}",
                "{{gpu}}/{{gi}} {{profile}} {{owner}}"),), "percentunit"),
        Panel("Running processes per compute instance", "timeseries",
              ((f"migd_compute_instance_processes{{{SEL}}}", "{{gpu}}/{{gi}}.{{ci}} {{owner}}"),)),
        Panel("GPU instances and activity source", "table", ((f"migd_instance_info{{{SEL}}}", ""),), width=24),
    ]),
    ("Who holds the GPUs", [
        Panel("Fleet share by owner", "timeseries", (('owner:migd_instance_compute_slices:share{owner=~"$owner"}',
                                                      "{{owner}}"),), "percentunit",
              "Each owner's part of the fleet's MIG compute slices (recording rule, all nodes).", stacked=True),
        Panel("GPUs held by owner", "timeseries",
              (('owner:migd_instance_gpu_fraction:sum{owner=~"$owner"}', "{{owner}}"),), "short",
              "A 1g on a 7-slice GPU holds 1/7 of a GPU.", stacked=True),
        Panel("GPU-hours per owner, last 7 days", "bargauge",
              (('sum_over_time(owner:migd_instance_gpu_fraction:sum{owner=~"$owner"}[7d:5s]) * 5 / 3600',
                "{{owner}}"),), "h"),
        Panel("Busy GPUs by owner (GPM, Hopper+) and occupied GPUs (any model)", "timeseries",
              (('owner:migd_instance_busy_gpus:sum{owner=~"$owner"}', "busy {{owner}}"),
               ('owner:migd_instance_occupied_gpus:sum{owner=~"$owner"}', "occupied {{owner}}")), "short",
              "Busy: SM activity weighted by instance size. Occupied: instances running a process, by size; "
              "on A100 the only signal, and not a utilization."),
        Panel("pods on MIG instances (dcgm-exporter join)", "table", (("migd_instance:pod:info", ""),),
              description="dcgm-exporter's namespace/pod/container on migd's owner and MIG profile.", width=24),
    ]),
    ("Day and night", [
        Panel("Active profile over time (day/night)", "state-timeline",
              ((f"migd_profile_desired_info{{{NODE}}}", "desired {{profile}}"),
               (f"migd_profile_applied_info{{{NODE}}}", "applied {{profile}}"))),
        Panel("Time per profile, last 7 days", "bargauge",
              ((f"increase(migd_profile_active_seconds_total{{{NODE}}}[7d]) / 3600", "{{instance}} {{profile}}"),),
              "h"),
        Panel("Busy share of the held GPUs by profile (GPM, Hopper+)", "timeseries",
              (("profile:migd_instance_busy_gpus:ratio", "{{profile}}"),), "percentunit",
              "Did the night layout get used: the held GPUs' SM activity while each profile was applied."),
        Panel("Occupied share of the held GPUs by profile", "timeseries",
              (("profile:migd_instance_occupied_gpus:ratio", "{{profile}}"),), "percentunit"),
        Panel("GPU instances idle for the last 8 hours", "table",
              ((f"max_over_time(migd_instance_occupied{{{SEL}}}[8h]) == 0", ""),), width=24),
    ]),
    ("Operations", [
        Panel("GPUs drifted from the profile", "timeseries",
              ((f"migd_drift_gpus{{{NODE}}}", "drifted {{instance}}"),
               (f"migd_transition_blocked{{{NODE}}}", "blocked {{instance}}"))),
        Panel("Apply attempts by result", "timeseries",
              ((f"increase(migd_applies_total{{{NODE}}}[1h])", "{{instance}} {{result}}"),)),
        Panel("Apply duration p95", "timeseries",
              ((f"histogram_quantile(0.95, sum by (le) (rate(migd_apply_duration_seconds_bucket{{{NODE}}}[1h])))",
                "p95"), (f"time() - migd_last_apply_timestamp_seconds{{{NODE}}}", "since last apply {{instance}}")),
              "s"),
        Panel("Last apply did not fail", "stat", ((f"migd_last_apply_success{{{NODE}}}", "{{instance}}"),)),
        Panel("NVML errors", "timeseries",
              ((f"increase(migd_nvml_errors_total{{{NODE}}}[1h])", "{{function}} {{error}}"),)),
        Panel("Xid errors by GPU", "timeseries",
              ((f'increase(migd_xid_events_total{{{NODE}, gpu=~"$gpu"}}[1h])', "GPU {{gpu}} Xid {{xid}}"),)),
        Panel("GPUs blocked by a GPU-wide fault", "table", ((f"migd_gpu_unhealthy{{{NODE}}} == 1", ""),)),
        Panel("GPUs NVML cannot read (lost)", "table", ((f"migd_gpu_lost{{{NODE}}} == 1", ""),),
              description="Fallen off the bus (Xid 79) or otherwise lost: NVML_ERROR_GPU_IS_LOST. migd leaves "
              "the GPU alone; its other series are absent until it is back."),
        Panel("Sampler age", "timeseries",
              ((f"time() - migd_sampler_last_success_timestamp_seconds{{{NODE}}}", "age {{instance}}"),
               (f"migd_sampler_duration_seconds{{{NODE}}}", "duration {{instance}}")), "s"),
    ]),
    ("Alerts", [
        Panel("migd alerts pending and firing", "table", (('ALERTS{alertname=~"Migd.*"}', ""),), width=24),
    ]),
]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS, "query": {"query": query, "refId": name},
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2}


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    custom = {"stacking": {"mode": "normal", "group": "A"}} if p.stacked else {}
    out: dict[str, Any] = {
        "id": pid, "type": p.kind, "title": p.title, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": p.width, "h": 8},
        "targets": [{"refId": chr(ord("A") + i), "expr": e, "legendFormat": legend, "datasource": DS}
                    for i, (e, legend) in enumerate(p.targets)],
        "fieldConfig": {"defaults": {**({"unit": p.unit} if p.unit else {}), **({"custom": custom} if custom else {})},
                        "overrides": []},
        "options": dict(p.options)}
    if p.description:
        out["description"] = p.description
    return out


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for row, items in ROWS:
        panels.append({"id": pid, "type": "row", "title": row, "collapsed": False, "panels": [],
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})
        pid, y, x = pid + 1, y + 1, 0
        for p in items:
            if x + p.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(p, pid, x, y))
            pid, x = pid + 1, x + p.width
        y += 8
    return {
        "title": "migd: MIG partitions, owners and day/night use", "uid": "migd", "schemaVersion": 39, "version": 2,
        "editable": True, "time": {"from": "now-24h", "to": "now"}, "refresh": "30s", "tags": ["migd", "mig", "gpu"],
        "templating": {"list": [{"name": "datasource", "label": "Data source", "type": "datasource",
                                 "query": "prometheus"},
                                _variable("node", "Node", "label_values(migd_gpu_up, instance)"),
                                _variable("gpu", "GPU", 'label_values(migd_gpu_up{instance=~"$node"}, gpu)'),
                                _variable("owner", "Owner",
                                          'label_values(migd_instance_info{instance=~"$node"}, owner)')]},
        "panels": panels, "annotations": {"list": []}}


def render() -> str:
    return json.dumps(dashboard(), indent=1) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if OUT.read_text() == render() else 1)
    OUT.write_text(render())
