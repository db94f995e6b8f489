"""Per-GPU mixes of the candidate layouts (migd/demand/mix.py): how a mix is written and read, the
profile a node applies for one, and what counts as undoing a change; and the run times the planner
learns per account (migd/demand/runtime.py)."""

from __future__ import annotations

import pytest

from migd.catalog.models import MODELS
from migd.demand.capacity import node_layout
from migd.demand.inputs import Layout
from migd.demand.mix import Candidates, MixError, mix_profile, mix_text, moved_back, parse_mix
from migd.demand.runtime import RunTimes
from migd.plan.offline import fake_gpu
from migd.profiles.loader import load_profile
from tests.helpers import PROFILES

H100x8 = [MODELS["H100-SXM5-80GB"]] * 8
NAMES = ("day", "night", "night-two", "balanced")
PROFS = {n: load_profile(PROFILES / f"{n}.yaml") for n in NAMES}
CANDS = Candidates.resolve(PROFS, NAMES, H100x8)


def test_a_mix_is_written_as_runs_in_gpu_order_and_read_back() -> None:
    per_gpu = ("day", "day", "night", "night", "night", "night", "night", "balanced")
    assert mix_text(per_gpu) == "day*2/night*5/balanced"
    assert parse_mix("day*2/night*5/balanced", NAMES) == per_gpu
    assert mix_text(["night"] * 8) == "night" and parse_mix("night", NAMES) is None  # a plain want, as before
    for bad in ("day*2/rogue", "day*0/night", "day*2//night", "day*x"):
        with pytest.raises(MixError):
            parse_mix(bad, NAMES)


def test_every_mix_of_four_candidates_on_eight_gpus_is_offered_once() -> None:
    layouts = CANDS.layouts()
    assert len(layouts) == 165 and set(CANDS.layouts(mixed=False)) == set(NAMES)
    assert layouts["night*7/balanced"] == Layout.of("night*7/balanced", {
        "7g.80gb": 7, "3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})
    assert all(lay.slices <= 56 for lay in layouts.values())


def test_the_profile_for_a_mix_gives_each_gpu_its_candidates_section() -> None:
    """Resolved as an apply resolves it: GPUs 0-6 one 7g each, GPU 7 the balanced split; the node's
    instances are what the rule counted for the mix."""
    p = mix_profile("night*7/balanced", PROFS, NAMES)
    assert p.name == "night*7/balanced" and "night" in p.description and "balanced" in p.description
    gpus = [fake_gpu(m, i) for i, m in enumerate(H100x8)]
    sections = [p.section_for(g) for g in gpus]
    assert all(s is not None for s in sections)
    assert [s.instances[0].profile for s in sections if s is not None] == ["7g"] * 7 + ["3g"]
    assert node_layout(p, H100x8).capacity == CANDS.layouts()["night*7/balanced"].capacity
    assert mix_profile("night", PROFS, NAMES) is PROFS["night"]
    nine = mix_profile("day*9", PROFS, NAMES)  # a mix longer than the node: the GPUs it names
    assert node_layout(nine, H100x8).count("1g.10gb") == 56


def test_undoing_half_a_change_or_more_is_moving_back() -> None:
    night, day = Layout.of("night", {"7g.80gb": 8}), Layout.of("day", {"1g.10gb": 56})
    half = Layout.of("day*4/night*4", {"1g.10gb": 28, "7g.80gb": 4})
    carve = Layout.of("night*7/balanced", {"7g.80gb": 7, "3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})
    assert moved_back(night, day, night) and moved_back(night, day, half)
    assert not moved_back(night, carve, Layout.of("night*6/balanced*2", {"7g.80gb": 6, "3g.40gb": 2,
                                                                          "2g.20gb": 2, "1g.10gb": 4}))
    assert not moved_back(night, night, day)  # nothing moved before: nothing to undo


def test_run_times_are_learned_per_account_as_a_high_quantile() -> None:
    rt = RunTimes(min_jobs=10)
    for k in range(10):
        rt.observe("teaching", ran_s=(k + 1) * 360, limit_s=7200)  # 5%..50% of the limit
    for _ in range(9):
        rt.observe("nlp", ran_s=3600, limit_s=7200)
    rt.observe("nlp", ran_s=3600, limit_s=float("inf"))  # an unlimited job teaches nothing
    assert rt.ratios() == (("teaching", 0.5),)  # nine in ten within half; nlp has too few
    again = RunTimes()
    again.load(rt.to_json())
    assert again.ratios() == rt.ratios()
