"""The simulated NVML library honours NVML's MIG semantics, seen through the production backend."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from migd.catalog.models import MODELS, Placement
from migd.hardware.nvml.backend import NvmlBackend
from migd.hardware.types import HardwareError
from migd.sim import world
from migd.sim.backend import smi_argv
from migd.sim.library import load
from migd.sim.state import StateStore, new_state
from tests.test_catalog import ROLE_NAMES, feasible_multisets

E = pynvml


@pytest.fixture
def memory_backend() -> Iterator[Callable[..., tuple[NvmlBackend, StateStore]]]:
    """The production backend over an in-memory simulated node (closed after the test)."""
    made: list[NvmlBackend] = []

    def make(fleet: str, mig: bool = True) -> tuple[NvmlBackend, StateStore]:
        store = StateStore(state=new_state(fleet, mig_enabled=mig))
        load(store)
        made.append(NvmlBackend(smi_argv=["false"]))
        return made[-1], store
    yield make
    for b in made:
        b.close()


def placements_for(model_key: str, counts: dict[str, int]) -> list[tuple[int, Placement]] | None:
    """First non-overlapping explicit placement of a multiset (None if there is none)."""
    model = MODELS[model_key]
    items = sorted((r for r, n in counts.items() for _ in range(n)),
                   key=lambda r: -model.profile_by_role(r).memory_slices)  # type: ignore[union-attr]

    def go(i: int, used: list[Placement]) -> list[tuple[int, Placement]] | None:
        if i == len(items):
            return []
        p = model.profile_by_role(items[i])
        assert p is not None
        for pl in p.placements:
            if not any(pl.overlaps(u) for u in used):
                rest = go(i + 1, used + [pl])
                if rest is not None:
                    return [(p.profile_id, pl)] + rest
        return None
    return go(0, [])


@pytest.mark.parametrize("fleet", ["single-a100", "dgx-a100-40gb", "single-h100", "hgx-h200"])
@pytest.mark.integration
def test_every_feasible_multiset_can_be_created(fleet: str, memory_backend: Any) -> None:
    backend, store = memory_backend(fleet)
    model_key = store.read().gpus[0].model
    sets = feasible_multisets(MODELS[model_key], list(ROLE_NAMES))
    assert len(sets) == 127
    for ms in sets:
        plan = placements_for(model_key, dict(ms))
        assert plan is not None, ms
        ids = [backend.create_gpu_instance(0, pid, pl) for pid, pl in plan]
        got = sorted((g.profile_id, g.placement) for g in backend.list_gpu_instances(0))
        assert got == sorted(plan)
        for gi in ids:
            backend.destroy_gpu_instance(0, gi)
        assert backend.list_gpu_instances(0) == []


INVALID = [  # facts: combinations.notable_invalid_on_seven_slice_boards
    {"3g": 2, "1g": 1}, {"4g": 1, "3g": 1, "1g": 1}, {"7g": 1, "1g": 1}, {"4g": 2}, {"4g": 1, "2g": 2},
    {"4g": 1, "1g": 4}, {"3g": 1, "1g": 5}, {"3g": 1, "2g": 2, "1g": 1}, {"2g": 4}, {"2g": 3, "1g": 2},
    {"1g": 8}, {"1g+me": 2}, {"1g.2m": 5}, {"1g.2m": 4, "1g": 1},
]


@pytest.mark.parametrize("counts", INVALID, ids=lambda c: "+".join(f"{n}x{r}" for r, n in c.items()))
def test_invalid_combinations_are_refused_at_every_placement(counts: dict[str, int], memory_backend: Any) -> None:
    backend, _ = memory_backend("single-a100")
    model = MODELS["A100-SXM4-80GB"]
    items = [r for r, n in sorted(counts.items()) for _ in range(n)]
    refusals = 0
    completed = 0

    def go(i: int, min_start: int) -> None:
        nonlocal refusals, completed
        if i == len(items):
            completed += 1
            return
        p = model.profile_by_role(items[i])
        assert p is not None
        same_as_prev = i > 0 and items[i - 1] == items[i]
        for pl in p.placements:
            if same_as_prev and pl.start < min_start:
                continue
            try:
                gi = backend.create_gpu_instance(0, p.profile_id, pl)
            except HardwareError as e:
                assert e.code == E.NVML_ERROR_INSUFFICIENT_RESOURCES, e
                refusals += 1
                continue
            go(i + 1, pl.start)
            backend.destroy_gpu_instance(0, gi)

    go(0, -1)
    assert completed == 0
    assert refusals > 0


def test_overlap_cap_and_mode_errors(make_backend: Any) -> None:
    backend, store, _ = make_backend("single-a100")
    with pytest.raises(HardwareError) as e:
        backend.create_gpu_instance(0, 19, Placement(0, 1))
    assert e.value.code == E.NVML_ERROR_NOT_SUPPORTED  # MIG off
    assert backend.set_mig_mode(0, True) is True  # bare-metal Ampere, nobody else holds it: the driver resets it
    assert backend.gpu(0).mig_current
    backend.create_gpu_instance(0, 20, Placement(0, 1))  # 1g+me, cap 1
    with pytest.raises(HardwareError) as e:
        backend.create_gpu_instance(0, 20, Placement(1, 1))
    assert e.value.code == E.NVML_ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(HardwareError) as e:
        backend.create_gpu_instance(0, 14, Placement(0, 2))  # overlaps the 1g at 0
    assert e.value.code == E.NVML_ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(HardwareError) as e:
        backend.create_gpu_instance(0, 14, Placement(1, 2))  # not a legal 2g start
    assert e.value.code == E.NVML_ERROR_INVALID_ARGUMENT


@pytest.mark.integration
def test_in_use_rules_and_reset(make_backend: Any) -> None:
    backend, store, _ = make_backend("single-a100", mig_enabled=True)
    gi = backend.create_gpu_instance(0, 9, Placement(0, 4))
    ci = backend.create_compute_instance(0, gi, 2)
    with pytest.raises(HardwareError) as e:
        backend.destroy_gpu_instance(0, gi)  # a CI exists
    assert e.value.code == E.NVML_ERROR_IN_USE
    pid = world.start_process(store, 0, gi, ci, used_mib=2048)
    dev = backend.list_mig_devices(0)[0]
    assert [p.pid for p in dev.processes] == [pid]
    assert dev.memory_used_bytes == 2048 * 1024 * 1024
    assert dev.memory_total_bytes == (40192 + 128) * 1024 * 1024  # the driver reports more than the profile
    with pytest.raises(HardwareError) as e:
        backend.destroy_compute_instance(0, gi, ci)
    assert e.value.code == E.NVML_ERROR_IN_USE
    with pytest.raises(HardwareError) as e:
        backend.reset_gpu(0)
    assert "being used by some other process" in str(e.value)
    with pytest.raises(HardwareError) as e:
        backend.set_mig_mode(0, False)  # instances exist
    assert e.value.code == E.NVML_ERROR_IN_USE
    world.stop_process(store, pid)
    backend.reset_gpu(0)  # reset loses every GI and CI
    assert backend.list_gpu_instances(0) == []
    assert backend.gpu(0).mig_current


def test_hopper_mode_change_is_immediate(make_backend: Any) -> None:
    backend, _, _ = make_backend("single-h100")
    assert backend.set_mig_mode(0, True) is True
    g = backend.gpu(0)
    assert g.mig_current and g.mig_pending
    assert backend.set_mig_mode(0, False) is True
    assert not backend.gpu(0).mig_current


def test_compute_instance_splits(make_backend: Any) -> None:
    backend, _, _ = make_backend("single-a100", mig_enabled=True)
    gi = backend.create_gpu_instance(0, 9, Placement(4, 4))  # 3g.40gb
    ids = [backend.create_compute_instance(0, gi, 0, Placement(s, 1)) for s in range(3)]  # 3 x 1c.3g.40gb
    with pytest.raises(HardwareError) as e:
        backend.create_compute_instance(0, gi, 2)  # the full 3c no longer fits
    assert e.value.code == E.NVML_ERROR_INSUFFICIENT_RESOURCES
    (inst,) = backend.list_gpu_instances(0)
    assert [c.id for c in inst.compute_instances] == ids
    names = sorted(d.name for d in backend.list_mig_devices(0))
    assert names == ["NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb"] * 3


def test_gpm_only_on_hopper_and_deterministic(make_backend: Any) -> None:
    a100, _, _ = make_backend("single-a100", mig_enabled=True, name="a.json")
    gi = a100.create_gpu_instance(0, 19, Placement(0, 1))
    assert not a100.gpm_supported(0)
    with pytest.raises(HardwareError) as e:
        a100.gpm_sample(0, [gi])
    assert e.value.code == E.NVML_ERROR_NOT_SUPPORTED

    a100.close()
    clock = iter([1000.0, 1000.0, 1001.0, 1001.0])
    store = StateStore(state=new_state("single-h100", mig_enabled=True))
    load(store, clock=lambda: next(clock))
    h100 = NvmlBackend(smi_argv=["false"])
    busy = h100.create_gpu_instance(0, 19, Placement(0, 1))
    idle = h100.create_gpu_instance(0, 19, Placement(1, 1))
    h100.create_compute_instance(0, busy, 0)
    world.start_process(store, 0, busy, 0)
    assert h100.gpm_supported(0)
    m = h100.gpm_sample(0, [busy, idle])
    assert m[idle].sm_active == 0.0  # a real idle instance, not a placeholder
    assert m[busy].sm_active is not None and 0.05 < m[busy].sm_active < 1.0
    assert m[busy].graphics_active is not None and m[busy].graphics_active > m[busy].sm_active
    h100.close()


def test_xid_events_attributed_to_instances(make_backend: Any) -> None:
    backend, store, _ = make_backend("single-h100", mig_enabled=True)
    gi = backend.create_gpu_instance(0, 9, Placement(0, 4))
    assert backend.wait_event(50) is None  # registration happens now; earlier changes are not replayed
    world.raise_xid(store, 0, 31, gi=gi, ci=0)
    world.raise_xid(store, 0, 79)
    ev = backend.wait_event(1000)
    assert ev is not None and (ev.kind, ev.xid, ev.gi_id, ev.ci_id) == ("xid", 31, gi, 0)
    ev = backend.wait_event(1000)
    assert ev is not None and (ev.kind, ev.xid, ev.gi_id) == ("xid", 79, None)
    backend.create_gpu_instance(0, 9, Placement(4, 4))
    ev = backend.wait_event(1000)
    assert ev is not None and ev.kind == "mig_config_change"


def test_fault_injection_nth_call(make_backend: Any) -> None:
    backend, store, _ = make_backend("single-a100", mig_enabled=True)
    world.fail_call(store, "nvmlDeviceCreateGpuInstanceWithPlacement", E.NVML_ERROR_UNKNOWN, nth=2)
    backend.create_gpu_instance(0, 19, Placement(0, 1))
    with pytest.raises(HardwareError) as e:
        backend.create_gpu_instance(0, 19, Placement(1, 1))
    assert e.value.code == E.NVML_ERROR_UNKNOWN
    backend.create_gpu_instance(0, 19, Placement(1, 1))  # fires once
    assert len(backend.list_gpu_instances(0)) == 2


def test_gpu_lost(make_backend: Any) -> None:
    backend, store, _ = make_backend("single-a100", mig_enabled=True)
    world.set_lost(store, 0)
    with pytest.raises(HardwareError) as e:
        backend.list_gpu_instances(0)
    assert e.value.code == E.NVML_ERROR_GPU_IS_LOST


@pytest.mark.integration
def test_crash_mid_apply_keeps_landed_changes(make_backend: Any) -> None:
    _, store, path = make_backend("single-a100", mig_enabled=True)
    world.crash_after_mutations(store, 2)
    script = textwrap.dedent(f"""
        from migd.sim.backend import sim_backend
        from migd.catalog.models import Placement
        b = sim_backend({str(path)!r})
        for s in range(7):
            b.create_gpu_instance(0, 19, Placement(s, 1))
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    assert "not reached" not in proc.stdout
    assert [gi.start for gi in store.read().gpus[0].gis] == [0, 1]


@pytest.mark.integration
def test_state_shared_with_fake_nvidia_smi(make_backend: Any) -> None:
    backend, store, path = make_backend("mixed", mig_enabled=True)
    gi = backend.create_gpu_instance(2, 9, Placement(4, 4))
    backend.create_compute_instance(2, gi, 2)
    backend.create_compute_instance(2, backend.create_gpu_instance(2, 19, Placement(0, 1)), 0)
    out = subprocess.run([*smi_argv(path), "-L"], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    gpus = backend.list_gpus()
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {gpus[0].uuid})"
    assert lines[2] == f"GPU 2: NVIDIA H100 80GB HBM3 (UUID: {gpus[2].uuid})"
    devs = {d.uuid: d for d in backend.list_mig_devices(2)}
    mig_lines = [ln for ln in lines if ln.startswith("  MIG")]
    assert len(mig_lines) == 2
    for ln in mig_lines:
        m = re.fullmatch(r"  MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-f-]{36})\)", ln)
        assert m, ln
        assert devs[m.group(3)].name.endswith(m.group(1))

    out = subprocess.run([*smi_argv(path), "-i", "2", "mig", "-lgi"], capture_output=True, text=True,
                         check=True).stdout
    rows = re.findall(r"\|\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|", out)
    ids = {g.placement.start: g.id for g in backend.list_gpu_instances(2)}
    assert sorted(rows) == sorted([("2", "3g.40gb", "9", str(ids[4]), "4", "4"),
                                   ("2", "1g.10gb", "19", str(ids[0]), "0", "1")])
    assert "| GPU instances:" in out and "Start:Size" in out

    # and a reset done by nvidia-smi is seen by NVML
    subprocess.run([*smi_argv(path), "-i", gpus[2].pci_bus_id, "mig", "-lgi"], check=True, capture_output=True)
    backend.destroy_compute_instance(2, gi, 0)
    reset = [*smi_argv(path), "-r", "-i", gpus[2].pci_bus_id]
    r = subprocess.run(reset, capture_output=True, text=True)
    assert r.returncode != 0 and "being used by some other process" in r.stderr  # this process holds NVML
    backend.close()
    r = subprocess.run(reset, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    backend = NvmlBackend()
    assert backend.list_gpu_instances(2) == []
    backend.close()


def test_a_read_only_entry_point_that_changes_a_quiet_state_is_caught(tmp_path: Any) -> None:
    """A simulator bug guard: an entry point declared read-only runs on the cached state without
    the file lock (the short path); if it changes that state it fails loudly and nothing is written."""
    from migd.sim.entry import Export
    from migd.sim.library import Call, SimLibrary
    from migd.sim.state import open_store

    store = open_store(tmp_path / "state.json", "single-h100")
    lib = SimLibrary(store)
    lib.init_count = 1

    def careless(call: Any) -> None:
        with call.state() as s:
            s.gpus[0].lost = True
            s.touched = True
    export = Export("nvmlCareless", (), careless)
    assert export.read_only
    store.read()  # parsed and cached, as after any earlier call
    with pytest.raises(RuntimeError, match="read-only entry point changed the shared state"):
        careless(Call(lib, export, None))
    assert not store.read().gpus[0].lost
