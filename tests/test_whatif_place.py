"""The queue model starts a job where select/cons_tres's best fit does (migd/whatif/place.py; measured on
real Slurm in tests/test_slurm_placement.py): in the tightest set of consecutive usable nodes, on the
node with the fewest CPUs free, not on the first node that fits.  Where jobs go decides which node
empties first, so it decides what a layout change costs."""

from __future__ import annotations

from migd.demand.inputs import Layout
from migd.whatif.backfill import backfill, will_run
from migd.whatif.jobs import TraceJob
from migd.whatif.place import best_nodes
from migd.whatif.replay import Cluster, Job, Node

DAY = Layout.of("day", {"1g.10gb": 7})
NIGHT = Layout.of("night", {"7g.80gb": 1})


def node(name: str, layout: Layout, jobs: int = 0) -> Node:
    n = Node(name, layout, 7)
    n.running = [Job(TraceJob(0, "a", "main", "1g.10gb", 1, 600, 1200), start=0, nodes=(name,)) for _ in range(jobs)]
    return n


def fits_1g(nodes: list[Node]) -> set[str]:
    return {n.name for n in nodes if n.free("1g.10gb") >= 1}


def test_the_busiest_node_of_a_set_is_taken_not_the_first() -> None:
    nodes = [node("gpu1", DAY), node("gpu2", DAY, jobs=2), node("gpu3", DAY, jobs=1)]
    assert best_nodes(nodes, fits_1g(nodes), 1) == [nodes[1]]


def test_the_tightest_set_is_taken_before_the_busiest_node() -> None:
    """gpu3 cannot run a 1g job, so the sets are gpu1-gpu2 and gpu4: gpu4 alone has fewer CPUs free
    than the pair, though gpu2 is the busiest node."""
    nodes = [node("gpu1", DAY), node("gpu2", DAY, jobs=1), node("gpu3", NIGHT), node("gpu4", DAY)]
    assert best_nodes(nodes, fits_1g(nodes), 1) == [nodes[3]]


def test_of_equal_nodes_the_first_and_none_where_nothing_fits() -> None:
    nodes = [node("gpu1", DAY, jobs=1), node("gpu2", DAY, jobs=1)]
    assert best_nodes(nodes, fits_1g(nodes), 1) == [nodes[0]]
    assert best_nodes([node("gpu1", NIGHT)], fits_1g([node("gpu1", NIGHT)]), 1) is None


def test_the_replay_starts_a_job_on_the_busier_node_with_and_without_reservations() -> None:
    for reserve in (False, True):
        quiet, busy = node("gpu1", DAY), node("gpu2", DAY, jobs=3)
        c = Cluster([quiet, busy], {}, reserve=reserve)
        j = Job(TraceJob(5, "a", "main", "1g.10gb", 1, 60, 120))
        c.pending["1g.10gb"].append(j)
        if reserve:
            backfill(c.nodes, c.pending, 10, 0.0)
        else:
            c.step(10, 30)
        assert (j.start, j.node) == (10, "gpu2"), reserve


def test_a_backfill_estimate_places_the_job_by_the_nodes_load_then() -> None:
    """Both nodes' 1g instances are taken until 600 s; by then gpu2 still runs a longer 2g job, so the job
    is expected to start on gpu2, the busier then, not on gpu1, the first."""
    gpu1, gpu2 = Node("gpu1", DAY, 7), Node("gpu2", Layout.of("two", {"1g.10gb": 1, "2g.20gb": 1}), 7)
    gpu1.running = [Job(TraceJob(0, "a", "main", "1g.10gb", 7, 600, 600), start=0, nodes=("gpu1",))]
    gpu2.running = [Job(TraceJob(0, "a", "main", "1g.10gb", 1, 600, 600), start=0, nodes=("gpu2",)),
                    Job(TraceJob(0, "a", "main", "2g.20gb", 1, 5000, 5000), start=0, nodes=("gpu2",))]
    got = will_run([gpu1, gpu2], [gpu1, gpu2], "1g.10gb", 1, 10, 0.0)
    assert got is not None and (got[0], got[1][0].name) == (600, "gpu2")


def test_a_backfill_estimate_counts_only_the_jobs_still_running_then() -> None:
    """gpu1 runs three jobs that all end by 600 s, gpu2 two of which one runs on to 5000 s: now gpu1 is
    the busier, but at 600 s, when a 1g instance frees on each, gpu2 is (one job against none)."""
    gpu1 = Node("gpu1", Layout.of("x", {"1g.10gb": 1, "2g.20gb": 2}), 7)
    gpu2 = Node("gpu2", Layout.of("y", {"1g.10gb": 1, "2g.20gb": 1}), 7)
    gpu1.running = [Job(TraceJob(0, "a", "main", t, 1, 600, 600), start=0, nodes=("gpu1",))
                    for t in ("1g.10gb", "2g.20gb", "2g.20gb")]
    gpu2.running = [Job(TraceJob(0, "a", "main", "1g.10gb", 1, 600, 600), start=0, nodes=("gpu2",)),
                    Job(TraceJob(0, "a", "main", "2g.20gb", 1, 5000, 5000), start=0, nodes=("gpu2",))]
    got = will_run([gpu1, gpu2], [gpu1, gpu2], "1g.10gb", 1, 10, 0.0)
    assert got is not None and (got[0], got[1][0].name) == (600, "gpu2")


def test_a_job_over_two_nodes_takes_the_first_two_of_the_tightest_set_that_has_two() -> None:
    """gpu5 alone is the tightest set but one node; of gpu1-gpu3 the first two, not gpu3, the busiest
    (``_eval_nodes`` seeks the busiest node only while one is wanted).  Measured on real Slurm:
    tests/test_slurm_placement.py."""
    nodes = [node("gpu1", DAY), node("gpu2", DAY), node("gpu3", DAY, jobs=1), node("gpu4", NIGHT),
             node("gpu5", DAY, jobs=1)]
    assert best_nodes(nodes, fits_1g(nodes), 2) == nodes[:2]


def test_where_no_set_has_enough_nodes_the_roomiest_set_goes_first_then_the_tightest() -> None:
    """Three nodes wanted and no set of three: gpu1-gpu2 (the most CPUs free) whole, then for the last
    node the tightest of the sets left, gpu6 (busier than gpu4), as for a one-node job."""
    nodes = [node("gpu1", DAY, jobs=1), node("gpu2", DAY), node("gpu3", NIGHT), node("gpu4", DAY),
             node("gpu5", NIGHT), node("gpu6", DAY, jobs=2)]
    assert best_nodes(nodes, fits_1g(nodes), 3) == [nodes[0], nodes[1], nodes[5]]
    assert best_nodes(nodes, fits_1g(nodes), 5) is None  # four nodes can run it: it waits


def test_a_job_over_two_nodes_starts_on_both_at_once_or_not_at_all() -> None:
    """gpu1 has a 1g free from the start, gpu2 only when its job ends at 600: a job asking one 1g on each
    of two nodes waits until then and starts on both, where one-node jobs would have started one half
    at once.  It ends on both as one job: counted once among the replay's jobs."""
    for reserve in (False, True):
        c = Cluster([node("gpu1", Layout.of("two", {"1g.10gb": 2}), jobs=1), node("gpu2", Layout.of("one", {
            "1g.10gb": 1}))], {}, reserve=reserve)
        c.nodes[1].running = [Job(TraceJob(0, "a", "main", "1g.10gb", 1, 600, 600), start=0, nodes=("gpu2",))]
        wide = Job(TraceJob(10, "a", "main", "1g.10gb", 1, 100, 200, job="7", nodes=2))
        c.pending["1g.10gb"].append(wide)
        for t in range(0, 900, 30):
            c.step(float(t), 30.0)
            assert wide.start is None or wide.start == 600, reserve
        assert (wide.start, wide.node, [wide in n.running for n in c.nodes]) == (600, "gpu1", [False, False])
        assert [j for j in c.jobs() if j is wide] == [wide] and c.done.count(wide) == 1


def test_a_set_short_of_nodes_with_more_cpus_free_displaces_one_that_has_enough_as_slurm_tests_it() -> None:
    """``_eval_nodes``'s test (Slurm 22.05) lets a set without enough nodes but with more CPUs free replace
    the one kept so far, though that one had enough: three wanted, gpu1-gpu3 (busy) has three, gpu5-gpu6
    (idle) two; Slurm takes gpu5 and gpu6, then the busiest of gpu1-gpu3, not gpu1-gpu3 whole."""
    nodes = [node("gpu1", DAY, 55), node("gpu2", DAY, 55), node("gpu3", DAY, 40), node("gpu4", NIGHT),
             node("gpu5", DAY), node("gpu6", DAY)]
    for n in nodes[:3]:
        n.layout = Layout.of("wide", {"1g.10gb": 70})  # (room for the jobs and one more)
    assert best_nodes(nodes, fits_1g(nodes), 3) == [nodes[4], nodes[5], nodes[0]]
