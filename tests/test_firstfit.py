"""The per-model first-fit table (migd.plan.firstfit) answers exactly what the planner's search answers
on an empty GPU, for every profile sequence of every catalog model, and the CI placement that
stops early answers what a full search answers (a faster planner, the same plans)."""

from __future__ import annotations

import itertools
import re

import pytest

from migd.catalog.models import MODELS, CiProfile, GpuModel, Placement, media_conflict
from migd.plan.firstfit import first_fit
from migd.plan.offline import fake_gpu
from migd.plan.placement import (
    Solution,
    ci_multisets,
    fresh_cis,
    fresh_layout,
    fresh_options,
    item_rank,
    place_cis,
    search,
)
from migd.plan.planner import PlanError, _fits, _refusal, build_tables, forget, plan_gpu
from migd.plan.requests import DesiredInstance, DesiredLayout


def _want(model: GpuModel, seq: tuple[int, ...], owners: bool) -> list[DesiredInstance]:
    """The sequence as a request, reversed (the planner sorts it) and, with ``owners``, every other
    instance owned by another team (same profile, not interchangeable: no longer twins)."""
    return [DesiredInstance(gi=model.by_id[pid], cis=(model.by_id[pid].default_ci,),
                            owner=("a" if n % 2 else "b") if owners else None)
            for n, pid in enumerate(reversed(seq))]


def _look_up(model: GpuModel, want: list[DesiredInstance]) -> Solution | None:
    """fresh_layout as the planner calls it: the request in search order and its GI profile ids."""
    items = _in_order(want)
    return fresh_layout(first_fit(model), items, tuple(d.gi.profile_id for d in items))


def _in_order(want: list[DesiredInstance]) -> tuple[DesiredInstance, ...]:
    """The request in search order, as the planner hands it to fresh_layout and search."""
    return tuple(sorted(want, key=item_rank))


@pytest.mark.parametrize("key", sorted(MODELS))
@pytest.mark.integration
def test_table_equals_search_on_an_empty_gpu(key: str) -> None:
    model = MODELS[key]
    table = first_fit(model)
    assert table, key
    for seq, owners in itertools.product(table, (False, True)):
        want = _want(model, seq, owners)
        looked_up, searched = _look_up(model, want), search(_in_order(want), {}, {}, {})
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
    assert _look_up(model, [pinned]) is None
    assert _look_up(model, [DesiredInstance(gi=seven, cis=(seven.default_ci,))] * 2) is None


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
        sol = search(_in_order(list(desired.instances)), {}, {}, {})
        assert sol is not None
        assert sorted(t.placement.start for t in plan.targets) == sorted(o.placement.start for o in sol.options)


def test_a_profile_of_another_model_is_refused_before_any_search() -> None:
    """The planner answers from its model's tables only: a request resolved for an A100-40GB
    (1g.10gb is that model's two-slice profile) is refused on an A100-80GB, not planned there."""
    other = MODELS["A100-SXM4-40GB"].profile_by_name("1g.10gb")
    assert other is not None
    want = DesiredLayout(mig=True, instances=(DesiredInstance(gi=other, cis=(other.default_ci,)),))
    with pytest.raises(PlanError, match="not in the A100-SXM4-80GB table"):
        plan_gpu(fake_gpu(MODELS["A100-SXM4-80GB"]), want, [])


def _first_keeping_most(want: tuple[CiProfile, ...], have: tuple[tuple[int, Placement], ...]) -> object:
    """Brute force: every assignment in the planner's order (largest CI first, placements in table
    order), the first that keeps the most existing CIs."""
    order = sorted(range(len(want)), key=lambda i: -want[i].slices)
    best: tuple[int, tuple[Placement, ...]] | None = None
    for pls in itertools.product(*(want[i].placements for i in order)):
        if any(a.overlaps(b) for a, b in itertools.combinations(pls, 2)):
            continue
        kept = sum((want[i].profile_id, pl) in have for i, pl in zip(order, pls, strict=True))
        if best is None or kept > best[0]:
            best = (kept, pls)
    if best is None:
        return None
    placed = dict(zip(order, best[1], strict=True))
    return tuple(sorted((want[i].profile_id, placed[i]) for i in range(len(want))))


def test_ci_placement_is_the_first_that_keeps_most() -> None:
    """place_cis stops at the first layout that keeps all it could; the answer is unchanged."""
    model = MODELS["H100-SXM5-80GB"]
    for gi in model.profiles:
        cis = list(gi.ci_profiles)
        for n in range(1, min(gi.slices, 4) + 1):
            for want in itertools.combinations_with_replacement(cis, n):
                fresh = _first_keeping_most(want, ())
                haves: list[tuple[tuple[int, Placement], ...]] = [()]
                haves += [((c.profile_id, pl),) for c in cis for pl in c.placements]
                if fresh is not None:
                    haves.append(fresh[1:])  # type: ignore[index]
                for have in haves:
                    place_cis.cache_clear()
                    assert place_cis(want, None, have) == _first_keeping_most(want, have), (gi.name, want, have)


def test_ci_multisets_are_every_multiset_within_slices_and_caps() -> None:
    """Brute force over every multiset of a GI profile's CI profiles, on every catalog model."""
    for model in MODELS.values():
        for gi in model.profiles:
            cis = list(gi.ci_profiles)
            expected = {combo for n in range(1, gi.slices + 1)
                        for combo in itertools.combinations_with_replacement(cis, n)
                        if sum(c.slices for c in combo) <= gi.slices
                        and all(combo.count(c) <= c.instance_count for c in combo)}
            got = ci_multisets(gi)
            assert len(got) == len(set(got)) and set(got) == expected, (model.key, gi.name)


@pytest.mark.integration
def test_forget_keeps_the_model_tables_and_they_answer_as_before() -> None:
    """The per-model tables survive ``forget`` (they depend on the catalog alone) and answer what
    the planner computed without them: each CI layout on an empty GI, each multiset's verdict."""
    model = MODELS["H100-SXM5-80GB"]
    forget(tables=True)
    assert fresh_cis.cache_info().currsize == 0 and _fits.cache_info().currsize == 0
    build_tables(model)
    tables = (fresh_cis, fresh_options, _fits)
    sizes = tuple(t.cache_info().currsize for t in tables)
    assert sizes[0] == sizes[1] == sum(len(ci_multisets(gi)) for gi in model.profiles) and sizes[2] > 0
    forget()
    assert tuple(t.cache_info().currsize for t in tables) == sizes
    for gi in model.profiles:
        for cis in ci_multisets(gi):
            layout = _first_keeping_most(cis, ())
            assert fresh_cis(cis) == layout, (gi.name, cis)
            assert fresh_options(gi, cis) == (() if layout is None else tuple(
                (pl, ((1 << pl.size) - 1) << pl.start, 1000 * (1 + len(cis)), layout) for pl in gi.placements))
    for seq in first_fit(model):
        profiles = [model.by_id[p] for p in seq]
        assert _fits(model, tuple(sorted(seq))) == (_refusal(model, profiles, "x") is None)
        refused = sum(p.slices for p in profiles) > model.compute_slices or any(
            profiles.count(p) > p.instance_count for p in profiles) or media_conflict(profiles) is not None
        assert _fits(model, tuple(sorted(seq))) is not refused, seq


def test_a_refusal_names_the_request_as_written() -> None:
    """The verdict is kept per profile multiset; the message still names the request in its order."""
    model = MODELS["A100-SXM4-80GB"]
    seven, one = model.profile_by_role("7g"), model.profile_by_role("1g")
    assert seven is not None and one is not None
    for order, name in (((one, seven), "1g.10gb+7g.80gb"), ((seven, one), "7g.80gb+1g.10gb")):
        want = DesiredLayout(mig=True, instances=tuple(DesiredInstance(gi=p, cis=(p.default_ci,)) for p in order))
        forget()
        with pytest.raises(PlanError, match=rf"^{re.escape(name)} needs 9 memory slices, A100-SXM4-80GB has 8$"):
            plan_gpu(fake_gpu(model), want, [])
