"""Benchmarks of the running daemon and its sampler (bench/run.py prints them): NVML calls and CPU
per sampling cycle beside a bare pynvml loop, daemon CPU at 1 s sampling, scrape latency under
``ab -c 50`` beside a minimal asyncio server serving the same bytes."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from refs import BARE_EXPORTER, MINIMAL_SERVER, DirectSampler

from migd.metrics.sampler import Sampler
from migd.sim.backend import sim_backend
from migd.sim.library import loaded
from tests.daemon_harness import MigdProcess, free_port
from tests.helpers import PROFILES, Migctl


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _calls() -> Counter[str]:
    lib = loaded()
    return Counter(lib.calls) if lib is not None else Counter()


def _measure(cycle: Any, cycles: int) -> tuple[int, float]:
    """NVML calls of one cycle and CPU ms per cycle over ``cycles`` cycles spaced 0.12 s apart."""
    cycle()
    time.sleep(0.12)
    before = _calls()
    cycle()
    spent = sum((_calls() - before).values())
    cpu = 0.0
    for _ in range(cycles):
        time.sleep(0.12)  # a rolling GPM sample needs the previous one >= 100 ms old: no wait inside
        c0 = time.process_time()
        cycle()
        cpu += time.process_time() - c0
    return spent, 1e3 * cpu / cycles


def bench_sampler(tmp: Path, cycles: int) -> dict[str, float]:
    """migd's sampler and the direct loop, in this process, over 8 H100 x 7 instances (day)."""
    m = Migctl(tmp / "sampler", "dgx-h100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    backend = sim_backend(m.state, "dgx-h100")
    sampler = Sampler(backend, threading.RLock(), lambda: {}, gpm_interval_s=0.1)
    direct = DirectSampler()
    try:
        calls, cpu = _measure(sampler.sample_once, cycles)
        ref_calls, ref_cpu = _measure(direct.cycle, cycles)
    finally:
        direct.close()
        sampler.close()
        backend.close()
    return {"calls": calls, "ref_calls": ref_calls, "cpu_ms": cpu, "ref_cpu_ms": ref_cpu}


def _cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")) / 1024


def started_daemon(tmp: Path, sample_interval: str) -> MigdProcess:
    """migd on 8 H100s with the day layout (7 instances each) applied and sampled."""
    tmp.mkdir(parents=True, exist_ok=True)
    m = MigdProcess(tmp, fleet="dgx-h100")
    m.write_config(reconcile_interval="1h", sample_interval=sample_interval)
    m.start(now="2026-11-23T10:00:00")  # Monday 10:00: day
    m.wait_ready(60)
    url = f"http://127.0.0.1:{m.port}/metrics"
    m.wait_until(lambda: urllib.request.urlopen(url, timeout=30).read().count(b"\nmigd_instance_info{") == 56, 90)
    return m


def bench_daemon_cpu(tmp: Path, window_s: float) -> dict[str, float]:
    """The daemon's CPU at 1 s sampling, nobody scraping (its own process, /proc), beside the bare exporter
    (refs.BARE_EXPORTER) over the same node in the same window."""
    m = started_daemon(tmp / "cpu", "1s")
    ref: subprocess.Popen[str] | None = None
    ref_pid = 0
    try:
        ref = subprocess.Popen([sys.executable, "-m", "migd.sim.cli", "exec", "--sim-state", str(m.migctl.state),
                                "--", sys.executable, "-c", BARE_EXPORTER, str(Path(__file__).resolve().parent)],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
        ref_pid = _ready(ref, 60)
        pid = m.proc.pid  # type: ignore[union-attr]
        time.sleep(2)
        c0, r_c0, t0, r0 = _cpu_s(pid), _cpu_s(ref_pid), time.monotonic(), rss_mib(pid)
        time.sleep(window_s)
        dt = time.monotonic() - t0
        return {"cpu_pct": 100 * (_cpu_s(pid) - c0) / dt, "ref_cpu_pct": 100 * (_cpu_s(ref_pid) - r_c0) / dt,
                "rss_mib": r0, "rss_growth_mib": rss_mib(pid) - r0}
    finally:
        if ref is not None:
            _end(ref, ref_pid)
        m.close()


def _ready(ref: subprocess.Popen[str], timeout_s: float) -> int:
    """The bare exporter's pid, from its ``ready PID`` line (within ``timeout_s``)."""
    assert ref.stdout is not None
    if not select.select([ref.stdout], [], [], timeout_s)[0]:
        raise RuntimeError(f"the bare exporter said nothing in {timeout_s:g} s")
    line = ref.stdout.readline()
    if not line.startswith("ready "):
        raise RuntimeError(f"the bare exporter did not start: {line!r}")
    return int(line.split()[1])


def _end(ref: subprocess.Popen[str], ref_pid: int) -> None:
    """The exporter killed, so that ``migd-sim exec`` returns and removes its directory; the group if not."""
    with contextlib.suppress(OSError):
        if ref_pid:
            os.kill(ref_pid, signal.SIGKILL)
    try:
        ref.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(ref.pid, signal.SIGKILL)
        ref.wait()
    if ref.stdout is not None:
        ref.stdout.close()

def _ab(url: str, n: int) -> float:
    """p99 latency in ms of ``ab -n N -c 50`` (a new connection per request, as a scraper without keep-alive does), from
    ab's CSV percentiles (its summary table rounds to whole milliseconds)."""
    with tempfile.NamedTemporaryFile(suffix=".csv") as csv:
        out = subprocess.run(["ab", "-q", "-n", str(n), "-c", "50", "-e", csv.name, url], capture_output=True,
                             text=True, timeout=300).stdout
        errors = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: \d+, Exceptions: (\d+)\)", out)
        if errors and any(int(x) for x in errors.groups()):  # Length: the exposition changes between cycles
            raise RuntimeError(f"ab saw failed requests: {errors.group(0)}")
        rows = dict(line.split(",") for line in Path(csv.name).read_text().splitlines()[1:])
    return float(rows["99"])


def _python_client(url: str, n: int) -> float:
    """p99 in ms with 50 threads of urllib, where ab is not installed."""
    lat: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(max(1, n // 50)):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as r:
                r.read()
            with lock:
                lat.append(time.perf_counter() - t0)
    threads = [threading.Thread(target=client) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1e3 * pct(lat, 0.99)


def _keep_loading(url: str, stop: threading.Event, clients: int = 4) -> list[threading.Thread]:
    """``clients`` threads loading ``url`` back to back until ``stop`` (the page's readers)."""
    def client() -> None:
        while not stop.is_set():
            with urllib.request.urlopen(url, timeout=30) as r:
                r.read()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    return threads


def bench_scrape(tmp: Path, requests: int, rounds: int, sample_interval: str) -> dict[str, Any]:
    """p99 of migd's /metrics and of the minimal server with the same bytes, rounds interleaved;
    the median round of each (the first of each is a warm-up).  Beside them, in the same rounds: the
    page at / under the same load, and /metrics while four clients keep loading the page, against
    /metrics while four clients keep loading /metrics (the same load, without the page)."""
    m = started_daemon(tmp / f"scrape-{sample_interval}", sample_interval)
    ref = None
    try:
        url = f"http://127.0.0.1:{m.port}/metrics"
        body = urllib.request.urlopen(url, timeout=30).read()
        (tmp / "body").write_bytes(body)
        port = free_port()
        ref = subprocess.Popen([sys.executable, "-c", MINIMAL_SERVER, str(port), str(tmp / "body")],
                               stdout=subprocess.PIPE, text=True)
        assert ref.stdout is not None and ref.stdout.readline().strip() == "ready"
        measure = _ab if shutil.which("ab") else _python_client
        page_url = f"http://127.0.0.1:{m.port}/"
        page_bytes = len(urllib.request.urlopen(page_url, timeout=30).read())
        ours, theirs, page, busy, busy_ref = [], [], [], [], []
        for _ in range(rounds + 1):
            ours.append(measure(url, requests))
            theirs.append(measure(f"http://127.0.0.1:{port}/metrics", requests))
            page.append(measure(page_url, requests))
            for loaded, into in ((page_url, busy), (url, busy_ref)):  # the page's readers, or as many scrapers
                stop = threading.Event()
                readers = _keep_loading(loaded, stop)
                into.append(measure(url, requests))
                stop.set()
                for t in readers:
                    t.join()
        return {"p99_ms": statistics.median(ours[1:]), "ref_p99_ms": statistics.median(theirs[1:]),
                "page_p99_ms": statistics.median(page[1:]), "busy_p99_ms": statistics.median(busy[1:]),
                "busy_ref_p99_ms": statistics.median(busy_ref[1:]),
                "bytes": len(body), "page_bytes": page_bytes, "client": "ab" if measure is _ab else "python threads"}
    finally:
        if ref is not None:
            ref.kill()
            ref.wait()
        m.close()
