"""Per-GPU mixes of the candidate layouts: each GPU of a node may hold its own candidate.

A node of eight GPUs need not be all ``day`` or all ``night``: ``night*7/balanced`` keeps seven
whole GPUs for training and carves one into the 3g, 2g and 1g instances a minority of jobs needs,
which a whole-node layout cannot offer without taking a node from the majority.  One switch per node
still: the node drains once and every GPU that differs changes in the same apply.

A mix is written as runs of candidates in GPU index order, ``day*2/night*5/balanced`` (GPUs 0-1
``day``, 2-6 ``night``, 7 ``balanced``); a node all in one candidate is written as that candidate's
name, so a plain want (``want=day``) reads as it always did.  Candidates are put in their configured
order (the same multiset of candidates always gives the same text, and a small change of the mix moves
few GPUs).  On the node, :func:`mix_profile` builds the profile an apply takes: each candidate's own
sections, restricted to the GPU indexes the mix gives it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations_with_replacement

from migd.catalog.gpumodel import GpuModel
from migd.demand.inputs import Layout, Shapes, slices_of
from migd.plan.offline import fake_gpu
from migd.profiles.model import GpuSection, Profile
from migd.profiles.resolve import resolve_section

_RUN = re.compile(r"^([\w.+-]+?)(?:\*([0-9]{1,3}))?$")
SEP = "/"


class MixError(ValueError):
    """A mix text that names no candidate or cannot be read (the node follows its schedule, saying why)."""


def mix_text(per_gpu: Sequence[str]) -> str:
    """``day*2/night*5/balanced`` for the candidates per GPU in index order (one name: all alike)."""
    runs: list[tuple[str, int]] = []
    for name in per_gpu:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
    if len(runs) == 1:
        return runs[0][0]
    return SEP.join(name if n == 1 else f"{name}*{n}" for name, n in runs)


def parse_mix(text: str, candidates: Sequence[str]) -> tuple[str, ...] | None:
    """The candidate per GPU a mix text names (a single name: None, every GPU alike, its count unknown here)."""
    if text in candidates:
        return None
    out: list[str] = []
    for run in text.split(SEP):
        m = _RUN.match(run)
        if m is None or m.group(1) not in candidates:
            raise MixError(f"{run!r} in {text!r} is not a candidate ({', '.join(candidates)}), optionally *N")
        n = int(m.group(2) or 1)
        if not 1 <= n <= 64:
            raise MixError(f"{run!r} in {text!r}: a run of {n} GPUs")
        out += [m.group(1)] * n
    return tuple(out)


@dataclass(frozen=True)
class Candidates:
    """The candidate layouts resolved on one node's GPUs (``per_gpu[i][k]``: GPU i in candidate k)."""

    names: tuple[str, ...]
    per_gpu: tuple[tuple[Layout, ...], ...]

    @classmethod
    def resolve(cls, profiles: Mapping[str, Profile], names: Sequence[str], models: Sequence[GpuModel]) -> Candidates:
        """Each candidate on each GPU as an apply would resolve it (the GRES types Slurm will carry)."""
        return cls(tuple(names), tuple(tuple(_gpu_layout(profiles[n], m, i) for n in names)
                                       for i, m in enumerate(models)))

    def layouts(self, mixed: bool = True) -> dict[str, Layout]:
        """Every layout a node may take, by its text: each candidate whole and (``mixed``) every per-GPU
        mix of them (for k candidates on g GPUs, C(g+k-1, k-1) of them: 165 for 4 on 8)."""
        g, k = len(self.per_gpu), len(self.names)
        combos = combinations_with_replacement(range(k), g) if mixed else ((j,) * g for j in range(k))
        out: dict[str, Layout] = {}
        for combo in combos:  # (sorted: candidates in configured order over GPU indexes)
            text = mix_text([self.names[j] for j in combo])
            count: Counter[str] = Counter()
            for i, j in enumerate(combo):
                count.update(dict(self.per_gpu[i][j].capacity))
            out[text] = Layout.of(text, count)
        return out


MAX_GPUS = 8  # node shapes planned for besides the planner's own: 1 to 8 GPUs of its model


def choices(names: Sequence[str], mixed: bool) -> frozenset[str] | None:
    """The layouts a change may take a node to (Shapes.choices): any mix of the candidates ``names``
    (None), or, not ``mixed``, each candidate whole."""
    return None if mixed else frozenset(names)


def shapes(profiles: Mapping[str, Profile], names: Sequence[str], models: Sequence[GpuModel],
           mixed: bool = True) -> Shapes:
    """The candidates and their mixes on the planner's GPUs and, when those are all one model, on every
    other count of it up to ``MAX_GPUS`` (a partition's nodes may hold four GPUs of it, or eight): each
    keyed by its count and model (``4xH100-SXM5-80GB``).  A node of another model has other MIG types:
    no shape here matches its GRES, and the planner skips it, saying so.  ``mixed`` False: a change takes
    a node whole into one candidate (``slurm.demand.mixes: false``); a node already in a mix is still
    read as one."""
    own = Candidates.resolve(profiles, names, models).layouts()  # (every mix read: a node may be in one)
    to = choices(names, mixed)
    if len({m.key for m in models}) != 1:
        return Shapes(own, choices=to)
    return Shapes(own, {f"{k}x{models[0].key}": Candidates.resolve(profiles, names, [models[0]] * k).layouts()
                        for k in range(1, MAX_GPUS + 1) if k != len(models)}, to)


def _gpu_layout(profile: Profile, model: GpuModel, index: int) -> Layout:
    section = profile.section_for(fake_gpu(model, index))
    count: Counter[str] = Counter()
    if section is not None:
        for d in resolve_section(section, model).instances:
            count[d.gi.name] += 1
    return Layout.of(profile.name, count)


def mix_profile(text: str, profiles: Mapping[str, Profile], candidates: Sequence[str]) -> Profile:
    """The profile a node applies for ``text``: a candidate itself, or each named candidate's sections
    restricted to the GPUs the mix gives it (a GPU past the mix's length is left alone)."""
    per_gpu = parse_mix(text, candidates)
    if per_gpu is None:
        return profiles[text]
    sections: list[GpuSection] = []
    for name in dict.fromkeys(per_gpu):
        mine = {i for i, n in enumerate(per_gpu) if n == name}
        for s in profiles[name].sections:
            idx = mine if s.selector.indexes is None else mine & set(s.selector.indexes)
            if idx:
                sections.append(replace(s, selector=replace(s.selector, indexes=tuple(sorted(idx)))))
    used = [profiles[n] for n in dict.fromkeys(per_gpu)]
    kind = "mig-parted" if any(p.kind == "mig-parted" for p in used) else "migd"
    return Profile(text, "per-GPU mix of " + ", ".join(p.name for p in used), tuple(sections),
                   ", ".join(dict.fromkeys(p.source for p in used)), kind)


def moved_back(before: Layout, now: Layout, after: Layout) -> bool:
    """Whether going ``now`` -> ``after`` undoes at least half of the change ``before`` -> ``now`` (in
    slices moved between MIG types): the reversal the rule holds and the bench counts."""
    types = {t for lay in (before, now, after) for t, _ in lay.capacity}
    first = {t: slices_of(t) * (now.count(t) - before.count(t)) for t in types}
    second = {t: slices_of(t) * (after.count(t) - now.count(t)) for t in types}
    moved = sum(abs(v) for v in first.values())
    undone = sum(min(abs(first[t]), abs(second[t])) for t in types if first[t] * second[t] < 0)
    return moved > 0 and undone * 2 >= moved
