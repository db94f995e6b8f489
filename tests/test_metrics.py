"""Per-instance metrics: GPM on Hopper, honest absence on A100, series lifecycle, no NVML in scrapes."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from migd.api.daemon import LastApply, Outcome
from migd.apply.executor import Applier
from migd.metrics.collector import MigdCollector
from migd.metrics.sampler import NvmlErrorCounter, Sampler
from migd.profiles.loader import load_profile
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from migd.state.live import Status
from tests.helpers import PROFILES


def _status() -> Status:
    return Status(desired_profile="balanced", applied_profile="balanced", apply_count={Outcome.SUCCESS: 1},
                  last_apply=LastApply(1.0, Outcome.SUCCESS, 0.5, "balanced"))


def samples(registry: CollectorRegistry) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> Any:
    errors = NvmlErrorCounter()
    backend = sim_backend(tmp_path / "s.json", "mixed", on_nvml_error=errors)
    applier = Applier(backend, tmp_path / "state")
    applier.apply(load_profile(PROFILES / "balanced.yaml"))
    store = StateStore(tmp_path / "s.json")
    lock = threading.RLock()
    sampler = Sampler(backend, lock, applier.owners.load, interval_s=60)
    registry = CollectorRegistry()
    collector = MigdCollector(sampler, _status, errors)
    for seconds in (0.4, 1.2):  # as the daemon reports two applies
        collector.observe_apply(None, "success", seconds)
    registry.register(collector)
    yield backend, store, sampler, registry, lock, errors
    backend.close()


def test_gpm_on_hopper_and_honest_absence_on_ampere(fleet: Any) -> None:
    backend, store, sampler, registry, _, _ = fleet
    h100_gi = store.read().gpus[2].gis[0]
    world.start_process(store, 2, h100_gi.id, 0, used_mib=3000)
    sampler.sample_once()
    s = samples(registry)
    info = {(x.labels["gpu"], x.labels["gi"]): x.labels for x in s["migd_instance_info"]}
    assert len(info) == 4 * 4  # four GPUs x balanced (3g + 2g + 2 x 1g)
    assert {v["activity_source"] for k, v in info.items() if k[0] in ("0", "1")} == {"none"}
    assert {v["activity_source"] for k, v in info.items() if k[0] in ("2", "3")} == {"gpm"}
    sm = {(x.labels["gpu"], x.labels["gi"]): x.value for x in s["migd_instance_sm_active_ratio"]}
    assert {k[0] for k in sm} == {"2", "3"}  # no A100 series at all, not zeros
    assert all(0.0 <= v <= 1.0 for v in sm.values())
    assert sm[("2", str(h100_gi.id))] > 0.05  # the loaded instance is busy, the others idle
    assert sum(1 for k, v in sm.items() if v == 0.0) == len(sm) - 1
    used = {(x.labels["gpu"], x.labels["gi"]): x.value for x in s["migd_instance_memory_used_bytes"]}
    assert used[("2", str(h100_gi.id))] == 3000 * 2**20
    owners = {x.labels["owner"] for x in s["migd_instance_info"]}
    assert owners == {"inference", "notebooks"}
    assert s["migd_apply_duration_seconds_count"][0].value == 2
    assert {x.labels["mig_mode_current"] for x in s["migd_gpu_info"]} == {"enabled"}


def test_series_vanish_with_their_instance(fleet: Any) -> None:
    backend, store, sampler, registry, _, _ = fleet
    sampler.sample_once()
    before = {x.labels["mig_uuid"] for x in samples(registry)["migd_compute_instance_info"]}
    gi = backend.list_gpu_instances(3)[0]
    backend.destroy_compute_instance(3, gi.id, gi.compute_instances[0].id)
    backend.destroy_gpu_instance(3, gi.id)
    sampler.sample_once()
    after = {x.labels["mig_uuid"] for x in samples(registry)["migd_compute_instance_info"]}
    assert len(before - after) == 1 and after < before
    left = {(x.labels["gpu"], x.labels["gi"]) for x in samples(registry)["migd_instance_info"]}
    assert ("3", str(gi.id)) not in left
    assert all((x.labels["gpu"], x.labels["gi"]) != ("3", str(gi.id))
               for x in samples(registry).get("migd_instance_sm_active_ratio", []))


def test_scrape_never_calls_nvml_nor_waits_for_an_apply(fleet: Any) -> None:
    backend, store, sampler, registry, lock, errors = fleet
    sampler.sample_once()
    world.set_lost(store, 2)  # any NVML call on GPU 2 would fail now
    held = threading.Event()
    release = threading.Event()

    def apply_in_progress() -> None:
        with lock:
            held.set()
            release.wait(60)  # (bounds a hang only: the scrape below answers while this holds the lock)
    t = threading.Thread(target=apply_in_progress)
    t.start()
    assert held.wait(60)
    s = samples(registry)
    assert t.is_alive()  # the apply still holds the lock: the scrape answered without waiting for it
    assert "migd_instance_info" in s and not errors.snapshot()
    release.set()
    t.join()
    world.set_lost(store, 2, False)


def test_nvml_errors_are_counted(fleet: Any) -> None:
    backend, store, sampler, registry, _, errors = fleet
    world.fail_call(store, "nvmlGpmMigSampleGet", 999)
    sampler.sample_once()
    s = samples(registry)
    errs = {(x.labels["function"], x.labels["error"]): x.value for x in s["migd_nvml_errors_total"]}
    assert errs[("nvmlGpmMigSampleGet", "UNKNOWN")] == 1
    # the GPU whose sample failed has no activity series this cycle (absent, not zero); the other has them
    with_gpm = {x.labels["gpu"] for x in s["migd_instance_sm_active_ratio"]}
    assert len(with_gpm) == 1 and with_gpm < {"2", "3"}
    failed = ({"2", "3"} - with_gpm).pop()
    assert {x.labels["activity_source"] for x in s["migd_instance_info"] if x.labels["gpu"] == failed} == {"none"}
    assert s["migd_sampler_last_success_timestamp_seconds"][0].value > 0


@pytest.mark.integration
def test_http_serves_only_the_page_metrics_and_healthz(tmp_path: Path) -> None:
    from tests.daemon_harness import MigdProcess
    m = MigdProcess(tmp_path)
    try:
        m.start(now="2026-11-23T10:00:00")
        m.wait_ready()
        base = f"http://127.0.0.1:{m.port}"
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            assert r.status == 200 and b"migd_instance_info" in r.read()
        with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
            assert r.status == 200 and r.read() == b"ok\n"
        with urllib.request.urlopen(base + "/", timeout=10) as r:  # the read-only page (tests/test_page.py)
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        for path, method, code in (("/index.html", "GET", 404), ("/apply", "GET", 404), ("/metrics", "POST", 405),
                                   ("/", "POST", 405), ("/healthz", "PUT", 405), ("/metrics", "DELETE", 405)):
            req = urllib.request.Request(base + path, method=method, data=b"x" if method != "GET" else None)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == code, (path, method)
    finally:
        m.close()


class _FlakyBackend:
    """Delegates to the real backend but raises a non-NVML error on the first GPU count (a bug, say)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def gpu_count(self) -> int:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("unexpected")
        return int(self.inner.gpu_count())


def test_sampler_thread_survives_an_unexpected_error(fleet: Any) -> None:
    backend, _, sampler, _, lock, _ = fleet
    flaky = Sampler(_FlakyBackend(backend), lock, sampler.owners, interval_s=0.05)
    flaky.start()
    try:
        deadline = time.monotonic() + 20
        while flaky.cycles == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        flaky.stop()
    assert flaky.failures >= 1 and flaky.cycles >= 1 and flaky.snapshot is not None
