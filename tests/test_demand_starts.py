"""The replay of the jobs waiting now (migd/demand/starts.py): when each would start, with and without
a change, as the rule's last check before a change is made."""

from __future__ import annotations

from migd.demand.inputs import Layout, NodeView, Pending, Running, Shapes
from migd.demand.starts import Starts, slots, total_wait_s
from migd.demand.supply import Horizon

H = Horizon(8 * 3600.0, 180.0, {"nlp": 0.5})
DAY = Layout.of("day", {"1g.10gb": 4})
NIGHT = Layout.of("night", {"7g.80gb": 2})
SHAPES = Shapes({"day": DAY, "night": NIGHT})


def job(name: str, mig_type: str = "1g.10gb", count: int = 1, hours: float = 1.0, age_h: float = 0.0,
        account: str = "teaching") -> Pending:
    return Pending(name, account, mig_type, count, hours * 3600, age_s=age_h * 3600)


def test_instances_are_free_as_their_running_jobs_end_and_a_changing_node_when_it_is_ready() -> None:
    busy = NodeView("n0", "day", 3600.0, (Running("r1", "1g.10gb", 2, 1800.0, "teaching", limit_s=3600.0),))
    assert slots(busy, DAY, H, changing=False) == {"1g.10gb": [0.0, 0.0, 1800.0, 1800.0]}
    # (nlp's jobs run half their limits: a job of a 4-hour limit 1 hour in ends in about an hour)
    learned = NodeView("n1", "night", 3600.0, (Running("r2", "7g.80gb", 1, 3 * 3600.0, "nlp", limit_s=4 * 3600.0),))
    assert slots(learned, NIGHT, H, changing=False) == {"7g.80gb": [0.0, 3600.0]}
    assert slots(learned, DAY, H, changing=True) == {"1g.10gb": [3780.0] * 4}


def test_jobs_start_in_order_where_their_instances_are_free_soonest() -> None:
    fleet = [{"1g.10gb": [0.0, 600.0]}, {"1g.10gb": [300.0, 300.0]}]
    # a: 0 on node 0; b: 300 on node 1 (two free at once there); c: 600 on node 0; late: past the horizon
    waits = total_wait_s(fleet, [job("a", hours=9), job("b", count=2, age_h=1), job("c", age_h=0.5)], H)
    assert waits == 0.0 + (3600 + 300) + (1800 + 600)
    assert fleet == [{"1g.10gb": [0.0, 600.0]}, {"1g.10gb": [300.0, 300.0]}]  # (not changed)
    assert total_wait_s(fleet, [job("big", count=3)], H) == H.horizon_s  # no node has three: never within it


def test_a_change_is_weighed_on_the_fleet_as_the_pass_leaves_it() -> None:
    """Two idle night nodes, four notebooks and a 7g job waiting: either node changing to day starts the
    notebooks in 3 minutes; once one has been taken, the second changing too would leave the 7g job
    no instance within the horizon."""
    nodes = [NodeView("n0", "night", 3600.0), NodeView("n1", "night", 3600.0)]
    starts = Starts(nodes, [job(f"nb{i}", age_h=1) for i in range(4)] + [job("t", "7g.80gb", age_h=1)], SHAPES, H)
    assert starts.waits_s() == (4 * (3600 + H.horizon_s) + 3600) / 5
    assert starts.waits_s("n0", "day") == (4 * (3600 + 180) + 3600) / 5
    starts.take("n0", "day")
    assert starts.waits_s() == (4 * (3600 + 180) + 3600) / 5
    assert starts.waits_s("n1", "day") == (4 * (3600 + 180) + 3600 + H.horizon_s) / 5
    assert Starts(nodes, [], SHAPES, H).waits_s("n0", "day") == 0.0


def test_an_unlimited_job_holds_its_instance_whatever_its_account_learned() -> None:
    """An account whose jobs all ended at once has learned a share of 0; its job without a time limit
    still holds its instance for good (not for a run time of infinity x 0, which is no number)."""
    h = Horizon(8 * 3600.0, 180.0, {"x": 0.0})
    unlimited = Pending("u", "x", "1g.10gb", 1, float("inf"))
    waits = total_wait_s([{"1g.10gb": [0.0, 100.0]}], [unlimited, job("a"), job("b")], h)
    assert waits == 0.0 + 100 + 3700  # (u at once for good; a at 100; b when a ends)


def test_a_job_over_two_nodes_starts_on_two_at_once_each_share_waiting_for_its_own_node() -> None:
    """Node 0 has both its 1g free now, node 1 its one at 300 s: a job asking one on each of two nodes
    starts on both at 300 s (its shares stacked on node 0 started it at once), its shares' waits 0 and
    300; the next one-node job then has node 0's other instance at once.  With one node able it starts
    within no horizon, each share without a node waiting the whole of it."""
    fleet = [{"1g.10gb": [0.0, 0.0]}, {"1g.10gb": [300.0]}]
    wide = Pending("w", "teaching", "1g.10gb", 1, 3600.0, nodes=2)
    assert total_wait_s(fleet, [wide], H) == 0.0 + 300.0
    assert total_wait_s(fleet, [wide, job("next", age_h=1)], H) == 300.0 + 3600.0 + 0.0
    assert total_wait_s(fleet, [wide, job("n1"), job("n2")], H) == 300.0 + 0.0 + 3600.0  # (n1 took node 0's)
    alone = [{"1g.10gb": [0.0, 0.0]}, {"7g.80gb": [0.0]}]
    assert total_wait_s(alone, [wide], H) == 0.0 + H.horizon_s
    assert total_wait_s(alone, [wide, job("n1"), job("n2")], H) == H.horizon_s + 0.0 + 0.0  # (it holds nothing)


def test_a_job_over_n_nodes_weighs_as_n_shares_in_the_mean() -> None:
    """The mean is over shares: a two-node job and a one-node job are three."""
    idle = (NodeView("n0", "day", 3600.0), NodeView("n1", "day", 3600.0))
    s = Starts(idle, [Pending("w", "teaching", "1g.10gb", 1, 3600.0, age_s=600.0, nodes=2), job("one", age_h=0.5)],
               SHAPES, H)
    assert s.waits_s() == (600.0 * 2 + 1800.0) / 3
