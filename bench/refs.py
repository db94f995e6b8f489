"""References measured beside migd in the same run: each does the bare job one way,
without migd's structure, so the ratio shows what migd's own code costs."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pynvml

from migd.catalog.models import GiProfile, Placement

# A minimal asyncio HTTP server serving the same bytes from its own process (argv: port, file).
MINIMAL_SERVER = """
import asyncio, sys
body = open(sys.argv[2], "rb").read()
head = b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n" % len(body)
async def client(r, w):
    try:
        await r.readuntil(b"\\r\\n\\r\\n")
        w.write(head + body)
        await w.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    w.close()
async def main():
    server = await asyncio.start_server(client, "127.0.0.1", int(sys.argv[1]), backlog=128)
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


# The same job as migd's daemon written bare against pynvml, in a process of its own over the same simulated
# node (argv: this directory): the direct sampling cycle once a second and an Xid watch waiting 100 ms at a
# time (migd's WAIT_MS), nothing else.  Its CPU, measured as the daemon's over the same window, is the
# machine's floor for the job: timed waits are not free everywhere (a sleeping thread of a VM's guest may
# be charged for its wake-ups).
BARE_EXPORTER = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
import pynvml
from refs import DirectSampler
pynvml.nvmlInit()
sampler = DirectSampler()
events = pynvml.nvmlEventSetCreate()
for i in range(pynvml.nvmlDeviceGetCount()):
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, events)
def watch():
    while True:
        try:
            pynvml.nvmlEventSetWait_v2(events, 100)
        except pynvml.NVMLError_Timeout:
            pass
threading.Thread(target=watch, daemon=True).start()
print("ready", os.getpid(), flush=True)
while True:
    t = time.monotonic()
    sampler.cycle()
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
"""


_METRICS = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)


class DirectSampler:
    """The sampling cycle written straight against pynvml, handles and GPM buffers kept: per GPU
    the MIG mode; per MIG device memory and processes; per GPU instance two GPM samples and one
    metrics read (the 288-call cycle named as enough), no migd types, no error handling."""

    def __init__(self) -> None:
        self.gpus: list[tuple[Any, list[Any], dict[int, tuple[Any, Any, Any]]]] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            dev = pynvml.nvmlDeviceGetHandleByIndex(i)
            migs, gis = [], set()
            for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(dev)):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(dev, k)
                except pynvml.NVMLError_NotFound:
                    continue
                migs.append(mig)
                gis.add(pynvml.nvmlDeviceGetGpuInstanceId(mig))
            samples = {}
            for gi in sorted(gis):
                s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
                mg = pynvml.c_nvmlGpmMetricsGet_t()
                mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 5, s1, s2
                for j, metric in enumerate(_METRICS):
                    mg.metrics[j].metricId = metric
                samples[gi] = (s1, s2, mg)
            self.gpus.append((dev, migs, samples))

    def cycle(self) -> None:
        for dev, migs, samples in self.gpus:
            pynvml.nvmlDeviceGetMigMode(dev)
            for mig in migs:
                pynvml.nvmlDeviceGetMemoryInfo(mig)
                pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
            for gi, (s1, _, _) in samples.items():
                pynvml.nvmlGpmMigSampleGet(dev, gi, s1)
            time.sleep(0.001)  # GPM samples must be apart in time; the wait costs no CPU
            for gi, (_, s2, _) in samples.items():
                pynvml.nvmlGpmMigSampleGet(dev, gi, s2)
            for _, _, mg in samples.values():
                pynvml.nvmlGpmMetricsGet(mg)

    def close(self) -> None:
        for _, _, samples in self.gpus:
            for s1, s2, _ in samples.values():
                pynvml.nvmlGpmSampleFree(s1)
                pynvml.nvmlGpmSampleFree(s2)


def _mask(pl: Placement) -> int:
    return ((1 << pl.size) - 1) << pl.start


def fewest_ops(want: tuple[GiProfile, ...], existing: Iterable[tuple[int, int]]) -> int:
    """An independent placement search over bitmasks with pruning: the fewest create/destroy
    operations (2 per GI with its one CI) to go from ``existing`` (profile id, start) to ``want``."""
    have = frozenset(existing)
    best = [2 * (len(want) + len(have))]

    def go(k: int, used: int, kept: int, last: int) -> None:
        # creates so far, plus the existing GIs that stay unkept even if every item left keeps one
        if 2 * (k - kept) + 2 * max(0, len(have) - kept - (len(want) - k)) >= best[0]:
            return
        if k == len(want):
            best[0] = 2 * (len(want) - kept) + 2 * (len(have) - kept)
            return
        p = want[k]
        for pl in p.placements:
            if used & _mask(pl) or (k and want[k - 1] is p and pl.start < last):
                continue
            go(k + 1, used | _mask(pl), kept + ((p.profile_id, pl.start) in have), pl.start)
    go(0, 0, 0, -1)
    return best[0]
