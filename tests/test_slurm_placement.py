"""Where real Slurm starts a job, and where the queue model says it does (migd/whatif/place.py):
Debian's Slurm 22.05, five slurmd on this host (tests/slurm_cluster.py), gpu1, gpu2, gpu3 and gpu5
offering two 1g.10gb instances each and gpu4 only a 7g.80gb, so a 1g job's usable nodes fall into the
sets gpu1-gpu3 and gpu5.  Jobs pinned with ``-w`` make some nodes busier; each unpinned job must land
where the model puts it, and the placements are chosen so that the first usable node (gpu1) and the
busiest node are each wrong at least once for a one-node job, and for a job over two nodes the busiest
nodes and the tightest set are each wrong: a model placing any of those ways would fail here.  A job
over two nodes starts on both at once, never on the one that has its instance free while the other has
none.

Skipped where Slurm is missing or not root, unless MIGD_REQUIRE_SLURM=1 (.ci/run sets it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from migd.demand.inputs import Layout
from migd.slurm.hostlist import hostnames
from migd.whatif.fleet import Job, Node
from migd.whatif.jobs import TraceJob
from migd.whatif.place import best_nodes
from tests.slurm_cluster import SlurmCluster, skip_without_slurm

pytestmark = pytest.mark.integration  # Slurm

NODES = ("gpu1", "gpu2", "gpu3", "gpu4", "gpu5")
OFFERS = {"gpu1": "1g.10gb:2", "gpu2": "1g.10gb:2", "gpu3": "1g.10gb:2", "gpu4": "7g.80gb:1", "gpu5": "1g.10gb:2"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    skip_without_slurm()
    c = SlurmCluster(2, nodes=NODES)
    try:
        conf = ""
        for n, offer in OFFERS.items():
            t, k = offer.split(":")
            conf += "".join(f"NodeName={n} Name=gpu Type={t} File={c.devs[n]}/nvidia{i}\n" for i in range(int(k)))
        c.start({n: f"gpu:{o}" for n, o in OFFERS.items()}, conf, cpus=8)
        yield c
    finally:
        c.stop()


def _running(c: SlurmCluster) -> dict[str, int]:
    """Node -> how many jobs Slurm runs there now (a job over two nodes counts on each)."""
    per = dict.fromkeys(NODES, 0)
    for expr in c.cmd("squeue", "-h", "-t", "R", "-o", "%N").split():
        for n in hostnames(expr) or ():
            per[n] += 1
    return per


def _model(c: SlurmCluster, nodes_wanted: int = 1) -> list[str] | None:
    """Where the model starts a 1g.10gb:1 job over ``nodes_wanted`` nodes on the nodes as Slurm has them now."""
    per = _running(c)
    spec = TraceJob(0.0, "a", "main", "1g.10gb", 1, 300.0, 600.0)
    nodes = []
    for n, offer in OFFERS.items():
        t, k = offer.split(":")
        node = Node(n, Layout(n, ((t, int(k)),)), 14)
        node.running = [Job(spec, 0.0, (n,)) for _ in range(per[n])]
        nodes.append(node)
    got = best_nodes(nodes, {n.name for n in nodes if n.free("1g.10gb") >= 1}, nodes_wanted)
    return None if got is None else sorted(n.name for n in got)


def _submit(c: SlurmCluster, *extra: str) -> str:
    return c.submit("gpu:1g.10gb:1", "sleep 300", "-t", "10", *extra)


def _start(c: SlurmCluster, *extra: str) -> str:
    job = _submit(c, *extra)
    c.wait(lambda: c.job_state(job) == "RUNNING", f"job {job} to run", 60)
    return c.cmd("squeue", "-h", "-j", job, "-o", "%N").strip()


def _on(c: SlurmCluster, job: str) -> list[str]:
    return sorted(hostnames(c.cmd("squeue", "-h", "-j", job, "-o", "%N").strip()) or ())


def _idle(c: SlurmCluster) -> None:
    c.cmd("scancel", "--full", *c.cmd("squeue", "-h", "-o", "%A").split(), check=False)
    c.wait(lambda: not c.cmd("squeue", "-h", "-o", "%A").split(), "every job to end", 60)


def test_a_job_starts_where_slurm_would_put_it_not_on_the_first_node(cluster: SlurmCluster) -> None:
    c = cluster
    _idle(c)
    assert _start(c, "-w", "gpu2") == "gpu2"  # gpu2 busy: the set gpu1-gpu3 has more CPUs free than gpu5 alone
    assert _model(c) == ["gpu5"]  # the tightest set, neither gpu1 nor the busiest
    assert _start(c) == "gpu5"
    assert _start(c, "-w", "gpu5") == "gpu5"  # gpu5's 1g instances both taken: one set left, gpu1-gpu3
    assert _model(c) == ["gpu2"]  # in the set, the node with the fewest CPUs free
    assert _start(c) == "gpu2"


def test_a_job_over_two_nodes_starts_on_both_at_once_where_slurm_puts_it(cluster: SlurmCluster) -> None:
    c = cluster
    _idle(c)
    assert _start(c, "-w", "gpu3") == "gpu3" and _start(c, "-w", "gpu5") == "gpu5"
    # gpu5 is the tightest set but one node; of gpu1-gpu3 the first two, not gpu3, the busiest
    assert _model(c, 2) == ["gpu1", "gpu2"]
    wide = _submit(c, "-N", "2")
    c.wait(lambda: c.job_state(wide) == "RUNNING", f"job {wide} to run", 60)
    assert _on(c, wide) == ["gpu1", "gpu2"]
    fill = {n: c.submit("gpu:1g.10gb:1", "sleep 300", "-t", "10", "-w", n) for n in ("gpu1", "gpu2", "gpu3")}
    c.wait(lambda: all(c.job_state(j) == "RUNNING" for j in fill.values()), "the nodes to fill", 60)
    assert _model(c, 2) is None  # only gpu5 has an instance free: the job waits for a second node
    gang = _submit(c, "-N", "2")
    c.wait(lambda: c.cmd("squeue", "-h", "-j", gang, "-o", "%T %r").split() == ["PENDING", "Resources"],
           f"job {gang} to wait for resources", 60)
    c.cmd("scancel", fill["gpu3"])
    c.wait(lambda: c.job_state(gang) == "RUNNING", f"job {gang} to run", 60)
    assert _on(c, gang) == ["gpu3", "gpu5"]
    assert _model(c, 2) is None
