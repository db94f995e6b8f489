"""The queue model's Slurm backfill (Cluster.reserve, migd/whatif/backfill.py) does what Slurm 22.05's
sched/backfill and select/cons_tres were read and measured to do (tests/test_slurm_replay.py, the
slurmctld log of a replay with DebugFlags=Backfill,BackfillMap): a reservation for every pending job,
whole nodes, cons_tres's batched estimate of when a job can start, and the window test that counts a
reservation beginning as the job's limit ends."""

from __future__ import annotations

from dataclasses import replace

from migd.demand.inputs import Layout
from migd.demand.reserve import BF_MAX_JOB_TEST
from migd.whatif.backfill import backfill, overlaps, will_run
from migd.whatif.jobs import TraceJob
from migd.whatif.replay import Cluster, Job, Node

BALANCED = Layout.of("balanced", {"1g.10gb": 2, "2g.20gb": 1})
SMALL = Layout.of("small", {"1g.10gb": 2})


def running(node: Node, gres: str, start: float, limit: float, count: int = 1) -> Job:
    j = Job(TraceJob(start, "a", "main", gres, count, limit / 2, limit), start=start, nodes=(node.name,))
    node.running.append(j)
    return j


def pending(c: Cluster, at: float, gres: str, limit: float, count: int = 1) -> Job:
    j = Job(TraceJob(at, "a", "main", gres, count, limit / 2, limit))
    c.pending[gres].append(j)
    return j


def cluster(*nodes: Node) -> Cluster:
    return Cluster(list(nodes), {}, reserve=True)


def test_every_pending_job_reserves_a_whole_node_so_a_younger_job_of_another_type_waits() -> None:
    """Two 1g jobs wait: the first reserves gpu1 from its 1g's end, the second (gpu1 taken then) gpu2.
    A younger 2g job whose limit reaches into gpu2's reservation does not start on gpu2's free 2g,
    though no 2g job is ahead of it; with one reservation per type (the model before) it started."""
    gpu1, gpu2 = Node("gpu1", SMALL, 7), Node("gpu2", BALANCED, 7)
    for n in (gpu1, gpu2):
        running(n, "1g.10gb", 0, 60)
        running(n, "1g.10gb", 0, 60)
    c = cluster(gpu1, gpu2)
    pending(c, 1, "1g.10gb", 60)
    pending(c, 2, "1g.10gb", 60)
    young = pending(c, 3, "2g.20gb", 60)
    backfill(c.nodes, c.pending, 10, 0.0)
    assert young.start is None
    short = pending(c, 4, "2g.20gb", 30)  # ends before gpu2's reservation (60): backfilled
    backfill(c.nodes, c.pending, 10, 0.0)
    assert (short.start, short.node, young.start) == (10, "gpu2", None)


def test_a_reservation_that_begins_as_the_jobs_limit_ends_still_blocks_it() -> None:
    assert overlaps([(70.0, 130.0)], 10, 70)  # Slurm: begin_time <= end_time
    assert not overlaps([(70.0, 130.0)], 10, 69)
    assert not overlaps([(70.0, 130.0)], 130, 190)


def test_the_estimate_is_the_last_end_of_the_batch_that_frees_the_instances() -> None:
    """cons_tres removes the running jobs by their limits' ends in batches: up to the first end rounded up
    to a 30-s wall-clock boundary, plus 30 s.  The 1g ending at 40 frees what the job needs, but at
    wall-clock phase 0 the batch runs to 90 and takes the one ending at 80 too: expected at 80, not 40.
    At phase 15 the boundary is 45 and the batch stops before 80: expected at 40."""
    gpu1 = Node("gpu1", SMALL, 7)
    running(gpu1, "1g.10gb", -20, 60)  # ends 40
    running(gpu1, "1g.10gb", 20, 60)  # ends 80
    got = will_run([gpu1], [gpu1], "1g.10gb", 1, now=30, epoch_s=0.0)
    assert got is not None and got[0] == 80
    got = will_run([gpu1], [gpu1], "1g.10gb", 1, now=30, epoch_s=15.0)
    assert got is not None and got[0] == 40


def test_a_job_on_a_node_left_out_is_passed_over_and_the_batch_runs_past_it() -> None:
    """Slurm's loop skips a job on a node the pending job cannot use before testing the batch's window,
    so the next usable job joins the batch however late it ends (measured: a 3g job's expected start
    jumped from 122 s to 178 s when the node beside it was drained)."""
    gpu1, gpu2 = Node("gpu1", SMALL, 7), Node("gpu2", SMALL, 7)
    running(gpu1, "1g.10gb", -20, 60)  # ends 40: frees what the job needs
    running(gpu1, "1g.10gb", 100, 60)  # ends 160
    running(gpu2, "1g.10gb", 0, 60)  # ends 60, within the first batch's window
    running(gpu2, "1g.10gb", 0, 60)
    got = will_run([gpu1, gpu2], [gpu1], "1g.10gb", 1, now=30, epoch_s=0.0)
    assert got is not None and (got[0], got[1][0].name) == (160, "gpu1")
    gpu2.running.clear()  # nothing to pass over: the batch stops at its window
    got = will_run([gpu1, gpu2], [gpu1], "1g.10gb", 1, now=30, epoch_s=0.0)
    assert got is not None and got[0] == 40


def test_a_job_no_node_can_ever_hold_gets_no_estimate_and_a_drained_node_is_left_out() -> None:
    gpu1 = Node("gpu1", SMALL, 7)
    assert will_run([gpu1], [gpu1], "2g.20gb", 1, now=0, epoch_s=0.0) is None
    gpu2 = Node("gpu2", BALANCED, 7, target=SMALL)  # draining
    c = cluster(gpu1, gpu2)
    j = pending(c, 0, "2g.20gb", 60)
    backfill(c.nodes, c.pending, 1, 0.0)
    assert j.start is None


def test_a_change_drains_its_node_a_lag_after_it_is_ordered() -> None:
    """On Slurm the planner writes its want and the node's own migd drains on its next pass: with
    ``drain_lag_s`` a job may still start on the node in between, and the wave counts the order."""
    gpu1, gpu2 = Node("gpu1", SMALL, 7), Node("gpu2", SMALL, 7)
    c = Cluster([gpu1, gpu2], {}, reserve=True, drain_lag_s=1.0)
    assert c.order(gpu1, BALANCED, 10)
    assert not c.order(gpu2, BALANCED, 10)  # one in maintenance at a time, the ordered one counted
    j = pending(c, 10, "1g.10gb", 60)
    c.step(10, 1)
    assert (j.node, gpu1.target) == ("gpu1", None)
    c.step(11, 1)
    assert gpu1.target == BALANCED and c.ordered == {}


def _array_fleet() -> tuple[Cluster, Job]:
    """22 nodes, each with a 7g instance busy until 600 s and a 1g instance free; 30 pending 7g tasks
    of array 12, then a younger 1g job whose limit reaches past 600 s (``young``)."""
    mixed = Layout.of("mixed", {"7g.80gb": 1, "1g.10gb": 1})
    nodes = [Node(f"gpu{i:02}", mixed, 14) for i in range(22)]
    for n in nodes:
        running(n, "7g.80gb", 0, 600)
    c = cluster(*nodes)
    for t in range(30):
        j = Job(TraceJob(1 + t, "a", "main", "7g.80gb", 1, 300, 600, f"12_{t}"))
        c.pending["7g.80gb"].append(j)
    young = Job(TraceJob(40, "a", "main", "1g.10gb", 1, 1800, 3600, "13"))
    c.pending["1g.10gb"].append(young)
    return c, young


def test_only_an_arrays_first_twenty_tasks_reserve_a_node() -> None:
    """Slurm's backfill tries a pending array's next task after a reservation only while fewer than
    bf_max_job_array_resv (20) of its tasks reserved in the pass (backfill.c, test_array_count): 20 of
    the 22 nodes are reserved from 600 s, and the younger 1g job starts on one of the two left.  Thirty
    jobs that are no array's tasks reserve every node, and it waits."""
    c, young = _array_fleet()
    backfill(c.nodes, c.pending, 50, 0.0)
    assert young.start == 50 and young.node is not None
    c, young = _array_fleet()
    for j in c.pending["7g.80gb"]:
        j.spec = replace(j.spec, job=j.spec.job.replace("12_", "1"))
    backfill(c.nodes, c.pending, 50, 0.0)
    assert young.start is None


def test_a_job_over_several_nodes_is_one_of_the_jobs_backfill_tests() -> None:
    """bf_max_job_test counts Slurm's jobs: the model's two jobs of one job asking two MIG types (one per
    type, sacct.py) are one test, so the 500th job after it is tested too, and starts on the one node
    that has a free instance; two jobs without an id are two tests, and it is not tested.  (A job over
    two nodes is one of the model's jobs.)"""
    for job, tested in (("7", True), ("", False)):
        free, busy = Node("free", SMALL, 7), Node("busy", SMALL, 7)
        for _ in range(2):
            running(busy, "1g.10gb", 0, 600)
        running(free, "1g.10gb", 0, 600)
        c = cluster(free, busy)
        for t in ("2g.20gb", "7g.80gb"):
            c.pending[t].append(Job(TraceJob(0, "a", "main", t, 1, 60, 60, job)))
        for i in range(BF_MAX_JOB_TEST - 2):
            c.pending["2g.20gb"].append(Job(TraceJob(1 + i, "a", "main", "2g.20gb", 1, 60, 60, str(100 + i))))
        last = Job(TraceJob(BF_MAX_JOB_TEST, "a", "main", "1g.10gb", 1, 60, 60, "99999"))
        c.pending["1g.10gb"].append(last)
        backfill(c.nodes, c.pending, 10, 0.0)
        assert (last.start is not None) is tested


def test_an_arrays_tasks_past_those_tested_do_not_take_the_tests_of_the_jobs_behind_it() -> None:
    """A pending array of 600 tasks filled bf_max_job_test's 500, and a younger 1g job was never tested,
    a free 1g on another node and all: Slurm tests an array's tasks up to its 20th reservation, and
    counts only those tested (backfill.c, job_test_count at next_task)."""
    seven = Layout.of("seven", {"7g.80gb": 1})
    a, b = Node("a", seven, 7), Node("b", SMALL, 7)
    running(a, "7g.80gb", 0, 600)
    c = cluster(a, b)
    for t in range(600):
        c.pending["7g.80gb"].append(Job(TraceJob(1 + t / 1000, "a", "main", "7g.80gb", 1, 300, 600, f"12_{t}")))
    young = Job(TraceJob(5, "a", "main", "1g.10gb", 1, 60, 120, "13"))
    c.pending["1g.10gb"].append(young)
    backfill(c.nodes, c.pending, 10, 0.0)
    assert (young.start, young.node) == (10, "b")


def test_a_job_over_two_nodes_reserves_both_whole() -> None:
    """A 1g job over both nodes waits for gpu2's 1g (its job's limit ends at 60) and reserves both nodes
    from then: a younger 2g job whose limit reaches into that window starts on neither node's free 2g
    (``_add_reservation`` takes every node of the job's bitmap), one that ends before it starts."""
    gpu1, gpu2 = Node("gpu1", BALANCED, 7), Node("gpu2", BALANCED, 7)
    running(gpu2, "1g.10gb", 0, 60)
    running(gpu2, "1g.10gb", 0, 60)
    c = cluster(gpu1, gpu2)
    c.pending["1g.10gb"].append(wide := Job(TraceJob(1, "a", "main", "1g.10gb", 1, 30, 60, job="5", nodes=2)))
    young = pending(c, 2, "2g.20gb", 60)
    backfill(c.nodes, c.pending, 10, 0.0)
    assert (wide.start, young.start) == (None, None)
    short = pending(c, 3, "2g.20gb", 30)  # ends at 40, before the reservation begins (60)
    backfill(c.nodes, c.pending, 10, 0.0)
    assert (short.start, short.node, young.start) == (10, "gpu2", None)  # (the busier node: place.py)
    got = will_run(c.nodes, c.nodes, "1g.10gb", 1, 10, 0.0, wanted=2)
    assert got is not None and (got[0], [n.name for n in got[1]]) == (60, ["gpu1", "gpu2"])
