"""The demand rule (migd/demand/rule.py, docs/demand.md "With jobs over two nodes") with jobs over several
nodes: Slurm starts such a job on all its nodes at once, so its type needs as many places as its first
job spans, and a further place is given as a place only while the types it slows have no older job
and would not then expect to wait longer than it."""

from __future__ import annotations

from dataclasses import replace

from migd.demand.inputs import NodeView, Pending, Running, Snapshot
from migd.demand.rule import Params, decide
from tests.test_demand_rule import LAYOUTS, OLD, nodes, notebooks


def test_a_job_over_two_nodes_gets_a_second_place_where_its_type_has_one() -> None:
    """A 3g job over two nodes while one node offers 3g: Slurm starts it on both at once, so with one
    place it never starts, and a second node is given a place (for a one-node job the one place is
    enough).  A job over more nodes than can ever offer its share gets none: no change lets it start."""
    wide = Pending("w", "vision", "3g.40gb", 1, 2 * 3600.0, age_s=OLD, nodes=2)
    fleet = (NodeView("gpu0", "night-two", 10 * 3600.0), *nodes(3)[1:])
    d = decide(Snapshot((wide,), fleet), LAYOUTS)
    assert [(c.node, c.new, c.places) for c in d.changes] == [("gpu1", "night-two", ("3g.40gb",))]
    assert d.changes[0].reason.endswith("; gives 3g.40gb a place to run (3g.40gb: its jobs span 2 nodes, so it "
                                        "needs 2 places)")
    assert decide(Snapshot((replace(wide, nodes=1),), fleet), LAYOUTS).changes == ()
    nights = nodes(2)  # (no place for 3g at all: a job over three of two nodes still gets none)
    assert decide(Snapshot((replace(wide, nodes=3),), nights), LAYOUTS).changes == ()
    assert [c.new for c in decide(Snapshot((wide,), nights), LAYOUTS).changes] == ["night-two"] * 2  # (both)


def test_no_place_is_taken_from_a_type_that_needs_it_to_give_a_job_over_two_nodes_its_second() -> None:
    """gpu0 offers 3g, gpu1 7g, and both types wait, one 3g job over two nodes: gpu1 to night-two would
    give 3g its second place and take 7g's last, and the next pass would give 7g gpu0 (both nodes
    drained, layouts swapped, 3g still one place short).  No change is made."""
    wide = Pending("w", "vision", "3g.40gb", 1, 2 * 3600.0, age_s=OLD, nodes=2)
    big = tuple(Pending(f"b{i}", "llm", "7g.80gb", 1, 2 * 3600.0, age_s=OLD) for i in range(8))
    fleet = (NodeView("gpu0", "night-two", 10 * 3600.0), NodeView("gpu1", "night", 10 * 3600.0))
    assert decide(Snapshot((wide, *big), fleet), LAYOUTS).changes == ()


def test_the_places_a_type_needs_are_its_first_jobs_not_its_least_spread() -> None:
    """A 3g job over two nodes, older than a one-node 3g job, while one node offers 3g: Slurm reserves for
    the older first, so the type needs two places (by its least spread job it needed one, and the
    two-node job waited as long as one-node jobs of its type kept coming); the one-node job older, one."""
    wide = Pending("w", "vision", "3g.40gb", 1, 2 * 3600.0, age_s=OLD, nodes=2)
    one = Pending("o", "vision", "3g.40gb", 1, 2 * 3600.0, age_s=OLD / 2)
    fleet = (NodeView("gpu0", "night-two", 10 * 3600.0), *nodes(3)[1:])
    assert [c.new for c in decide(Snapshot((wide, one), fleet), LAYOUTS).changes] == ["night-two"]
    assert decide(Snapshot((wide, replace(one, age_s=2 * OLD)), fleet), LAYOUTS).changes == ()


def test_a_job_over_two_nodes_younger_than_the_jobs_it_would_slow_gets_its_second_place_only_when_it_pays() -> None:
    """A 7g job over two nodes with one night node, and notebooks queued on two day nodes: giving it a
    day node takes a place's worth of 1g from older jobs.  Younger than them, it is not given that node
    as a place (weighed as any change, it gains nothing: slice-hours count its work, which the night
    node could run, and the notebooks would wait longer); older than every notebook, but with the
    notebooks then expecting to wait longer than it (12 hours old, 200 of them), it is not either; once
    it has waited longer than they would (24 hours), it is, as Slurm would hold nodes for it; alone, it
    is at once."""
    fleet = (NodeView("gpu0", "night", 10 * 3600.0), *nodes(3, "day")[1:])
    queue = notebooks(200, age_s=OLD)
    young = Pending("w", "llm", "7g.80gb", 1, 4 * 3600.0, age_s=OLD / 2, nodes=2)
    assert decide(Snapshot((young, *queue), fleet), LAYOUTS).changes == ()
    assert decide(Snapshot((replace(young, age_s=2 * OLD), *queue), fleet), LAYOUTS).changes == ()
    d = decide(Snapshot((replace(young, age_s=4 * OLD), *queue), fleet), LAYOUTS)
    assert [(c.node, c.new, c.places) for c in d.changes] == [("gpu1", "night", ("7g.80gb",))]
    assert decide(Snapshot((young,), fleet), LAYOUTS).changes[0].places == ("7g.80gb",)  # (nothing it would slow)


def test_a_lone_job_over_two_nodes_leaves_the_notebooks_coming_their_day_node() -> None:
    """The one job waiting is a 7g job over two nodes, and 80 notebooks started in the last ten minutes
    on two day nodes (more are expected: the forecast): giving it a day node would have the notebooks
    expect to wait longer than it, so it is not given as a place (at 09:44 on the bench's 4-node trace
    such a job took one of the day's two 2g nodes, and 2g's p95 was 11 hours).  With 10 notebooks the
    node it takes leaves them expecting to wait less than it, and it is."""
    def fleet(recent: int) -> tuple[NodeView, ...]:
        busy = tuple(Running(f"r{i}", "1g.10gb", 1, 3600.0, "teaching", 600.0, 2 * 3600.0) for i in range(recent))
        return (NodeView("gpu0", "night", 10 * 3600.0), NodeView("gpu1", "day", 10 * 3600.0, running=busy),
                NodeView("gpu2", "day", 10 * 3600.0, running=busy))
    wide = Pending("w", "llm", "7g.80gb", 1, 4 * 3600.0, age_s=600.0, nodes=2)
    assert decide(Snapshot((wide,), fleet(40)), LAYOUTS).changes == ()
    assert [(c.node, c.new, c.places) for c in decide(Snapshot((wide,), fleet(5)), LAYOUTS).changes] == [
        ("gpu1", "night", ("7g.80gb",))]


def test_a_second_place_not_yet_due_does_not_rank_before_another_types_first() -> None:
    """A 7g job over two nodes not yet due its second place (notebooks older than it wait) and a 3g job
    with no place at all, one node free to change: the 3g job's first place is given.  Ranked by the
    places lacked after each change, the 7g node's change had counted its second place as given, and
    taken the one node."""
    fleet = (NodeView("gpu0", "night", 10 * 3600.0), *nodes(4, "day")[1:])
    wide = Pending("w", "llm", "7g.80gb", 1, 4 * 3600.0, priority=10, age_s=OLD / 2, nodes=2)
    big = tuple(Pending(f"b{i}", "llm", "7g.80gb", 1, 4 * 3600.0, age_s=OLD / 2) for i in range(20))
    vision = Pending("v", "vision", "3g.40gb", 1, 4 * 3600.0, age_s=OLD / 2)
    d = decide(Snapshot((wide, *big, vision, *notebooks(20)), fleet), LAYOUTS, Params(max_in_maintenance=1))
    assert [(c.node, c.new, c.places) for c in d.changes] == [("gpu1", "night-two", ("3g.40gb",))]


def test_a_second_place_is_due_when_the_change_slows_no_type_with_an_older_job() -> None:
    """Notebooks older than the 7g job over two nodes wait, but on a day node the change leaves alone:
    giving it gpu1 (night-two, nobody's place) slows none of them, so the place is given."""
    fleet = (NodeView("gpu0", "night", 10 * 3600.0), NodeView("gpu1", "night-two", 10 * 3600.0),
             NodeView("gpu2", "day", 10 * 3600.0))
    wide = Pending("w", "llm", "7g.80gb", 1, 4 * 3600.0, age_s=OLD / 2, nodes=2)
    d = decide(Snapshot((wide, *notebooks(20)), fleet), LAYOUTS)
    assert [(c.node, c.new, c.places) for c in d.changes] == [("gpu1", "night", ("7g.80gb",))]
