"""The demand rule (migd/demand/rule.py, docs/demand.md) on hand-made snapshots: what it changes,
what it leaves, and why; the same snapshot always gives the same decision."""

from __future__ import annotations

import random

from migd.catalog.models import MODELS
from migd.demand.capacity import node_layout
from migd.demand.fair import fair_weights
from migd.demand.model import Layout, NodeView, Pending, Running, Snapshot, slices_of
from migd.demand.rule import Params, decide
from migd.profiles.loader import load_profile
from tests.helpers import PROFILES

H100x8 = [MODELS["H100-SXM5-80GB"]] * 8
LAYOUTS = {n: node_layout(load_profile(PROFILES / f"{n}.yaml"), H100x8) for n in ("day", "night", "night-two")}
OLD = 6 * 3600.0  # submitted long ago: no forecast from it


def nodes(k: int, layout: str = "night", **kw: object) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"gpu{i}", layout, 10 * 3600.0, **kw) for i in range(k))  # type: ignore[arg-type]


def notebooks(n: int, account: str = "teaching", age_s: float = OLD) -> tuple[Pending, ...]:
    return tuple(Pending(f"nb{i}", account, "1g.10gb", 1, 2 * 3600.0, age_s=age_s) for i in range(n))


def test_profiles_resolve_to_the_gres_types_slurm_sees() -> None:
    assert LAYOUTS["day"] == Layout.of("day", {"1g.10gb": 56})
    assert LAYOUTS["night"] == Layout.of("night", {"7g.80gb": 8})
    assert LAYOUTS["night-two"].slices == 48 and slices_of("1g.10gb+me") == 1


def test_notebooks_pending_at_night_switch_as_many_nodes_as_they_need() -> None:
    """60 notebooks of 2 h: 120 slice-hours of work; one day node offers 448 within the 8 h horizon."""
    d = decide(Snapshot(notebooks(60), nodes(4)), LAYOUTS)
    assert [(c.node, c.new) for c in d.changes] == [("gpu0", "day")]
    assert "gains 120.0 slice-hours" in d.changes[0].reason
    d = decide(Snapshot(notebooks(300), nodes(4)), LAYOUTS)  # 600 slice-hours: two nodes
    assert [c.new for c in d.changes] == ["day", "day"]


def test_nothing_pending_changes_nothing() -> None:
    d = decide(Snapshot((), nodes(4)), LAYOUTS)
    assert d.changes == () and d.demand == ()


def test_an_idle_node_switches_before_a_busy_one() -> None:
    """Draining a node idles its slices until its jobs end: the empty node costs the switch alone."""
    busy = NodeView("gpu0", "night", OLD, (Running("t1", "7g.80gb", 1, ends_in_s=3 * 3600),))
    idle = NodeView("gpu9", "night", OLD)
    d = decide(Snapshot(notebooks(60), (busy, idle)), LAYOUTS)
    assert [c.node for c in d.changes] == ["gpu9"]
    assert d.changes[0].cost_slice_h < 3  # 56 slices for the 3-minute switch


def test_a_drain_that_costs_more_than_it_gains_is_not_made() -> None:
    """A node whose 7g job runs 6 more hours: draining idles 49 slices for 6 h (294 slice-hours) for
    a few notebooks' 20 slice-hours: not worth it."""
    busy = NodeView("gpu0", "night", OLD, (Running("t1", "7g.80gb", 1, ends_in_s=6 * 3600),))
    assert decide(Snapshot(notebooks(10), (busy,)), LAYOUTS).changes == ()


def test_hysteresis_holds_a_node_that_just_switched_and_says_why() -> None:
    fresh = NodeView("gpu0", "night", in_layout_s=600.0)
    d = decide(Snapshot(notebooks(60), (fresh,)), LAYOUTS)
    held = dict(d.held)["gpu0"]
    assert d.changes == () and "held: in night for 10 min of the 60 min minimum; earliest change in 50 min" in held
    tired = NodeView("gpu0", "night", OLD, changes_today=4)
    assert "max_changes_per_day is 4" in dict(decide(Snapshot(notebooks(60), (tired,)), LAYOUTS).held)["gpu0"]


def test_alternating_demand_does_not_make_nodes_flap() -> None:
    """Every 10 minutes the queue flips between notebooks and training: with the dwell a node changes at
    most once an hour, whatever the queue does."""
    state = {f"gpu{i}": ("night", 10 * 3600.0) for i in range(4)}
    changes = 0
    for step in range(36):  # six hours
        if step % 2:
            pending = notebooks(120)
        else:
            pending = tuple(Pending(f"t{i}", "nlp", "7g.80gb", 2, 4 * 3600.0, age_s=OLD) for i in range(8))
        snap = Snapshot(pending, tuple(NodeView(n, lay, since) for n, (lay, since) in sorted(state.items())))
        d = decide(snap, LAYOUTS)
        state = {n: (lay, since + 600) for n, (lay, since) in state.items()}
        for c in d.changes:
            state[c.node] = (c.new, 0.0)
            changes += 1
    assert changes <= 4 * 6  # (at most once per node per hour)
    assert changes >= 1  # and it does follow demand


def test_the_maintenance_limit_holds_changes_back() -> None:
    draining = NodeView("gpu0", "day", OLD, draining=True)
    d = decide(Snapshot(notebooks(400), (draining, *nodes(3)[1:])), LAYOUTS, Params(max_in_maintenance=1))
    assert d.changes == () and "max_in_maintenance is 1" in dict(d.held)["gpu1"]


def test_one_departments_long_queue_does_not_starve_another() -> None:
    """teaching queues 1,000 notebooks; vision has four 3g jobs.  Without fairness both nodes would
    take teaching's layout; the worst-served account is lifted first."""
    pending = notebooks(1000) + tuple(Pending(f"v{i}", "vision", "3g.40gb", 2, 6 * 3600.0, age_s=OLD)
                                      for i in range(4))
    d = decide(Snapshot(pending, nodes(2)), LAYOUTS)
    assert sorted(c.new for c in d.changes) == ["day", "night-two"], d.changes
    assert fair_weights({"a": 2000.0, "b": 144.0}, 896.0) == {"a": 0.376, "b": 1.0}


def test_the_same_snapshot_gives_the_same_decision() -> None:
    rng = random.Random(3)
    pending = list(notebooks(1000) + tuple(Pending(f"t{i}", "nlp", "7g.80gb", 2, 5 * 3600.0, age_s=OLD)
                                          for i in range(6)))
    fleet = list(nodes(8)) + list(nodes(1, "day"))
    fleet = [NodeView(f"n{k:02d}", n.layout, n.in_layout_s) for k, n in enumerate(fleet)]
    first = decide(Snapshot(tuple(pending), tuple(fleet)), LAYOUTS)
    for _ in range(5):
        rng.shuffle(pending)
        rng.shuffle(fleet)
        assert decide(Snapshot(tuple(pending), tuple(fleet)), LAYOUTS) == first
    assert first.changes


def test_recent_arrivals_are_expected_to_go_on() -> None:
    """Ten notebooks submitted in the last hour count as ten more an hour for the lookahead: a layout
    is chosen for the morning's flow, not only for the queue of this minute."""
    calm = decide(Snapshot(notebooks(10), nodes(1)), LAYOUTS)
    flowing = decide(Snapshot(notebooks(10, age_s=600), nodes(1)), LAYOUTS)
    assert calm.changes == () or calm.changes[0].benefit_slice_h < flowing.changes[0].benefit_slice_h
    assert dict(flowing.demand)["1g.10gb"] == 10 * 2 * (1 + 4)
