"""Start the metrics side: the /metrics server (aserver.py) over the sampler's snapshots, with the
page at / (page.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from migd.isolation.events import EventCounters
from migd.metrics.aserver import MetricsServer
from migd.metrics.collector import MigdCollector, Part
from migd.metrics.exposition import Exposition
from migd.metrics.page import Page
from migd.metrics.sampler import NvmlErrorCounter, Sampler
from migd.metrics.share import DayShare
from migd.yamlsrc import parse_host_port


@dataclass(frozen=True)
class Sources:
    """What the metrics side reads, each passed as the narrow thing it needs (never the daemon)."""

    status: Callable[[], Any]  # the daemon's Status
    audit: Callable[[], list[Any]] | None = None
    errors: NvmlErrorCounter | None = None
    events: EventCounters | None = None


def start_metrics(listen: str, sources: Sources, sampler: Sampler) -> tuple[MetricsServer, MigdCollector]:
    """Start the HTTP server over ``sampler`` (which has sampled once and whose thread its owner starts);
    the collector's observe_apply takes apply durations."""
    host, port = parse_host_port(listen)  # checked where it was given (config, --metrics-listen)
    interval_s = sampler.interval_s
    collector = MigdCollector(sampler, sources.status, sources.errors or NvmlErrorCounter(), sources.events,
                              sources.audit, hostname=socket.gethostname())
    slow, live = CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)
    slow.register(Part(collector.slow_families))
    live.register(Part(collector.live_families))
    # The process's own CPU, memory, descriptors, Python and GC (prometheus_client's collectors).
    ProcessCollector(registry=live)
    PlatformCollector(registry=live)
    GCCollector(registry=live)
    share = DayShare(lambda: sources.status().timezone)
    sampler.on_snapshot.append(share.observe)
    page = Page(lambda: sampler.snapshot, lambda: sources.status().to_json(), interval_s, share.today)
    server = MetricsServer(host, port, Exposition(slow, collector.version, live), sampler,
                           stale_after_s=max(60.0, 4 * interval_s), page=page.body)
    sampler.on_snapshot.append(server.exposition.refresh)
    threading.Thread(target=server.serve_forever, name="migd-http", daemon=True).start()
    return server, collector
