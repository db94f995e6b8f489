"""The queue model bench/demand.py replays: migd/whatif/replay.py (in the package, so an installed migd's
``migctl what-if`` replays through the same model); its names stay importable from here."""

from __future__ import annotations

from migd.whatif.replay import Cluster, Job, Node, Policy, run

__all__ = ["Cluster", "Job", "Node", "Policy", "run"]
