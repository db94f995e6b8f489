"""The policies bench/demand.py compares: migd/whatif/policies.py (``clock``, ``greedy``, ``migd``, a
fixed mix), their names importable from here.  What is the bench's own: a configuration read from any
path (the bench runs as any user, from any checkout) on a simulated fleet's node (``--fleet``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from migd.catalog.models import MODELS
from migd.config.migdyaml import Config, load_config
from migd.sim.fleets import FLEETS
from migd.whatif import policies as _policies
from migd.whatif.policies import GREEDY_LOOK, Policy, clock, cluster, fixed, greedy, migd

__all__ = ["GREEDY_LOOK", "Policy", "Setup", "clock", "cluster", "fixed", "greedy", "migd"]


class Setup(_policies.Setup):
    """migd/whatif/policies.py's Setup, loaded from a configuration file for a simulated fleet."""

    @classmethod
    def load(cls, config: Path, fleet: str, start: datetime, waves: int) -> Setup:
        models = [MODELS[k] for k in FLEETS[fleet]]
        return cls.of(_config(config), models, start, waves, where=str(config))


def _config(path: Path) -> Config:
    """The configuration as migd reads it (its text: the bench runs as any user, from any checkout)."""
    return load_config(path, path.read_text())
