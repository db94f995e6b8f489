"""A profile as a candidate layout: how many instances of each MIG type one node offers in it.

Resolved as an apply would resolve it (the profile's section for each GPU's model, the model's
profile names), so the rule weighs exactly the ``Type=`` values Slurm's gres.conf will carry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from migd.catalog.gpumodel import GpuModel
from migd.demand.inputs import Layout
from migd.plan.offline import fake_gpu
from migd.profiles.model import Profile
from migd.profiles.resolve import resolve_section


def node_layout(profile: Profile, models: Sequence[GpuModel]) -> Layout:
    """The instances per MIG type ``profile`` gives a node with GPUs of ``models`` (by index)."""
    count: Counter[str] = Counter()
    for i, model in enumerate(models):
        section = profile.section_for(fake_gpu(model, i))
        if section is None:
            continue
        for d in resolve_section(section, model).instances:
            count[d.gi.name] += 1
    return Layout.of(profile.name, count)
