"""mig-parted's behaviour, ported for comparison (NVIDIA mig-parted v0.15.0, Apache-2.0):

- ``known_configs``: pkg/mig/config/known_configs.go's A100-SXM4-40GB generator (``init`` and
  ``iterateDeviceTypes``): the 923 configurations its known_configs_test.go works from.
- ``set_mig_config``: pkg/mig/config/config.go ``SetMigConfig`` inside ``iteratePermutationsUntilSuccess``
  over the simulator's driver model (``migd.sim.gpu.SimGpu``: its placement for a GPU instance created
  without one, the first free start for a compute instance), in memory: what mig-parted would end with on
  a simulated A100-40GB, or None when every ordering fails.

An independent reading of mig-parted's Go, kept apart from migd's own packing (migd.profiles.resolve)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from migd.catalog.models import MODELS, CiProfile, GiProfile, GpuModel
from migd.sim.gpu import NvmlFail, SimGpu

MAX_A100_40GB = {"1c.1g.5gb": 7, "1c.1g.5gb+me": 1, "1c.2g.10gb": 6, "2c.2g.10gb": 3, "1c.3g.20gb": 6,
                 "2c.3g.20gb": 2, "3c.3g.20gb": 2, "1c.4g.20gb": 4, "2c.4g.20gb": 2, "4c.4g.20gb": 1,
                 "1c.7g.40gb": 7, "2c.7g.40gb": 3, "3c.7g.40gb": 2, "4c.7g.40gb": 1, "7c.7g.40gb": 1}
Layout = list[tuple[str, list[str]]]  # (GI profile, its CI profiles), sorted


def _parse(name: str) -> tuple[int, int, str]:
    m = re.fullmatch(r"(\d+)c\.(\d+)g\.\d+gb(\+me)?", name)
    assert m is not None, name
    return int(m.group(1)), int(m.group(2)), "me" if m.group(3) else ""


def flatten(config: dict[str, int]) -> list[str]:
    """types.MigConfig.Flatten: each device count times, sorted G desc, C desc, attributes desc."""
    out = [name for name, n in config.items() for _ in range(n)]
    return sorted(out, key=lambda n: (-_parse(n)[1], -_parse(n)[0], [-ord(ch) for ch in _parse(n)[2]]))


def known_configs() -> list[dict[str, int]]:
    devices = flatten(MAX_A100_40GB)
    found: dict[tuple[str, ...], None] = {}

    def visit(mps: list[str]) -> bool:  # True: Continue, False: Break
        cis, per_gi, mes = 0, {}, {}
        for n in mps:
            c, g, attrs = _parse(n)
            cis += c
            per_gi[g] = per_gi.get(g, 0) + c
            mes[g] = mes.get(g, 0) + (1 if attrs else 0)
        if per_gi.get(1, 0) > 1 and mes.get(1, 0) > 0 or cis > 7 or sum(per_gi) > 7:
            return False
        found.setdefault(tuple(sorted(mps)), None)
        return cis < 7

    def iterate(i: int, accum: list[str]) -> None:
        accum = [*accum, devices[i]]
        if visit(accum):
            for j in range(i + 1, len(devices)):
                iterate(j, accum)
    for i in range(len(devices)):
        iterate(i, [])
    return [{n: key.count(n) for n in sorted(set(key))} for key in found]


def _orderings(items: list[str]) -> Iterator[list[str]]:
    work = list(items)

    def walk(i: int) -> Iterator[list[str]]:
        if i >= len(work):
            yield work
            return
        for j in range(i, len(work)):
            if all(work[k] != work[j] for k in range(i, j)):  # shouldSwap
                work[i], work[j] = work[j], work[i]
                yield from walk(i + 1)
                work[i], work[j] = work[j], work[i]
    return walk(0)


def _profiles(model: GpuModel, name: str) -> tuple[GiProfile, CiProfile]:
    c, g, attrs = _parse(name)
    gi_name = name.split(".", 1)[1]
    gi = next(p for p in model.profiles if p.name == gi_name)
    ci = next(x for x in gi.ci_profiles if x.slices == c)
    return gi, ci


def set_mig_config(config: dict[str, int], model_key: str = "A100-SXM4-40GB") -> Layout | None:
    model = MODELS[model_key]
    for order in _orderings(flatten(config)):
        gpu = SimGpu(0, model_key, "GPU-port", "", mig_current=True, mig_pending=True)
        serial, last, gi, ok = 0, -1, None, True
        for name in order:
            gprof, cprof = _profiles(model, name)
            reuse = gi is not None and last == gprof.profile_id
            last = gprof.profile_id
            while True:
                serial += 1
                try:
                    if not reuse:
                        gi = gpu.create_gi(gprof, gpu.auto_start(gprof), serial)
                    assert gi is not None
                    gpu.create_ci(gi, cprof.profile_id, None, serial)
                    break
                except NvmlFail:
                    if reuse:
                        reuse = False
                        continue
                    ok = False
                    break
            if not ok:
                break
        if ok:
            return sorted((gpu.profile(g.profile_id).name, sorted(
                next(c.name for c in gpu.profile(g.profile_id).ci_profiles if c.profile_id == ci.profile_id)
                for ci in g.cis)) for g in gpu.gis)
    return None
