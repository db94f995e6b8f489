"""What the series mean: each value once at the level it belongs to, counters from 0,
one series per label set, stable labels, capacity as values, time per profile."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from migd.apply.executor import Applier
from migd.isolation.audit import Check, Finding, Severity
from migd.isolation.events import EventCounters
from migd.isolation.xids import INSTANCE_XIDS, KNOWN_XIDS, FaultMark
from migd.metrics.collector import MigdCollector
from migd.metrics.sampler import NvmlErrorCounter, Sampler
from migd.profiles.loader import load_profile
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from migd.state.live import ProfileTime, Status
from tests.test_metrics import samples

SPLIT = """\
apiVersion: migd/v1
kind: Profile
name: split
gpus:
  - select: all
    instances:
      - {profile: 3g, compute: [1c, 1c, 1c], owner: research}
      - {profile: 3g, owner: inference}
"""
MiB = 2**20


@pytest.fixture
def node(tmp_path: Path) -> Any:
    """One H100 with a 3g split into three CIs (research) and a whole 3g (inference)."""
    (tmp_path / "split.yaml").write_text(SPLIT)
    backend = sim_backend(tmp_path / "s.json", "single-h100")
    applier = Applier(backend, tmp_path / "state")
    assert applier.apply(load_profile(tmp_path / "split.yaml")).ok
    sampler = Sampler(backend, threading.RLock(), applier.owners.load, interval_s=60, gpm_interval_s=0.0)
    events = EventCounters()
    findings: list[Finding] = []
    status = Status(profile_names=("day", "night", "split"))
    registry = CollectorRegistry()
    registry.register(MigdCollector(sampler, lambda: status, NvmlErrorCounter(), events, lambda: findings))
    yield backend, StateStore(tmp_path / "s.json"), sampler, registry, events, findings, status
    sampler.close()
    backend.close()


def test_a_gpu_instance_split_into_compute_instances_is_counted_once(node: Any) -> None:
    """Memory and GPM activity belong to the GI: summing over instances must not multiply them by
    the number of CIs (it did: every CI series carried the whole GI's memory and activity)."""
    backend, store, sampler, registry, *_ = node
    research = next(g for g in store.read().gpus[0].gis if len(g.cis) == 3)
    world.start_process(store, 0, research.id, research.cis[0].id, used_mib=3000)
    sampler.sample_once()
    s = samples(registry)
    used = [x for x in s["migd_instance_memory_used_bytes"] if x.labels["owner"] == "research"]
    assert [x.value for x in used] == [3000 * MiB]  # one GI, one series, its memory once
    total = sum(x.value for x in s["migd_instance_memory_total_bytes"])
    assert total <= s["migd_gpu_memory_total_bytes"][0].value  # the owners' memory fits the GPU
    active = [x for x in s["migd_instance_sm_active_ratio"] if x.labels["owner"] == "research"]
    assert len(active) == 1 and active[0].value > 0.05
    procs = {x.labels["ci"]: x.value for x in s["migd_compute_instance_processes"] if x.labels["owner"] == "research"}
    assert procs == {str(research.cis[0].id): 1.0, str(research.cis[1].id): 0.0, str(research.cis[2].id): 0.0}
    occupied = {x.labels["owner"]: x.value for x in s["migd_instance_occupied"]}
    assert occupied == {"research": 1.0, "inference": 0.0}


def test_capacity_is_a_value_so_a_share_is_a_sum(node: Any) -> None:
    _, _, sampler, registry, *_ = node
    sampler.sample_once()
    s = samples(registry)
    by_owner: dict[str, float] = {}
    for x in s["migd_instance_compute_slices"]:
        by_owner[x.labels["owner"]] = by_owner.get(x.labels["owner"], 0) + x.value
    assert by_owner == {"research": 3.0, "inference": 3.0}
    assert s["migd_gpu_compute_slices"][0].value == 7 and s["migd_gpu_memory_slices"][0].value == 8
    assert sorted(x.value for x in s["migd_instance_gpu_fraction"]) == [3 / 7, 3 / 7]
    assert sorted(x.value for x in s["migd_instance_memory_slices"]) == [4.0, 4.0]


def test_counters_exist_at_zero_before_their_first_event(node: Any) -> None:
    """Prometheus takes a series' first sample as its start: a counter that appears at 1 shows no
    increase() for its first event.  Every known label set starts at 0."""
    _, store, sampler, registry, *_ = node
    sampler.sample_once()
    s = samples(registry)
    xids = {(x.labels["gpu"], x.labels["xid"]): x.value for x in s["migd_xid_events_total"]}
    assert xids == {("0", str(x)): 0.0 for x in KNOWN_XIDS}
    gis = {str(g.id) for g in store.read().gpus[0].gis}
    inst = {(x.labels["gi"], x.labels["xid"]): x.value for x in s["migd_instance_xid_events_total"]}
    assert inst == {(gi, str(x)): 0.0 for gi in gis for x in INSTANCE_XIDS}
    assert [(x.labels["gpu"], x.value) for x in s["migd_isolation_breaches_total"]] == [("0", 0.0)]
    assert {x.labels["profile"]: x.value for x in s["migd_profile_active_seconds_total"]} == \
        {"day": 0.0, "night": 0.0, "split": 0.0}
    assert {x.value for x in s["migd_applies_total"]} == {0.0}


def test_one_series_per_label_set_and_no_times_or_free_text_in_labels(node: Any) -> None:
    _, store, sampler, registry, events, findings, status = node
    sampler.sample_once()
    uuid = store.read().gpus[0].uuid
    findings += [Finding(0, Check.ORPHAN, Severity.WARNING, "GPU 0: GI 9 (1g.10gb) at 0:1 is not in the profile"),
                 Finding(0, Check.ORPHAN, Severity.WARNING, "GPU 0: GI 10 (1g.10gb) at 1:1 is not in the profile")]
    status.unhealthy.mark(uuid, FaultMark(79, 1795000000.0))
    text = generate_latest(registry).decode()
    s = samples(registry)
    orphans = [x for x in s["migd_audit_findings"] if x.labels["check"] == "orphan"]
    assert [(x.labels, x.value) for x in orphans] == [({"gpu": "0", "check": "orphan", "severity": "warning"}, 2.0)]
    assert len({(x.labels["gpu"], x.labels["check"]) for x in s["migd_audit_findings"]}) == len(Check)  # all at 0
    assert [(x.labels, x.value) for x in s["migd_gpu_unhealthy"]] == [({"gpu": "0", "gpu_uuid": uuid}, 1.0)]
    since = s["migd_gpu_unhealthy_since_timestamp_seconds"]
    assert [(x.labels["xid"], x.value) for x in since] == [("79", 1795000000.0)]
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    keys = [ln.rsplit(" ", 1)[0] for ln in lines]
    assert len(keys) == len(set(keys))  # no series twice
    assert not re.search(r'="\d{4}-\d\d-\d\dT', text)  # no time in any label (a new series per event)


def test_build_info_names_the_node(node: Any) -> None:
    _, _, sampler, _, events, *_ = node
    registry = CollectorRegistry()
    registry.register(MigdCollector(sampler, Status, NvmlErrorCounter(), events, hostname="gpu017"))
    (info,) = samples(registry)["migd_build_info"]
    assert info.labels["hostname"] == "gpu017" and info.labels["version"] and info.labels["nvidia_ml_py"]


def test_time_runs_for_the_applied_profile() -> None:
    t = ProfileTime(since=100.0)
    t.switch("day", now=100.0)
    t.switch("night", now=130.0)
    assert t.totals(now=150.0) == {"day": 30.0, "night": 20.0}
    t.switch(None, now=160.0)  # nothing applied (never happens once one was): the clock stops
    assert t.totals(now=500.0) == {"day": 30.0, "night": 30.0}
