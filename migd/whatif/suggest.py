"""The best fixed mix, written so migd can load it: a profile per distinct node layout, and a
configuration whose schedule holds it.

The profiles are migd profiles, as the files of ``profiles/``: each the candidates' own sections
restricted to the GPU indexes the mix gives them (migd.demand.mix.mix_profile, as a node in demand
mode applies a mix), so owners, compute splits and model selectors carry over from the candidates.
The configuration (``migd.<profile>.yaml``) names them by ``profiles_dir`` and holds the one
profile every day at 00:00 (a schedule with one entry: its latest past entry is always that one);
``migd --check --config`` validates it, and its ``schedule:`` is what a site copies into its own.

The same layouts as a mig-parted config (``mig-parted.yaml``, ``version: v1``, a config per layout)
for nodes NVIDIA's mig-parted manages: resolved on the what-if's GPU model, and without owners
(mig-parted keeps none).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from migd.demand.mix import Candidates, mix_profile, parse_mix
from migd.profiles.export import profile_doc
from migd.profiles.model import Profile

PREFIX = "whatif"


@dataclass(frozen=True)
class Written:
    profile: str  # its name, as the schedule names it
    layout: str  # the mix it holds (day*4/night*4)
    nodes: int  # how many of the replayed nodes hold it
    profile_file: Path
    config_file: Path


def write_suggestion(directory: Path, per_node: Sequence[str], profiles: Mapping[str, Profile],
                     candidates: Sequence[str], timezone: str, said: str) -> list[Written]:
    """Files in ``directory`` (made if missing) for each distinct layout of ``per_node``, most nodes first.
    ``said``: the line each file's comment starts with (the command and the figures it rests on)."""
    prof_dir = directory / "profiles"
    prof_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for k, (layout, n) in enumerate(Counter(per_node).most_common(), 1):
        name = f"{PREFIX}-{k}"
        p = mix_profile(layout, profiles, candidates)
        doc = profile_doc(p, name, f"best fixed mix of {', '.join(candidates)} in hindsight: {layout}")
        pfile = prof_dir / f"{name}.yaml"
        pfile.write_text(f"# {said}\n# {n} of {len(per_node)} nodes: {layout}\n"
                         + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))
        cfile = directory / f"migd.{name}.yaml"
        cfile.write_text(f"# {said}\n# The schedule that holds {name} ({layout}) on a node: copy its schedule: into "
                         f"/etc/migd/migd.yaml\n# and {pfile.name} into the profiles_dir; migd --check --config "
                         f"{cfile.name} validates it as it is.\n"
                         + yaml.safe_dump({"timezone": timezone, "profiles_dir": str(prof_dir.resolve()),
                                           "schedule": [{"profile": name, "at": "00:00"}]},
                                          sort_keys=False, default_flow_style=None))
        out.append(Written(name, layout, n, pfile, cfile))
    return out


def write_mig_parted(path: Path, written: Sequence[Written], candidates: Candidates, said: str) -> None:
    """Each written layout as a mig-parted config of the same name: GPUs alike share an entry."""
    configs: dict[str, list[dict[str, Any]]] = {}
    for w in written:
        per_gpu = parse_mix(w.layout, candidates.names) or (w.layout,) * len(candidates.per_gpu)
        groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
        for i, name in enumerate(per_gpu):
            groups.setdefault(candidates.per_gpu[i][candidates.names.index(name)].capacity, []).append(i)
        configs[w.profile] = [{"devices": gpus, "mig-enabled": bool(counts), **(
            {"mig-devices": dict(counts)} if counts else {})} for counts, gpus in groups.items()]
    path.write_text(f"# {said}\n# The same layouts for mig-parted (no owners: mig-parted keeps none)\n"
                    + yaml.safe_dump({"version": "v1", "mig-configs": configs}, sort_keys=False,
                                     default_flow_style=None))

