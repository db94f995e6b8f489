"""What reading Slurm's queue costs migd, against the queue's size.

Slurm 22.05's ``squeue --json`` ignores its filters (squeue(1)): the demand planner and a draining node
read every job of the cluster.  This submits N held jobs to a real two-node Slurm cluster
(tests/slurm_cluster.py: needs root and Debian's slurmctld/slurmd/munge) and times, in the same run:
``squeue --json`` and migd's read of it (the planner's queue, a node's own jobs), the peak memory that
read takes, and beside them Slurm's own text listing of the same queue (``squeue -h``, the least a
listing costs) and the one-line check a node makes first (``squeue -h -w NODE -o %A``).

    python3 bench/slurm_queue.py [--jobs N] [--short]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from migd.slurm.jobjson import on_node, read_jobs  # noqa: E402
from migd.slurm.queue import read_queue  # noqa: E402
from tests.slurm_cluster import SlurmCluster, missing_reason  # noqa: E402

NODES = ("gpu1", "gpu2")
GRES = "gpu:1g.10gb:2,gpu:3g.40gb:2"
TYPES = ("1g.10gb", "3g.40gb", "7g.80gb")


def timed(fn: Callable[[], object], reps: int) -> float:
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return median(runs)


def peak_mib(fn: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def measure(c: SlurmCluster, jobs: int, reps: int) -> dict[str, float]:
    for k in range(jobs):  # pending (their start a day away), as a long queue's jobs wait
        c.cmd("sbatch", "-o", "/dev/null", "-A", f"acct{k % 7}", "-t", "60", "--begin=now+1day",
              f"--gres=gpu:{TYPES[k % 3]}:1", "--wrap", "true")
    text = c.cmd("squeue", "--json")
    now = time.time()
    return {
        "jobs": float(len(read_jobs(text))),
        "json_mib": len(text.encode()) / 2**20,
        "squeue_json": timed(lambda: c.cmd("squeue", "--json"), reps),
        "read_queue": timed(lambda: read_queue(text, "main", now), reps),
        "on_node": timed(lambda: on_node(text, "gpu1"), reps),
        "peak_mib": peak_mib(lambda: read_queue(text, "main", now)),
        "squeue_text": timed(lambda: c.cmd("squeue", "-h", "-o", "%A %T %b"), reps),
        "node_check": timed(lambda: c.cmd("squeue", "-h", "-w", "gpu1", "-o", "%A"), reps),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5000, help="held jobs to submit (slurm.conf's MaxJobCount: 10000)")
    ap.add_argument("--short", action="store_true", help="1,000 jobs (CI)")
    args = ap.parse_args()
    reason = missing_reason()
    if reason is not None:
        print(f"slurm queue benchmark skipped: {reason}")
        return 0
    jobs = 1000 if args.short else args.jobs
    c = SlurmCluster(4, nodes=NODES)
    try:
        conf = "".join(f"NodeName={n} Name=gpu Type={t} File={c.devs[n]}/nvidia{i}\n" for n in NODES
                       for i, t in enumerate(("1g.10gb", "1g.10gb", "3g.40gb", "3g.40gb")))
        c.start(dict.fromkeys(NODES, GRES), conf, catalog="gpu:1g.10gb:2,gpu:3g.40gb:2,gpu:7g.80gb:1", cpus=8)
        m = measure(c, jobs, 3)
    finally:
        c.stop()
    per_job_kib = m["json_mib"] * 1024 / m["jobs"]
    rows = [("squeue --json (the whole queue, 22.05)", m["squeue_json"], f"{m['json_mib']:.1f} MiB"),
            ("  migd reads it: the planner's queue (read_queue)", m["read_queue"], f"{m['peak_mib']:.1f} MiB peak"),
            ("  migd reads it: a node's own jobs (on_node)", m["on_node"], ""),
            ('reference: squeue -h -o "%A %T %b" (text, same jobs)', m["squeue_text"], ""),
            ("a node's check first: squeue -h -w NODE -o %A", m["node_check"], "")]
    title = f"Slurm queue of {m['jobs']:,.0f} pending jobs, median of 3"
    print(f"{title:<56} {'time':>9} {'size':>15}")
    print("-" * 82)
    for what, secs, size in rows:
        print(f"{what:<56} {secs:>8.3f}s {size:>15}")
    print(f"per job: {per_job_kib:.1f} KiB of JSON, {1e3 * m['squeue_json'] / m['jobs']:.3f} ms in squeue --json, "
          f"{1e3 * m['read_queue'] / m['jobs']:.3f} ms read by migd")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
