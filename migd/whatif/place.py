"""Which node Slurm starts a one-node job on: select/cons_tres's best fit, not the first node.

Slurm 22.05's ``_eval_nodes`` (src/plugins/select/cons_tres/job_test.c; the default path: no
topology, no LLN, no ``pack_serial_at_end``, no ``bf_busy_nodes``): the nodes that can run the job now
form sets of consecutive nodes (in slurm.conf's order, a node that cannot run it ending a set); of the
sets of the lowest weight it takes the tightest, the one with the fewest CPUs free (the first of equal
ones), and in it the node with the fewest CPUs free (the first of equal ones).  So a job goes to a
busy node of a short set rather than to the first node: within a set, quiet nodes stay quiet and
empty sooner (though a lone idle node between nodes that cannot run the job is a set of its own, and
the tightest).

The model counts CPUs in cores: ``SelectTypeParameters=CR_Core`` gives a one-CPU job (sbatch's
default: one task of one CPU) a whole core, both its threads, and a DGX H100 has 112 cores; every node
has the same weight, and gres.conf as migd writes it binds no cores to a GPU (no ``Cores=``), so every
free core of a node counts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from migd.whatif.fleet import Node

CPUS = 112  # cores a node has free when it runs nothing (the set with fewer free is the tighter)


def best_fit(nodes: Sequence[Node], can: Collection[str],
             jobs: Callable[[Node], int] = lambda n: len(n.running)) -> Node | None:
    """The node of ``nodes`` (slurm.conf's order) Slurm starts a job on, of those named in ``can`` (those
    that could run it); ``jobs``: how many jobs each runs (in a backfill estimate, those not yet counted
    as ended)."""
    sets: list[list[Node]] = [[]]
    for n in nodes:
        if n.name in can:
            sets[-1].append(n)
        elif sets[-1]:
            sets.append([])
    tightest = min((s for s in sets if s), key=lambda s: len(s) * CPUS - sum(jobs(n) for n in s), default=None)
    return None if tightest is None else max(tightest, key=jobs)
