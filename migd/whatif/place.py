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
node is wanted); where no set has N, the set with the most CPUs free first, then again for the rest
(and, as Slurm 22.05's test has it, a set short of N nodes with more CPUs free than the set kept so
far replaces it even if that one has N).
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


def best_nodes(nodes: Sequence[Node], can: Collection[str], count: int,
               jobs: Callable[[Node], int] = lambda n: len(n.running)) -> list[Node] | None:
    """The ``count`` nodes of ``nodes`` (slurm.conf's order) Slurm starts a job over that many nodes on, of
    those named in ``can`` (those that could run it; None: fewer can); ``jobs``: how many jobs each runs
    (in a backfill estimate, those not yet counted as ended).  Picked as ``_eval_nodes`` picks them:
    round after round, a set of consecutive nodes that can run the job (the
    sets walked in order, each replacing the one kept so far if it has enough nodes for what is still
    wanted and that one has not, or both have enough and it has fewer CPUs free, or it has not enough
    and more CPUs free than that one, whether or not that one has enough: Slurm 22.05's test, unguarded
    as it is), then from it the busiest node if one is wanted, else its first nodes in order; each set
    taken is gone from the next round."""
    sets: list[list[Node]] = [[]]
    for n in nodes:
        if n.name in can:
            sets[-1].append(n)
        elif sets[-1]:
            sets.append([])
    sets = [s for s in sets if s]
    if sum(map(len, sets)) < count:
        return None
    free = [len(s) * CPUS - sum(jobs(n) for n in s) for s in sets]
    chosen: list[Node] = []
    while len(chosen) < count:
        want, best = count - len(chosen), -1
        for i, s in enumerate(sets):
            if not s:
                continue
            enough = len(s) >= want
            if best < 0 or (enough and not len(sets[best]) >= want) or (enough and free[i] < free[best]) or (
                    not enough and free[i] > free[best]):
                best = i
        taken = sets[best]
        chosen += [max(taken, key=jobs)] if want == 1 else taken[:want]
        sets[best] = []
    return chosen
