"""The sampler reads each layout once and per cycle only what changes, counted on the
simulated NVML library under the real pynvml."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migd.hardware.nvml.backend import NvmlBackend
from migd.metrics.sampler import Sampler
from migd.sim.backend import sim_backend
from migd.sim.library import loaded
from tests.helpers import PROFILES, Migctl

# 8 H100 x 7 instances: per GPU the MIG mode (8); per MIG device memory and processes (112); GPM
# two samples and one metrics read per instance (168); one device count: 289 (<= 300).
BUDGET = 300


def calls() -> Counter[str]:
    lib = loaded()
    assert lib is not None
    return Counter(lib.calls)


def live_gpm_samples() -> int:
    lib = loaded()
    assert lib is not None
    return len(lib.samples)


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[tuple[Migctl, NvmlBackend, Sampler]]:
    m = Migctl(tmp_path, "dgx-h100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    backend = sim_backend(m.state, "dgx-h100")
    sampler = Sampler(backend, threading.RLock(), lambda: {}, gpm_interval_s=0.01)
    try:
        yield m, backend, sampler
    finally:
        sampler.close()
        backend.close()


def _cycle(sampler: Sampler) -> tuple[int, Any]:
    before = calls()
    snap = sampler.sample_once()
    after = calls()
    after.subtract(before)
    return sum(after.values()), snap


def test_a_cycle_costs_at_most_300_nvml_calls(h100: Any) -> None:
    _, _, sampler = h100
    first, snap = _cycle(sampler)  # reads every layout
    again, snap2 = _cycle(sampler)
    assert again <= BUDGET < first
    assert sum(len(g.instances) for g in snap2.gpus) == 56
    assert all(i.activity is not None and i.activity_source == "gpm" for g in snap2.gpus for i in g.instances)
    assert [c.mig_uuid for g in snap.gpus for i in g.instances for c in i.cis] == \
        [c.mig_uuid for g in snap2.gpus for i in g.instances for c in i.cis]


def test_gpm_buffers_are_kept_per_layout_and_freed(h100: Any) -> None:
    _, _, sampler = h100
    base = live_gpm_samples()
    sampler.sample_once()
    held = live_gpm_samples() - base
    assert held == 2 * 56  # two buffers per GPU instance, allocated once
    for _ in range(3):
        sampler.sample_once()
    assert live_gpm_samples() - base == held  # no buffer per cycle, none leaked
    sampler.invalidate()
    sampler.sample_once()
    assert live_gpm_samples() - base == held  # the old view's buffers went back before new ones came
    sampler.close()
    assert live_gpm_samples() == base


@pytest.mark.integration
def test_an_apply_elsewhere_is_seen_through_invalidation_or_a_dead_handle(h100: Any) -> None:
    m, _, sampler = h100
    sampler.sample_once()
    assert m("apply", str(PROFILES / "night.yaml")).code == 0  # another process: every old handle dies
    snap = sampler.sample_once()  # cached handles fail: the GPU is read afresh in the same cycle
    assert not snap.unread and {i.profile for g in snap.gpus for i in g.instances} == {"7g.80gb"}
    assert m("apply", str(PROFILES / "night-two.yaml")).code == 0
    sampler.invalidate()  # what an apply or a MIG-config-change event does
    snap = sampler.sample_once()
    assert {i.profile for g in snap.gpus for i in g.instances} == {"3g.40gb"}
    cost, _ = _cycle(sampler)
    assert cost <= BUDGET


def test_a_mig_mode_change_is_noticed(h100: Any) -> None:
    m, backend, sampler = h100
    sampler.sample_once()
    disabled = m.state.parent / "off.yaml"
    disabled.write_text("apiVersion: migd/v1\nkind: Profile\nname: off\ngpus:\n  - select: {index: [5]}\n"
                        "    mig: disabled\n")
    assert m("apply", str(disabled)).code == 0
    snap = sampler.sample_once()
    gpu5 = next(g for g in snap.gpus if g.info.index == 5)
    assert not gpu5.info.mig_current and gpu5.instances == ()
    assert backend.gpu(5).mig_current is False
