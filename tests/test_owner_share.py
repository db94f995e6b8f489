"""Who held how much, end to end: migd runs a day/night cycle on a fast clock, a real
Prometheus scrapes it with migd's recording rules, and each owner's share and GPU-hours over the
cycle equal the time-weighted slices it held, computed here from the profiles and the moments the
daemon reported each layout applied (not from migd's metrics)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.daemon_harness import MigdProcess
from tests.prom_server import binary, prometheus, query

pytestmark = pytest.mark.integration  # a real migd, Prometheus

CONFIG = """\
timezone: UTC
profiles_dir: profiles
schedule:
  - {{profile: day, at: "08:00"}}
  - {{profile: night-two, at: "20:00"}}
on_busy: wait
busy_timeout: 30m
reconcile_interval: 1h
sample_interval: 1s
metrics: {{listen: "127.0.0.1:{port}"}}
"""
SCALE = 2880  # 12 simulated hours in 15 real seconds
GPUS = 4  # the "mixed" fleet: 2 x A100-SXM4-40GB, 2 x H100, all with 7 compute slices
# What each profile gives each owner, per GPU, in compute slices (profiles/day.yaml, night-two.yaml).
SLICES = {"day": {"notebooks": 7}, "night-two": {"training": 6}}


def _applied(m: MigdProcess, profile: str, timeout: float) -> float:
    """The real time at which migd reported ``profile`` applied (sd_notify STATUS)."""
    m.wait_for(lambda msg: msg == f"STATUS=profile {profile} applied", timeout=timeout)
    return time.time()


def _average(port: int, expr: str, start: float, end: float) -> dict[str, float]:
    """Each owner's mean over [start, end], sampled every 0.25 s as a dashboard's range query does;
    where the owner holds nothing its series is absent, which counts as 0."""
    steps = int((end - start) / 0.25) + 1
    out = {}
    for r in query(port, expr, start=f"{start:.3f}", end=f"{end:.3f}", step="0.25"):
        out[r["metric"].get("owner", "")] = sum(float(v) for _, v in r["values"]) / steps
    return out


def test_share_per_owner_is_the_time_weighted_slices_held(tmp_path: Path) -> None:
    binary()
    m = MigdProcess(tmp_path, fleet="mixed")
    m.config.write_text(CONFIG.format(port=m.port))
    m.start(now="2026-11-23T19:59:00", time_scale=SCALE)  # day holds; night-two comes 20 ms later
    try:
        m.wait_ready()
        with prometheus(tmp_path, {"migd": m.port}, interval="250ms") as port:
            day = _applied(m, "day", 60)  # seen as it happens: Prometheus was scraping already
            again = _applied(m, "night-two", 60)
            end = again + 5
            time.sleep(end - time.time() + 1.5)  # Prometheus has scraped past the end
            segments = [("day", again - day), ("night-two", end - again)]
            total = end - day
            expected = {owner: sum(SLICES[p].get(owner, 0) * GPUS * s for p, s in segments) / (7 * GPUS) / total
                        for owner in ("notebooks", "training")}
            share = _average(port, "owner:migd_instance_compute_slices:share", day, end)
            assert share.keys() == expected.keys()
            for owner, value in expected.items():
                assert abs(share[owner] - value) < 0.03, (owner, share, expected, segments)
            gpu_hours = {o: v * total / 3600 for o, v in _average(
                port, "owner:migd_instance_gpu_fraction:sum", day, end).items()}
            expected_hours = {o: v * GPUS * total / 3600 for o, v in expected.items()}
            for owner, value in expected_hours.items():
                assert abs(gpu_hours[owner] - value) < 0.03 * GPUS * total / 3600, (gpu_hours, expected_hours)
            (r,) = query(port, f'increase(migd_profile_active_seconds_total{{profile="day"}}[{int(end - day) + 2}s] '
                               f'@ {end:.3f})')
            assert abs(float(r["value"][1]) - (again - day)) < 1.0, (r, again - day)
    finally:
        m.close()
