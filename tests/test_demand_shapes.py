"""A partition whose nodes hold different numbers of GPUs of one model: the planner plans each on its
own layouts (migd/demand/mix.py ``shapes``; the rule's ``Shapes``), and skips a node of another model,
saying so."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest

from migd.catalog.models import MODELS
from migd.config.migdyaml import load_config
from migd.daemon.demandpass import DemandPass
from migd.demand.inputs import NodeView, Pending, Snapshot
from migd.demand.mix import shapes
from migd.demand.rule import decide
from migd.errors import ValidationError
from migd.hardware.types import GpuInfo
from migd.plan.offline import fake_gpu
from migd.profiles.loader import load_profile
from migd.slurm.ctl import SlurmCtl
from migd.slurm.demandconf import DemandMode, DemandSettings, Mixes
from migd.slurm.demandplan import Planner
from migd.slurm.queue import read_queue
from migd.slurm.slurmconf import SlurmSettings
from migd.whatif.policies import Setup
from tests.helpers import NO_JOBS, PROFILES

H100 = MODELS["H100-SXM5-80GB"]
NAMES = ("day", "night", "night-two", "balanced")
PROFS = {n: load_profile(PROFILES / f"{n}.yaml") for n in NAMES}
SHAPES = shapes(PROFS, NAMES, [H100] * 8)
FOUR = "4xH100-SXM5-80GB"
OLD = 6 * 3600.0
NOW = 1795671590.0


def notebooks(n: int) -> tuple[Pending, ...]:
    return tuple(Pending(f"nb{i}", "teaching", "1g.10gb", 1, 2 * 3600.0, age_s=OLD) for i in range(n))


def test_every_other_count_of_the_planners_model_has_its_layouts() -> None:
    assert sorted(SHAPES.other) == [f"{k}xH100-SXM5-80GB" for k in (1, 2, 3, 4, 5, 6, 7)]
    four = SHAPES.other[FOUR]
    assert len(four) == 35 and four["night"].capacity == (("7g.80gb", 4),)  # C(4+3, 3) mixes of 4 candidates
    assert dict(four["night*3/balanced"].capacity) == {"7g.80gb": 3, "3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    assert shapes(PROFS, NAMES, [H100, MODELS["A100-SXM4-80GB"]]).other == {}  # (a planner of two models: none)


def test_a_four_gpu_node_is_weighed_with_its_own_layouts() -> None:
    """Three hundred notebooks of 2 h (600 slice-hours) and one idle node of four H100s at night: it turns
    day, and what it gains is what four GPUs of 1g slices offer in the 8 h horizon less the 3-minute
    switch (28 slices x 7.95 h), for the 28 slices it idles while switching, not what the planner's eight
    would."""
    small = NodeView("small", "night", OLD, shape=FOUR)
    (change,) = decide(Snapshot(notebooks(300), (small,)), SHAPES).changes
    assert (change.node, change.new) == ("small", "day")
    assert "gains 222.6 slice-hours of pending work for 1.4 idled" in change.reason
    (big,) = decide(Snapshot(notebooks(300), (NodeView("big", "night", OLD),)), SHAPES).changes
    assert "gains 445.2 slice-hours of pending work for 2.8 idled" in big.reason


def test_the_planner_takes_each_nodes_shape_from_its_gres(tmp_path: Path) -> None:
    lines = {"gpu1": "gpu:7g.80gb:8", "gpu2": "gpu:7g.80gb:4", "gpu3": "gpu:1g.5gb:7",
             "gpu4": "gpu:7g.80gb:3,gpu:1g.10gb:2,gpu:2g.20gb:1,gpu:3g.40gb:1"}
    text = "".join(f"NodeName={n} Arch=x86_64 Gres={g} State=IDLE Partitions=main Extra=(null) Reason=(null)\n"
                   for n, g in lines.items())

    def runner(argv: Sequence[str], timeout_s: float) -> str:
        return text if argv[:2] == ("scontrol", "show") else ""

    ctl = SlurmCtl("gpu1", runner)
    settings = DemandSettings(DemandMode.DRY_RUN, "gpu1", NAMES, history_s=0)
    planner = Planner(settings, "main", "gpu1", ctl, SHAPES, tmp_path / "demand.json", lambda: NOW)
    views, skipped = planner._views(ctl.nodes(), read_queue(NO_JOBS, "main", NOW), NOW)
    assert [(v.name, v.layout, v.shape) for v in views] == [
        ("gpu1", "night", ""), ("gpu2", "night", FOUR), ("gpu4", "night*3/balanced", FOUR)]
    assert skipped == ["gpu3: Gres=gpu:1g.5gb:7 is none of the candidate layouts or their mixes on this planner's "
                       "GPU model"]


def test_mixes_false_keeps_every_node_whole_in_one_candidate_and_auto_does_under_reservations(
        tmp_path: Path) -> None:
    """``slurm.demand.mixes``: ``false`` weighs each candidate whole, on every shape; ``auto`` (the default)
    does so where Slurm reserves whole nodes for pending jobs (under its backfill a mixed node's minority
    GPUs wait behind the majority's reservations: docs/demand.md), and weighs every mix in the bench's
    plain model, where nothing reserves; ``true`` weighs every mix."""
    whole = shapes(PROFS, NAMES, [H100] * 8, mixed=False)
    assert whole.choices == frozenset(NAMES) and len(whole.own) == 165  # (a node in a mix is still read as one)
    cfg = tmp_path / "migd.yaml"
    text = (f"profiles_dir: {PROFILES}\nschedule:\n  - {{profile: night, at: \"00:00\"}}\nslurm:\n  node: gpu1\n"
            "  partition: main\n  demand:\n    mode: dry-run\n    planner: gpu1\n"
            "    candidates: [day, night, night-two, balanced]\n")

    def setup(extra: str) -> Setup:
        cfg.write_text(text + extra)
        return Setup.of(load_config(cfg), [H100] * 8, datetime(2026, 11, 26), 1)

    off, auto, on = setup("    mixes: false\n"), setup(""), setup("    mixes: true\n")
    assert (off.mixing, auto.mixing, on.mixing) == (Mixes.OFF, Mixes.AUTO, Mixes.ON)
    assert off.choices == frozenset(NAMES) and "night*7/balanced" in off.layouts  # (the fixed mixes' own)
    assert off.reserving(False).choices == frozenset(NAMES)
    assert auto.params.reserves and auto.choices == frozenset(NAMES)  # (Slurm: whole nodes)
    assert auto.reserving(False).choices is None and not auto.reserving(False).params.reserves  # (plain model)
    # (plain, on a fleet: whole nodes from as many nodes as candidates, mixes below)
    assert auto.reserving(False, 4).choices == frozenset(NAMES) and auto.reserving(False, 3).choices is None
    assert on.reserving(False, 8).choices is None and off.reserving(False, 1).choices == frozenset(NAMES)
    assert on.choices is None and on.reserving(False).choices is None
    with pytest.raises(ValidationError, match="mixes.*sometimes.*allowed: auto, true, false"):
        setup("    mixes: sometimes\n")


def _planner(tmp_path: Path, gres: dict[str, str], mixes: Mixes = Mixes.ON,
             extra: dict[str, str] | None = None, jobs: str = NO_JOBS) -> tuple[Planner, SlurmCtl]:
    def runner(argv: Sequence[str], timeout_s: float) -> str:
        if argv[:2] == ("squeue", "--json"):
            return jobs
        if argv[:2] != ("scontrol", "show"):
            return ""
        return "".join(f"NodeName={n} Arch=x86_64 Gres={g} State=IDLE Partitions=main "
                       f"Extra={(extra or {}).get(n, '(null)')} Reason=(null)\n" for n, g in gres.items())

    ctl = SlurmCtl("gpu1", runner)
    settings = DemandSettings(DemandMode.DRY_RUN, "gpu1", NAMES, history_s=0, mixes=mixes)
    layouts = shapes(PROFS, NAMES, [H100] * 8, mixed=not mixes.whole(settings.params.reserves))
    return Planner(settings, "main", "gpu1", ctl, layouts, tmp_path / "demand.json", lambda: NOW), ctl


def test_a_node_between_layouts_keeps_the_shape_it_last_had_and_an_unknown_one_is_skipped(tmp_path: Path) -> None:
    """Mid-switch a node's Gres= may be none of the layouts: its GPU count is the one it last matched, and a
    node never matched is skipped rather than planned as if it had the planner's eight GPUs."""
    want = f"migd:want=night,by=gpu1,at={NOW:.0f},until={NOW + 3600:.0f}"
    gres = {"gpu2": "gpu:7g.80gb:4", "gpu3": "(null)"}
    planner, ctl = _planner(tmp_path, gres, extra={"gpu2": want, "gpu3": want})
    views, skipped = planner._views(ctl.nodes(), read_queue(NO_JOBS, "main", NOW), NOW)
    assert [(v.name, v.shape) for v in views] == [("gpu2", FOUR)] and skipped[0].startswith("gpu3: Gres=(none)")
    gres["gpu2"] = "(null)"  # (its GRES between two layouts)
    views, _ = planner._views(ctl.nodes(), read_queue(NO_JOBS, "main", NOW), NOW)
    assert [(v.name, v.layout, v.shape) for v in views] == [("gpu2", "night", FOUR)]


def test_with_mixes_off_a_node_in_a_mix_is_still_read_and_changes_only_whole(tmp_path: Path) -> None:
    planner, ctl = _planner(tmp_path, {"gpu1": "gpu:7g.80gb:7,gpu:1g.10gb:2,gpu:2g.20gb:1,gpu:3g.40gb:1"},
                            mixes=Mixes.OFF)
    views, skipped = planner._views(ctl.nodes(), read_queue(NO_JOBS, "main", NOW), NOW)
    assert [(v.name, v.layout) for v in views] == [("gpu1", "night*7/balanced")] and skipped == []
    (change,) = decide(Snapshot(notebooks(300), (NodeView("gpu1", "night*7/balanced", OLD),)), planner.shapes).changes
    assert change.new in NAMES, change


def test_what_the_planner_learned_is_kept_without_a_switch_and_read_after_a_restart(tmp_path: Path) -> None:
    """demand.json is written at least every ten minutes, in dry-run too, so that a restart between a type's
    jobs still knows when it last saw it (``keep_place``)."""
    planner, _ = _planner(tmp_path, {"gpu1": "gpu:7g.80gb:8"})
    planner.seen.observe(NOW, [("2g.20gb", 1)])
    planner.tick()
    again, _ = _planner(tmp_path, {"gpu1": "gpu:7g.80gb:8"})
    assert [(s.mig_type, s.ago_s) for s in again.seen.seen(NOW + 60)] == [("2g.20gb", 60.0)]


class _Gpus:
    """Eight H100s as NVML describes them (the GpuLister the planner's first pass surveys)."""

    def gpu_count(self) -> int:
        return 8

    def gpu(self, index: int) -> GpuInfo:
        return fake_gpu(H100, index)


@pytest.mark.parametrize(("mixes", "whole"), [(Mixes.AUTO, True), (Mixes.OFF, True), (Mixes.ON, False)])
def test_the_daemons_planner_keeps_nodes_whole_on_slurm_unless_told_mixes_true(
        tmp_path: Path, mixes: Mixes, whole: bool) -> None:
    """The planner a migd builds (DemandPass) decides as Slurm schedules: every Slurm scheduler holds a
    younger job behind older ones, so with ``mixes: auto`` (the default) a change takes a node whole
    into one candidate, as the measurements under reservations chose (docs/demand.md)."""
    _, ctl = _planner(tmp_path, {"gpu1": "gpu:7g.80gb:8"})
    settings = DemandSettings(DemandMode.DRY_RUN, "gpu1", NAMES, history_s=0, mixes=mixes)
    slurm = SlurmSettings("gpu1", tmp_path / "slurm.conf", tmp_path / "gres.conf", partition="main", demand=settings)
    demand = DemandPass(slurm, settings, ctl, tmp_path, clock=lambda: NOW)
    demand.plan(PROFS, _Gpus())
    assert demand.planner is not None
    assert demand.planner.shapes.choices == (frozenset(NAMES) if whole else None)
    assert len(demand.planner.shapes.own) == 165  # (a node in a mix is read as one either way)


def test_the_planner_says_which_pending_work_no_candidate_layout_can_serve(tmp_path: Path) -> None:
    """Jobs asking a type by Slurm AutoDetect's name or a whole GPU's type (a partition's non-MIG nodes), or
    GPUs without a type, are work no change serves.  Any such job stopped every decision, and every pass of
    the planner node's migd, with a ValueError; now the planner says how many there are of each."""
    base = {"account": "a", "job_state": "PENDING", "state_reason": "Priority", "partition": "main", "node_count": 1,
            "tasks": 1, "time_limit": 60, "submit_time": NOW - 600, "tres_per_job": "", "tres_per_task": "",
            "tres_per_socket": "", "array_task_string": "", "priority": 5}
    asks = [(1, "gres:gpu:nvidia_h100_80gb_hbm3_1g.10gb:1", 1), (2, "gres:gpu:nvidia_h100_80gb_hbm3_1g.10gb:2", 2),
            (3, "gres:gpu:1g.10gb:1", 1), (4, "gres:gpu:2", 1), (5, "gres:gpu:a100:1", 1)]
    jobs = json.dumps({"jobs": [{**base, "job_id": j, "tres_per_node": ask, "node_count": n} for j, ask, n in asks]})
    planner, _ = _planner(tmp_path, {"gpu1": "gpu:7g.80gb:8"}, Mixes.OFF, jobs=jobs)
    plan = planner.tick()
    assert plan.error is None and plan.unoffered == {"a100": 1, "nvidia_h100_80gb_hbm3_1g.10gb": 2}  # (jobs)
    assert plan.untyped == 1 and "1g.10gb" in plan.wanted_slice_h
