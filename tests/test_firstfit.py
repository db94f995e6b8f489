"""The per-model first-fit table (migd.firstfit) answers exactly what the planner's search answers
on an empty GPU, for every profile sequence of every catalog model (issue 16: a faster planner,
the same plans)."""

from __future__ import annotations

import itertools

import pytest

from migd.firstfit import first_fit
from migd.hardware.catalog import MODELS, GpuModel
from migd.placement import fresh_layout, search
from migd.planner import forget, plan_gpu
from migd.profiles.resolve import DesiredInstance, DesiredLayout
from migd.profiles.validate import fake_gpu


def _want(model: GpuModel, seq: tuple[int, ...], owners: bool) -> list[DesiredInstance]:
    """The sequence as a request, reversed (the search sorts it) and, with ``owners``, every other
    instance owned by another team (same profile, not interchangeable: no longer twins)."""
    return [DesiredInstance(gi=model.by_id[pid], cis=(model.by_id[pid].default_ci,),
                            owner=("a" if n % 2 else "b") if owners else None)
            for n, pid in enumerate(reversed(seq))]


@pytest.mark.parametrize("key", sorted(MODELS))
def test_table_equals_search_on_an_empty_gpu(key: str) -> None:
    model = MODELS[key]
    table = first_fit(model)
    assert table, key
    for seq, owners in itertools.product(table, (False, True)):
        want = _want(model, seq, owners)
        looked_up, searched = fresh_layout(table, want), search(want, {}, {}, {})
        assert looked_up is not None and searched is not None, seq
        assert looked_up.items == searched.items, seq
        assert [(o.placement, o.cis) for o in looked_up.options] == \
               [(o.placement, o.cis) for o in searched.options], (key, seq, owners)


def test_table_holds_every_fitting_sequence_and_nothing_else() -> None:
    """Independently: a sequence is in the table iff some placement of it fits the memory slices."""
    model = MODELS["A30-24GB"]  # 4 memory slices: small enough to try every sequence
    profiles = sorted(model.profiles, key=lambda p: (-p.memory_slices, p.profile_id))
    fits = set()
    for n in range(1, 5):
        for seq in itertools.combinations_with_replacement(profiles, n):
            for pls in itertools.product(*(p.placements for p in seq)):
                if not any(a.overlaps(b) for a, b in itertools.combinations(pls, 2)):
                    fits.add(tuple(p.profile_id for p in seq))
                    break
    assert set(first_fit(model)) == fits


def test_pinned_or_unfitting_requests_fall_back_to_the_search() -> None:
    model = MODELS["A100-SXM4-80GB"]
    seven = model.profile_by_role("7g")
    assert seven is not None
    pinned = DesiredInstance(gi=seven, cis=(seven.default_ci,), placement=seven.placements[0])
    assert fresh_layout(first_fit(model), [pinned]) is None
    assert fresh_layout(first_fit(model), [DesiredInstance(gi=seven, cis=(seven.default_ci,))] * 2) is None


def test_a_first_time_plan_is_the_plan_the_search_makes() -> None:
    """plan_gpu on an empty GPU, memos dropped, gives the targets a search-only plan gives."""
    model = MODELS["H100-SXM5-80GB"]
    gpu = fake_gpu(model)
    for seq in list(first_fit(model))[::7]:
        desired = DesiredLayout(mig=True, instances=tuple(_want(model, seq, False)))
        try:
            forget()
            plan = plan_gpu(gpu, desired, [])
        except Exception as e:  # the feasibility check refuses caps/compute/media: the table does not
            assert "exceed" in str(e) or "compute slices" in str(e) or "media" in str(e), e
            continue
        sol = search(list(desired.instances), {}, {}, {})
        assert sol is not None
        assert sorted(t.placement.start for t in plan.targets) == sorted(o.placement.start for o in sol.options)
