#!/usr/bin/env python3
"""A week of Alibaba's GPU-sharing production trace as a bench/demand.py CSV, on H100 MIG types.

    python3 bench/demand_alibaba.py openb_pod_list_default.csv --from-day 140 --days 7 > alibaba-week.csv
    python3 bench/demand.py --trace alibaba-week.csv --nodes 6 --days 7

Source: ``cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv`` in github.com/alibaba/clusterdata
(8,152 pods of a production GPU-sharing cluster; Weng et al., "Beware of Fragmentation", USENIX ATC
'23).  That directory carries no licence of its own, so no derived copy is kept in this repository:
fetch the file and convert it with this command (bench/traces/README.md).

Mapping, one pod -> one job: a pod asking a share ``gpu_milli`` of one GPU gets the smallest H100 MIG
instance whose compute share covers it (1g: 1/7, 2g: 2/7, 3g: 3/7, else 7g); a pod asking k whole
GPUs asks k x 7g.80gb on one node; pods without a GPU or never scheduled are dropped.  Its run time
is ``deletion_time - scheduled_time`` (at least a minute); its submit time ``creation_time`` less the
window's start.  Its account is its QoS class (LS, BE, Burstable, Guaranteed).  The trace has no time
limits: each job gets one as a user would pad it, its run time doubled and rounded up to the hour.
Timestamps are seconds from the trace's own origin; the window's day 0 is taken to start on a
Monday (an assumption: the trace gives no date).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demand_trace import DAY, TraceJob, write_csv  # noqa: E402

SHARES = ((143, "1g.10gb"), (286, "2g.20gb"), (429, "3g.40gb"))  # up to n/7 of a GPU, in milli


def mig_type(num_gpu: int, gpu_milli: int) -> tuple[str, int] | None:
    """The MIG type and instances a pod's GPU request maps to (None: no GPU)."""
    if num_gpu <= 0:
        return None
    if num_gpu == 1:
        return next(((t, 1) for limit, t in SHARES if gpu_milli <= limit), ("7g.80gb", 1))
    return "7g.80gb", min(num_gpu, 8)


def convert(rows: list[dict[str, str]], from_day: float, days: float) -> list[TraceJob]:
    lo, hi = from_day * DAY, (from_day + days) * DAY
    jobs = []
    for r in rows:
        asked = mig_type(int(r["num_gpu"]), int(r["gpu_milli"] or 0))
        if asked is None or not r["scheduled_time"] or not lo <= float(r["creation_time"]) < hi:
            continue
        run = max(60.0, float(r["deletion_time"]) - float(r["scheduled_time"]))
        limit = math.ceil(run * 2 / 3600) * 3600
        jobs.append(TraceJob(float(r["creation_time"]) - lo, r["qos"] or "-", "gpu", asked[0], asked[1], run, limit))
    return sorted(jobs, key=lambda j: (j.submit_s, j.account))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pods", type=Path, help="openb_pod_list_default.csv")
    p.add_argument("--from-day", type=float, default=140.0, help="the window's first day in the trace (default 140)")
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--out", type=Path, default=Path("/dev/stdout"))
    args = p.parse_args(argv)
    with args.pods.open(newline="") as f:
        jobs = convert(list(csv.DictReader(f)), args.from_day, args.days)
    write_csv(args.out, jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
