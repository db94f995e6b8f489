"""The fixed mixes migd is measured against (from accounting, and the best found in hindsight):
migd/whatif/fixedmix.py; its names stay importable from here."""

from __future__ import annotations

from migd.whatif.fixedmix import Counts, accounting, hindsight, slice_hours, spread

__all__ = ["Counts", "accounting", "hindsight", "slice_hours", "spread"]
