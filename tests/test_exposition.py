"""/metrics is rendered as often as it changes: the snapshot part once per snapshot,
ahead of the scrape while scrapes keep coming; the daemon's live part again when 100 ms old, in a
thread under load, and at once for a lone scrape after a pause."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from migd.metrics.exposition import Exposition


class Counting(Collector):
    def __init__(self, name: str) -> None:
        self.name = name
        self.renders = 0
        self.value = 0.0
        self.threads: list[str] = []  # the thread of each rendering

    def collect(self) -> Iterator[Metric]:
        self.renders += 1
        self.threads.append(threading.current_thread().name)
        yield GaugeMetricFamily(self.name, "test", value=self.value)


class Sampler:
    snapshot: object = None


def _exposition(version: Callable[[Sampler], tuple[Any, ...]] = lambda s: (s.snapshot,)) -> \
        tuple[Exposition, Counting, Counting, Sampler]:
    snap, live = Counting("snap"), Counting("live")
    r1, r2 = CollectorRegistry(), CollectorRegistry()
    r1.register(snap)
    r2.register(live)
    sampler = Sampler()
    sampler.snapshot = object()
    return Exposition(r1, lambda: version(sampler), r2), snap, live, sampler


def test_the_snapshot_part_is_rendered_once_per_snapshot_and_ahead_while_scraped() -> None:
    exp, snap, _, sampler = _exposition()
    body = exp.render()
    assert b"snap 0.0" in body and b"live 0.0" in body and snap.renders == 1
    exp.render()
    assert snap.renders == 1  # the same snapshot: the same bytes
    sampler.snapshot = object()
    exp.refresh(sampler.snapshot)  # the last rendering was scraped: render the new one now, off the loop
    assert snap.renders == 2
    exp.render()
    assert snap.renders == 2  # the scrape only sent bytes
    sampler.snapshot = object()
    exp.refresh(sampler.snapshot)  # that rendering was scraped too: the next one is rendered ahead
    assert snap.renders == 3
    sampler.snapshot = object()
    exp.refresh(sampler.snapshot)  # nobody scraped the last one: no rendering ahead
    assert snap.renders == 3
    exp.render()
    assert snap.renders == 4  # a lone scrape renders it itself


@pytest.mark.integration
def test_the_live_part_follows_under_load_and_is_fresh_after_a_pause() -> None:
    exp, _, live, _ = _exposition()
    # The defaults (1 s, 3 s) scaled down; stale only after a minute at first, so that on a loaded machine
    # a slow thread is waited for, not overtaken by a scrape rendering it itself.
    exp.live_max_age_s, exp.live_stale_s = 0.1, 60.0
    assert b"live 0.0" in exp.render()
    live.value = 7  # a counter the fault watch raised shows without a new snapshot ...
    time.sleep(exp.live_max_age_s + 0.05)
    while b"live 7.0" not in exp.render():  # ... rendered in a thread while scrapes keep coming
        time.sleep(0.01)
    assert live.threads[:2] == [threading.current_thread().name, "migd-render"], live.threads
    exp.live_stale_s = 1.0
    live.value = 9
    time.sleep(exp.live_stale_s + 0.05)
    assert b"live 9.0" in exp.render()  # a lone scrape after a quiet spell gets it at once


def test_an_event_renders_the_slow_part_anew_without_a_new_snapshot() -> None:
    """The fault counters live in the slow part: their version (an Xid counted) is part of its key."""
    events = [0]
    exp, snap, _, _ = _exposition(lambda _: ("snapshot", events[0]))
    exp.render()
    exp.render()
    assert snap.renders == 1
    events[0] += 1
    snap.value = 1
    assert b"snap 1.0" in exp.render() and snap.renders == 2
