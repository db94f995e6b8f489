"""Which nodes Slurm starts a job on: select/cons_tres's best fit, not the first nodes.

Slurm 22.05's ``_eval_nodes`` (src/plugins/select/cons_tres/job_test.c; the default path: no
topology, no LLN, no ``pack_serial_at_end``, no ``bf_busy_nodes``): the nodes that can run the job now
form sets of consecutive nodes (in slurm.conf's order, a node that cannot run it ending a set); of the
sets of the lowest weight it takes the tightest, the one with the fewest CPUs free (the first of equal
ones), and in it the node with the fewest CPUs free (the first of equal ones).  So a job goes to a
busy node of a short set rather than to the first node: within a set, quiet nodes stay quiet and
empty sooner (though a lone idle node between nodes that cannot run the job is a set of its own, and
the tightest).  A job over N nodes (``-N 2``, ``--gres`` counted on each: sbatch(1)) takes the tightest
set with N nodes and in it the first N, not the busiest (the busiest-node search runs only while one
node is wanted); where no set has N, the set with the most CPUs free first, then again for the rest.
Slurm's main scheduler and its backfill both start such a job on all its nodes at once or not at all
(``select_nodes`` assigns the whole selection; node_scheduler.c).

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
    """The node of ``nodes`` (slurm.conf's order) Slurm starts a one-node job on, of those named in ``can``
    (those that could run it); ``jobs``: how many jobs each runs (in a backfill estimate, those not yet
    counted as ended)."""
    got = best_nodes(nodes, can, 1, jobs)
    return got[0] if got else None


def best_nodes(nodes: Sequence[Node], can: Collection[str], count: int,
               jobs: Callable[[Node], int] = lambda n: len(n.running)) -> list[Node] | None:
    """The ``count`` nodes Slurm starts a job over that many nodes on (None: fewer can run it).  While
    more than one is still wanted, ``_eval_nodes`` takes the tightest set that has as many nodes (the
    fewest CPUs free, the first of equals), or, where no set has, the set with the most CPUs free, and
    from it the first nodes in order (not the busiest); once one is wanted, the busiest node of the
    tightest set, as for a one-node job; each set taken is gone from the next round."""
    sets: list[list[Node]] = [[]]
    for n in nodes:
        if n.name in can:
            sets[-1].append(n)
        elif sets[-1]:
            sets.append([])
    sets = [s for s in sets if s]
    if sum(map(len, sets)) < count:
        return None
    free = {id(s): len(s) * CPUS - sum(jobs(n) for n in s) for s in sets}
    chosen: list[Node] = []
    while len(chosen) < count:
        want = count - len(chosen)
        enough = [s for s in sets if len(s) >= want]
        taken = min(enough, key=lambda s: free[id(s)]) if enough else max(sets, key=lambda s: free[id(s)])
        chosen += [max(taken, key=jobs)] if want == 1 else taken[:want]
        sets.remove(taken)
    return chosen
