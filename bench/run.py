#!/usr/bin/env python3
"""migd benchmarks on the simulator; prints one table.  ``--short`` is what CI runs.

    python3 bench/run.py            # full
    python3 bench/run.py --short    # fewer repetitions (CI)

Figures: plan time for all 127 feasible layouts; apply time of day->night on 8 GPUs,
parallel vs sequential (the simulated driver takes --driver-ms per mutating call, outside
its lock, as a real driver does); create/destroy operations of migd's plans vs
destroy-all-and-recreate; scrape latency under 50 concurrent scrapers (8 GPUs x 7
instances); daemon RSS and CPU per sampling cycle.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from migd.apply.executor import Applier  # noqa: E402
from migd.apply.result import ApplyOptions  # noqa: E402
from migd.hardware.catalog import MODELS  # noqa: E402
from migd.planner import plan_gpu  # noqa: E402
from migd.profiles.loader import load_profile  # noqa: E402
from migd.profiles.resolve import DesiredInstance, DesiredLayout  # noqa: E402
from migd.profiles.validate import fake_gpu  # noqa: E402
from migd.sim import control, sim_backend  # noqa: E402
from migd.sim.state import StateStore  # noqa: E402

PROFILES = ROOT / "profiles"
ROLES = ("1g", "1g+me", "1g.2m", "2g", "3g", "4g", "7g")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def feasible_multisets() -> list[Counter[str]]:
    """All 127 feasible multisets of a 7-slice board, by brute force over placements."""
    import itertools
    m = MODELS["A100-SXM4-80GB"]
    opts = [(p.role, pl) for p in m.profiles if p.role in ROLES for pl in p.placements]
    out: set[tuple[tuple[str, int], ...]] = set()
    for n in range(1, 8):
        for combo in itertools.combinations(opts, n):
            pls = [pl for _, pl in combo]
            if any(a.overlaps(b) for a, b in itertools.combinations(pls, 2)):
                continue
            c = Counter(r for r, _ in combo)
            if all(c[r] <= m.profile_by_role(r).instance_count for r in c):  # type: ignore[union-attr]
                out.add(tuple(sorted(c.items())))
    return [Counter(dict(x)) for x in sorted(out)]


def bench_plan(reps: int) -> dict[str, float]:
    m = MODELS["A100-SXM4-80GB"]
    layouts = feasible_multisets()
    assert len(layouts) == 127
    gpu = fake_gpu(m)
    times = []
    for _ in range(reps):
        for ms in layouts:
            want = tuple(DesiredInstance(gi=m.profile_by_role(r), cis=(m.profile_by_role(r).default_ci,))  # type: ignore
                         for r, n in ms.items() for _ in range(n))
            t0 = time.perf_counter()
            plan_gpu(gpu, DesiredLayout(True, want), [])
            times.append(time.perf_counter() - t0)
    return {"layouts": len(layouts), "p50_ms": 1e3 * pct(times, 0.5), "p99_ms": 1e3 * pct(times, 0.99),
            "max_ms": 1e3 * max(times), "total_ms": 1e3 * sum(times) / reps}


def bench_apply(driver_ms: float, tmp: Path) -> dict[str, float]:
    out = {}
    for mode in ("parallel", "sequential"):
        state = tmp / f"apply-{mode}.json"
        b = sim_backend(state, "dgx-a100")
        a = Applier(b, tmp / f"apply-{mode}.d")
        a.apply(load_profile(PROFILES / "day.yaml"))
        control.set_mutation_delay(StateStore(state), driver_ms / 1000)
        t0 = time.perf_counter()
        r = a.apply(load_profile(PROFILES / "night.yaml"), ApplyOptions(parallel=mode == "parallel"))
        out[mode] = time.perf_counter() - t0
        assert r.ok
        b.close()
    out["ratio"] = out["sequential"] / out["parallel"]
    return out


def naive_ops(old: list[tuple[int, int]], new_gis: int, new_cis: int) -> int:
    """Destroy every CI and GI, then create everything."""
    return sum(1 + cis for _, cis in old) + new_gis + new_cis


def bench_ops(tmp: Path) -> list[tuple[str, int, int]]:
    rows = []
    for old, new in [("day", "balanced"), ("balanced", "day"), ("night-two", "balanced"), ("balanced", "night-two"),
                     ("day", "night"), ("night", "night-two")]:
        state = tmp / f"ops-{old}-{new}.json"
        b = sim_backend(state, "single-a100")
        a = Applier(b, tmp / f"ops-{old}-{new}.d")
        a.apply(load_profile(PROFILES / f"{old}.yaml"))
        current = b.list_gpu_instances(0)
        (plan,) = a.plan(load_profile(PROFILES / f"{new}.yaml"))
        ours = sum(1 for o in plan.ops if o.kind in ("create_gi", "create_ci", "destroy_gi", "destroy_ci"))
        naive = naive_ops([(g.id, len(g.compute_instances)) for g in current], len(plan.targets),
                          sum(len(t.ci) for t in plan.targets))
        rows.append((f"{old}->{new}", ours, naive))
        b.close()
    return rows


def scrape_latencies(url: str, scrapes: int) -> list[float]:
    """50 concurrent clients, each scraping in turn (a new connection per scrape, like ab -c 50)."""
    lat: list[float] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as r:
                r.read()
            with lock:
                lat.append(time.perf_counter() - t0)
    threads = [threading.Thread(target=client, args=(max(1, scrapes // 50),)) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat


# The reference: a minimal asyncio HTTP server serving the same bytes from its own process.
MINIMAL_SERVER = """
import asyncio, sys
body = open(sys.argv[2], "rb").read()
head = b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n" % len(body)
async def client(r, w):
    await r.readuntil(b"\\r\\n\\r\\n")
    w.write(head + body)
    await w.drain()
    w.close()
async def main():
    server = await asyncio.start_server(client, "127.0.0.1", int(sys.argv[1]), backlog=128)
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def reference_latencies(tmp: Path, body: bytes, scrapes: int) -> list[float]:
    from tests.daemon_harness import free_port
    (tmp / "body").write_bytes(body)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", MINIMAL_SERVER, str(port), str(tmp / "body")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return scrape_latencies(f"http://127.0.0.1:{port}/metrics", scrapes)
    finally:
        proc.kill()
        proc.wait()


def bench_daemon(tmp: Path, scrapes: int, window_s: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from tests.daemon_harness import MigdProcess
    (tmp / "daemon").mkdir(exist_ok=True)
    m = MigdProcess(tmp / "daemon", fleet="dgx-h100", reconcile_interval="1h")
    try:
        m.start(now="2026-11-23T10:00:00")  # Monday 10:00: day, 7 instances on each of 8 H100s
        m.wait_ready(60)
        time.sleep(2)
        url = f"http://127.0.0.1:{m.port}/metrics"
        lat = scrape_latencies(url, scrapes)
        with urllib.request.urlopen(url, timeout=30) as r:
            body = r.read().decode()
        ref = reference_latencies(tmp, body.encode(), scrapes)
        series = sum(1 for line in body.splitlines() if line.startswith("migd_instance_info{"))
        pid = m.proc.pid  # type: ignore[union-attr]

        def cpu() -> float:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

        def cycles() -> float:
            with urllib.request.urlopen(url, timeout=30) as r:
                text = r.read().decode()
            return float(next(line.split()[-1] for line in text.splitlines()
                              if line.startswith("migd_sampler_cycles_total ")))
        c0, s0, t0 = cpu(), cycles(), time.time()
        time.sleep(window_s)
        c1, s1 = cpu(), cycles()
        n_cycles = max(1.0, s1 - s0)
        rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
        return {"instances": series, "scrapes": len(lat), "p50_ms": 1e3 * statistics.median(lat),
                "p99_ms": 1e3 * pct(lat, 0.99), "ref_p50_ms": 1e3 * statistics.median(ref),
                "ref_p99_ms": 1e3 * pct(ref, 0.99), "rss_mib": rss / 1024,
                "cpu_per_cycle_ms": 1e3 * (c1 - c0) / n_cycles,
                "idle_cpu_pct": 100 * (c1 - c0) / (time.time() - t0)}
    finally:
        m.close()


def main() -> int:
    ap = argparse.ArgumentParser(description="migd benchmarks (simulator)")
    ap.add_argument("--short", action="store_true", help="fewer repetitions (CI)")
    ap.add_argument("--driver-ms", type=float, default=20.0, help="simulated latency of each mutating NVML call")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        plan = bench_plan(1 if args.short else 10)
        apply = bench_apply(args.driver_ms, tmp)
        ops = bench_ops(tmp)
        daemon = bench_daemon(tmp, 250 if args.short else 1000, 5 if args.short else 20)
    print(f"{'benchmark':<52} {'value':>12}")
    print("-" * 65)
    print(f"{'plan, 127 feasible layouts: p50 / p99 per layout':<52} {plan['p50_ms']:>6.2f} / {plan['p99_ms']:.2f} ms")
    print(f"{'plan, all 127 layouts in total':<52} {plan['total_ms']:>9.1f} ms")
    print(f"{'apply day->night, 8 GPUs, parallel':<52} {apply['parallel']:>10.2f} s")
    print(f"{'apply day->night, 8 GPUs, sequential':<52} {apply['sequential']:>10.2f} s")
    print(f"{'  speed-up (driver ' + format(args.driver_ms, 'g') + ' ms per mutating call)':<52} "
          f"{apply['ratio']:>10.1f} x")
    for name, ours, naive in ops:
        print(f"{'ops ' + name + ': migd vs destroy-all-and-recreate':<52} {ours:>6} vs {naive}")
    print(f"{'scrape latency, 50 clients, ' + str(daemon['instances']) + ' instances: p50 / p99':<52} "
          f"{daemon['p50_ms']:>6.1f} / {daemon['p99_ms']:.1f} ms")
    print(f"{'  minimal asyncio server, same bytes: p50 / p99':<52} "
          f"{daemon['ref_p50_ms']:>6.1f} / {daemon['ref_p99_ms']:.1f} ms  "
          f"(p99 ratio {daemon['p99_ms'] / daemon['ref_p99_ms']:.2f})")
    print(f"{'scrapes served':<52} {daemon['scrapes']:>10.0f}")
    print(f"{'daemon RSS':<52} {daemon['rss_mib']:>8.1f} MiB")
    print(f"{'daemon CPU per sampling cycle (8 H100, GPM)':<52} {daemon['cpu_per_cycle_ms']:>8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
