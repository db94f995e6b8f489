"""The demand rule (migd/demand/rule.py, docs/demand.md) on hand-made snapshots: what it changes,
what it leaves, and why; the same snapshot always gives the same decision."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from migd.catalog.models import MODELS
from migd.config.migdyaml import load_config
from migd.demand.capacity import node_layout
from migd.demand.fair import fair_weights
from migd.demand.inputs import Layout, NodeView, Pending, Running, Seen, Snapshot, slices_of
from migd.demand.mix import Candidates
from migd.demand.rule import Params, decide
from migd.demand.seen import LastSeen
from migd.errors import ValidationError
from migd.profiles.loader import load_profile
from tests.helpers import PROFILES

H100x8 = [MODELS["H100-SXM5-80GB"]] * 8
NAMES = ("day", "night", "night-two", "balanced")
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


def test_forecast_work_weighs_a_change_but_starts_none() -> None:
    """Nothing pending at night; the last hour's eight 7g jobs started on gpu0 and are carried forward
    for four hours (280 slice-hours of forecast 7g work).  Draining the idle day node for it would
    start no job that waits: it stays.  With one 7g job pending as well (gpu0 is full), the same
    forecast weighs the change that gives 7g more, and it is made."""
    started = NodeView("gpu0", "night", OLD, tuple(Running(f"r{g}", "7g.80gb", 1, 7 * 3600, "nlp", 600.0,
                                                           8 * 3600) for g in range(8)))
    idle = NodeView("gpu1", "day", OLD)
    quiet = decide(Snapshot((), (started, idle)), LAYOUTS)
    assert quiet.changes == () and dict(quiet.demand)["7g.80gb"] > 100
    waiting = decide(Snapshot((Pending("t1", "nlp", "7g.80gb", 1, 8 * 3600, age_s=600.0),), (started, idle)), LAYOUTS)
    assert [(c.node, c.new) for c in waiting.changes] == [("gpu1", "night")]


MIXES = Candidates.resolve({n: load_profile(PROFILES / f"{n}.yaml") for n in NAMES}, NAMES, H100x8).layouts()


def training(n: int, busy_h: float = 2.0, k: int = 5) -> tuple[tuple[NodeView, ...], tuple[Pending, ...]]:
    """``k`` night nodes whose eight 7g jobs end in ``busy_h`` hours (node i: ``busy_h + i``), and 40 7g jobs
    queued behind them, as on a training-heavy partition."""
    fleet = tuple(NodeView(f"gpu{i}", "night", OLD, tuple(Running(f"r{i}{g}", "7g.80gb", 1, (busy_h + i) * 3600, "nlp",
                                                                  OLD, 10 * 3600) for g in range(8)))
                  for i in range(k))
    return fleet, tuple(Pending(f"t{i}", "nlp", "7g.80gb", 1, 8 * 3600, age_s=OLD) for i in range(n))


def minority(age_s: float = OLD) -> tuple[Pending, ...]:
    return tuple(Pending(f"s{i}", "serving", "2g.20gb", 1, 2 * 3600, age_s=age_s) for i in range(3)) + \
        tuple(Pending(f"v{i}", "vision", "3g.40gb", 1, 3 * 3600, age_s=age_s) for i in range(2))


def test_a_minority_type_gets_a_place_carved_from_one_gpu_of_the_soonest_free_node() -> None:
    """Three 2g and two 3g jobs behind a 7g queue that would fill every GPU: carving a place never pays in
    slice-hours, yet without one they wait for ever.  Where nothing reserves whole nodes (the bench's
    plain model), the node free soonest keeps seven whole GPUs and carves one; the decision says which
    types it gives a place."""
    fleet, queue = training(40)
    plain = Params(reserves=False)
    d = decide(Snapshot(queue + minority(), fleet), MIXES, plain)
    assert [(c.node, c.new) for c in d.changes] == [("gpu0", "night*7/balanced")]
    assert d.changes[0].reason.endswith("gives 2g.20gb, 3g.40gb a place to run")
    assert decide(Snapshot(queue, fleet), MIXES, plain).changes == ()  # no minority waiting: nothing carved


def test_under_slurms_reservations_a_place_behind_an_older_queue_is_a_whole_node() -> None:
    """Slurm reserves a whole node for each older pending job that cannot start (backfill.c
    _add_reservation): a GPU carved on a night node would serve the 2g and 3g jobs only once the forty
    older 7g jobs, which reserve that node too, have run.  So the place is a node of no 7g; and where the
    2g jobs are older than the 7g queue, their reservations come first and GPUs carved on a night node
    serve them (one each: none of them waits to reserve the node)."""
    fleet, queue = training(40)
    behind = decide(Snapshot(queue + minority(OLD - 60), fleet), MIXES)
    assert [(c.node, MIXES[c.new].count("7g.80gb")) for c in behind.changes] == [("gpu0", 0)], behind.changes
    assert behind.changes[0].places == ("2g.20gb", "3g.40gb")
    ahead = decide(Snapshot(queue + minority(OLD + 60)[:3], fleet), MIXES)
    assert [(c.node, c.new, c.places) for c in ahead.changes] == [("gpu0", "night*5/balanced*3", ("2g.20gb",))]


def test_the_last_place_of_a_type_with_pending_work_is_never_taken() -> None:
    """One balanced node serves a queued 2g job; a thousand notebooks want every node as day: the balanced
    node may change only to a layout that still offers 2g."""
    serving = NodeView("gpu9", "balanced", OLD)
    pending = notebooks(1000) + (Pending("s0", "serving", "2g.20gb", 1, 3600, age_s=OLD),)
    d = decide(Snapshot(pending, (*nodes(2), serving)), MIXES)
    after = {n.name: n.layout for n in (*nodes(2), serving)} | {c.node: c.new for c in d.changes}
    assert d.changes and any(MIXES[lay].count("2g.20gb") >= 1 for lay in after.values())


def test_a_type_seen_within_a_day_keeps_its_last_place_between_its_jobs_by_default() -> None:
    """Nothing of 2g is pending this minute, but a 2g job ran two hours ago.  By default (``keep_place_s``
    a day) the one node that can start one keeps a layout that can, though a thousand notebooks would
    fill it, and the change that would take the place is reported held, saying why; a day after the
    last 2g job, or with ``keep_place`` 0 (off), the place goes to the notebooks."""
    fleet = (*nodes(2, "day"), NodeView("gpu9", "night*7/balanced", OLD))
    queue = notebooks(1000)

    def decided(seen_ago_s: float, params: Params) -> tuple[dict[str, str], str]:
        d = decide(Snapshot(queue, fleet, seen=(Seen("2g.20gb", seen_ago_s, 1),)), MIXES, params)
        return {n.name: n.layout for n in fleet} | {c.node: c.new for c in d.changes}, " ".join(w for _, w in d.held)

    kept, held = decided(2 * 3600.0, Params())
    assert any(MIXES[lay].count("2g.20gb") >= 1 for lay in kept.values())
    assert kept["gpu9"] != "night*7/balanced"  # (it still changes: to a layout with the place and more 1g)
    assert "held: it would take the last place of 2g.20gb, seen within 24 h (keep_place)" in held
    for gone, _ in (decided(25 * 3600.0, Params()), decided(2 * 3600.0, Params(keep_place_s=0.0))):
        assert not any(MIXES[lay].count("2g.20gb") >= 1 for lay in gone.values())


def test_a_type_waiting_with_no_place_outranks_the_last_place_of_a_type_only_seen() -> None:
    """One whole node, in night; a 7g job ran an hour ago and none waits; three 2g jobs wait with no place
    to run.  keep_place would keep 7g its place, but a waiting type's place comes first (step 1): the
    node goes to balanced, saying it gives 2g a place, and nothing is held."""
    whole = {n: node_layout(load_profile(PROFILES / f"{n}.yaml"), H100x8) for n in ("day", "night", "balanced")}
    serving = tuple(Pending(f"s{i}", "serving", "2g.20gb", 1, 2 * 3600, age_s=OLD) for i in range(3))
    d = decide(Snapshot(serving, (NodeView("gpu0", "night", OLD),), seen=(Seen("7g.80gb", 3600.0, 1),)), whole)
    assert [(c.node, c.new) for c in d.changes] == [("gpu0", "balanced")] and d.held == ()
    assert d.changes[0].reason.endswith("gives 2g.20gb a place to run")


def test_last_seen_keeps_the_newest_sighting_and_the_fewest_instances() -> None:
    seen = LastSeen()
    seen.observe(100.0, [("2g.20gb", 2), ("7g.80gb", 1), ("2g.20gb", 3)])
    seen.observe(500.0, [("7g.80gb", 4)])
    assert seen.seen(700.0) == (Seen("2g.20gb", 600.0, 2), Seen("7g.80gb", 200.0, 1))
    again = LastSeen()
    again.load(seen.to_json())
    assert again.seen(700.0) == seen.seen(700.0)


def test_a_small_minority_waits_when_its_place_costs_more_than_its_work() -> None:
    """Every node busy for 6 more hours: draining one idles far more than the one 2g job's work."""
    fleet, queue = training(0, busy_h=6.0, k=2)
    d = decide(Snapshot((Pending("s0", "serving", "2g.20gb", 1, 3600, age_s=OLD),), fleet), MIXES)
    assert d.changes == ()


def test_time_limits_are_upper_bounds_learned_per_account() -> None:
    """A 7g job with an 8 h limit, started an hour ago: by its limit the node is busy 7 more hours and a
    drain for 60 notebooks costs more than it gains.  Its account's jobs run a quarter of their limits:
    it ends in about an hour, and the switch pays."""
    busy = NodeView("gpu0", "night", OLD, (Running("t1", "7g.80gb", 1, ends_in_s=7 * 3600, account="nlp",
                                                   limit_s=8 * 3600),))
    assert decide(Snapshot(notebooks(60), (busy,)), LAYOUTS).changes == ()
    d = decide(Snapshot(notebooks(60), (busy,), run_ratio=(("nlp", 0.25),)), LAYOUTS)
    assert [c.new for c in d.changes] == ["day"] and 60 < d.changes[0].ready_in_s / 60 < 65
    short = decide(Snapshot(notebooks(60), nodes(1), run_ratio=(("teaching", 0.5),)), LAYOUTS)
    assert dict(short.demand)["1g.10gb"] == 60 * 1 * 1.0  # each notebook valued at half its 2 h limit


def test_demand_that_turns_around_within_six_hours_is_held() -> None:
    """A node switched night -> day two hours ago; now only training waits: going back is held, saying
    why; seven hours on it is a new turn of demand and the node follows."""
    training_jobs = tuple(Pending(f"t{i}", "nlp", "7g.80gb", 2, 4 * 3600, age_s=OLD) for i in range(8))
    recent = NodeView("gpu0", "day", 2 * 3600.0, left="night")
    d = decide(Snapshot(training_jobs, (recent,)), LAYOUTS)
    assert d.changes == ()
    assert "held: it would undo its change from night 2.0 h ago: demand that turns around within 6 h is held" \
        in dict(d.held)["gpu0"]
    later = NodeView("gpu0", "day", 7 * 3600.0, left="night")
    assert [c.new for c in decide(Snapshot(training_jobs, (later,)), LAYOUTS).changes] == ["night"]


@pytest.mark.parametrize("reserves", [True, False])
def test_mixes_decide_the_same_whatever_the_input_order(reserves: bool) -> None:
    """With Slurm's reservations weighed (jobs ahead of others in Slurm's order: ages tie here, so the job
    id decides) and in the bench's plain model."""
    fleet, queue = training(20)
    pending = list(queue + notebooks(200) + tuple(Pending(f"v{i}", "vision", "3g.40gb", 2, 3 * 3600, age_s=OLD)
                                                  for i in range(6)))
    views = list(fleet) + [NodeView("gpu8", "day", OLD), NodeView("gpu9", "day", OLD)]
    params = Params(reserves=reserves)
    first = decide(Snapshot(tuple(pending), tuple(views)), MIXES, params)
    rng = random.Random(5)
    for _ in range(3):
        rng.shuffle(pending)
        rng.shuffle(views)
        assert decide(Snapshot(tuple(pending), tuple(views)), MIXES, params) == first
    assert first.changes


def test_a_queue_that_has_waited_long_keeps_its_supply_for_newer_larger_work() -> None:
    """Eight 2g jobs have waited 13 hours; the balanced node runs them within the 8 h horizon, so in
    slice-hours alone they are fully served and three of its GPUs would go to three 7g jobs queued two
    hours ago (56 slice-hours more of work run).  By expected wait the 2g queue is the worse off
    (13 h + 2 h to run against 2 h + 12 h): taking its GPUs would lengthen the longest wait, so the node
    keeps them; with the 2g jobs fresh, the 7g work's wait is the longest and the node carves GPUs for
    it (replayed, the 7g jobs start at once instead of in 6 hours, four 2g jobs 2 hours later)."""
    training = NodeView("gpu1", "night", OLD, tuple(Running(f"r{g}", "7g.80gb", 1, 6 * 3600, "nlp", OLD, 10 * 3600)
                                                    for g in range(8)))
    serving = NodeView("gpu0", "balanced", OLD)
    nlp = tuple(Pending(f"t{i}", "nlp", "7g.80gb", 1, 8 * 3600, age_s=2 * 3600) for i in range(3))

    def inference(age_s: float) -> tuple[Pending, ...]:
        return tuple(Pending(f"s{i}", "serving", "2g.20gb", 1, 2 * 3600, age_s=age_s) for i in range(8))
    d = decide(Snapshot(inference(13 * 3600) + nlp, (serving, training)), MIXES)
    assert d.changes == ()
    d = decide(Snapshot(inference(2 * 3600) + nlp, (serving, training)), MIXES)
    assert [c.node for c in d.changes] == ["gpu0"] and MIXES[d.changes[0].new].count("7g.80gb") >= 1
    assert "longest expected wait 14.0 h (7g.80gb) -> " in d.changes[0].reason


def test_the_reversal_window_and_switch_time_are_knobs_of_migd_yaml(tmp_path: Path) -> None:
    """``reversal_window``, ``switch_time`` and ``keep_place`` in ``slurm.demand`` reach the rule: with a
    1-hour window the node that switched two hours ago follows the turn of demand that the default 6 hours
    holds."""
    cfg = tmp_path / "migd.yaml"
    demand = ("schedule:\n  - {profile: night, at: \"00:00\"}\n"
              f"profiles_dir: {PROFILES}\nslurm:\n  node: gpu0\n  partition: gpu\n  demand:\n    mode: on\n"
              "    planner: gpu0\n    candidates: [day, night]\n")
    cfg.write_text(demand + "    reversal_window: 1h\n    switch_time: 10m\n    keep_place: 12h\n")
    settings = load_config(cfg).slurm.demand  # type: ignore[union-attr]
    assert settings is not None and (settings.params.reverse_s, settings.params.switch_s) == (3600.0, 600.0)
    assert settings.params.keep_place_s == 12 * 3600.0
    training_jobs = tuple(Pending(f"t{i}", "nlp", "7g.80gb", 2, 4 * 3600, age_s=OLD) for i in range(8))
    recent = NodeView("gpu0", "day", 2 * 3600.0, left="night")
    assert [c.new for c in decide(Snapshot(training_jobs, (recent,)), LAYOUTS, settings.params).changes] == ["night"]
    cfg.write_text(demand + "    reversal_window: soon\n")
    with pytest.raises(ValidationError, match="reversal_window"):
        load_config(cfg)


def test_a_change_that_pays_in_slice_hours_but_delays_the_waiting_jobs_is_held() -> None:
    """Twenty fresh 2g jobs queue for the balanced node's eight 2g instances, three 7g jobs behind a
    night node busy for 6 more hours.  Carving two GPUs of the balanced node for 7g gains slice-hours
    and shortens the longest expected wait, but replayed two of the 7g jobs would start 6 hours sooner
    while the 2g jobs' waits grow by more (three rounds of 2 hours become four): the jobs waiting now
    would wait longer on average, and the node keeps its layout, saying so."""
    training = NodeView("gpu1", "night", OLD, tuple(Running(f"r{g}", "7g.80gb", 1, 6 * 3600, "nlp", OLD, 10 * 3600)
                                                    for g in range(8)))
    serving = NodeView("gpu0", "balanced", OLD)
    nlp = tuple(Pending(f"t{i}", "nlp", "7g.80gb", 1, 8 * 3600, age_s=2 * 3600) for i in range(3))
    inference = tuple(Pending(f"s{i}", "serving", "2g.20gb", 1, 2 * 3600, age_s=2 * 3600) for i in range(20))
    d = decide(Snapshot(inference + nlp, (serving, training)), MIXES)
    assert d.changes == ()
    why = dict(d.held)["gpu0"]
    assert "longest expected wait 14.0 h (7g.80gb) -> " in why
    assert why.endswith("(replayed); held: the jobs waiting now would not wait less with it"), why
    assert "the jobs waiting now wait 4.2 h on average -> " in why


def test_a_change_need_not_gain_twice_its_cost_when_the_waiting_jobs_start_sooner() -> None:
    """Four 7g jobs wait behind a night node busy for 6 more hours; the day node's twenty notebooks end
    in 2.5 hours, and draining it idles about 93 slice-hours for 112 more of 7g work run.  Replayed, the
    7g jobs start 3.5 hours sooner and nobody else waits: the change is made, though it gains less than
    twice its cost (the margin asked until the replay checked each change, ``gain_ratio: 2``)."""
    training = NodeView("gpu1", "night", OLD, tuple(Running(f"r{g}", "7g.80gb", 1, 6 * 3600, "nlp", OLD, 10 * 3600)
                                                    for g in range(8)))
    notebooks_ending = NodeView("gpu0", "day", OLD, tuple(Running(f"n{i}", "1g.10gb", 1, 2.5 * 3600, "teaching", OLD,
                                                                  4 * 3600) for i in range(20)))
    nlp = tuple(Pending(f"t{i}", "nlp", "7g.80gb", 1, 8 * 3600, age_s=2 * 3600.0) for i in range(4))
    snap = Snapshot(nlp, (notebooks_ending, training))
    d = decide(snap, LAYOUTS)
    assert [(c.node, c.new) for c in d.changes] == [("gpu0", "night")]
    change = d.changes[0]
    assert change.cost_slice_h < change.benefit_slice_h < 2 * change.cost_slice_h, change.reason
    assert "(replayed)" in change.reason
    assert decide(snap, LAYOUTS, Params(gain_ratio=2.0)).changes == ()


def test_a_type_with_no_place_still_takes_the_last_place_of_another_when_no_layout_offers_both() -> None:
    """One night node, 7g jobs pending and notebooks waiting 12 hours: no candidate offers 1g and 7g at
    once on H100s, so giving 1g its first place takes 7g's last; it is made (a type with none would
    otherwise wait as long as the other has work).  Only a type that has a place already does not
    take another's for its next."""
    big = tuple(Pending(f"b{i}", "llm", "7g.80gb", 1, 2 * 3600.0, age_s=OLD) for i in range(8))
    every = {**LAYOUTS, "balanced": node_layout(load_profile(PROFILES / "balanced.yaml"), H100x8)}
    d = decide(Snapshot((*notebooks(60, age_s=12 * 3600.0), *big), nodes(1)), every)
    assert [(c.node, c.new, c.places) for c in d.changes] == [("gpu0", "balanced", ("1g.10gb",))]
