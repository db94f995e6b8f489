"""Where real Slurm starts a one-node job, and where the queue model says it does (migd/whatif/place.py):
Debian's Slurm 22.05, four slurmd on this host (tests/slurm_cluster.py), gpu1, gpu2 and gpu4 offering
two 1g.10gb instances each and gpu3 only a 7g.80gb, so a 1g job's usable nodes fall into the sets
gpu1-gpu2 and gpu4.  Jobs pinned with ``-w`` make some nodes busier; each unpinned job must land where
the model's ``best_fit`` puts it, and the placements are chosen so that the first usable node (gpu1)
and the busiest node are each wrong at least once: a model placing either way would fail here.

Skipped where Slurm is missing or not root, unless MIGD_REQUIRE_SLURM=1 (.ci/run sets it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from migd.demand.inputs import Layout
from migd.whatif.fleet import Job, Node
from migd.whatif.jobs import TraceJob
from migd.whatif.place import best_fit
from tests.slurm_cluster import SlurmCluster, skip_without_slurm

pytestmark = pytest.mark.integration  # Slurm

NODES = ("gpu1", "gpu2", "gpu3", "gpu4")
OFFERS = {"gpu1": "1g.10gb:2", "gpu2": "1g.10gb:2", "gpu3": "7g.80gb:1", "gpu4": "1g.10gb:2"}


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
    """Node -> how many jobs Slurm runs there now."""
    out = c.cmd("squeue", "-h", "-t", "R", "-o", "%N")
    return {n: out.split().count(n) for n in NODES}


def _model(c: SlurmCluster) -> Node | None:
    """Where the model starts a 1g.10gb:1 job on the nodes as Slurm has them now."""
    per = _running(c)
    spec = TraceJob(0.0, "a", "main", "1g.10gb", 1, 300.0, 600.0)
    nodes = []
    for n, offer in OFFERS.items():
        t, k = offer.split(":")
        node = Node(n, Layout(n, ((t, int(k)),)), 14)
        node.running = [Job(spec, 0.0, n) for _ in range(per[n])]
        nodes.append(node)
    return best_fit(nodes, {n.name for n in nodes if n.free("1g.10gb") >= 1})


def _start(c: SlurmCluster, *pin: str) -> str:
    job = c.submit("gpu:1g.10gb:1", "sleep 300", "-t", "10", *pin)
    c.wait(lambda: c.job_state(job) == "RUNNING", f"job {job} to run", 60)
    return c.cmd("squeue", "-h", "-j", job, "-o", "%N").strip()


def test_a_job_starts_where_slurm_would_put_it_not_on_the_first_node(cluster: SlurmCluster) -> None:
    c = cluster
    assert _start(c, "-w", "gpu2") == "gpu2"  # gpu2 busy: the set gpu1-gpu2 has fewer CPUs free than gpu1 alone
    want = _model(c)
    assert want is not None and want.name == "gpu4", want  # the tightest set, neither gpu1 nor the busiest
    assert _start(c) == "gpu4"
    assert _start(c, "-w", "gpu4") == "gpu4"  # gpu4's 1g instances both taken: one set left, gpu1-gpu2
    want = _model(c)
    assert want is not None and want.name == "gpu2", want  # in the set, the node with the fewest CPUs free
    assert _start(c) == "gpu2"
