"""What bench/demand.py reports for one policy's run, and the targets it checks: migd/whatif/figures.py
(the what-if reports the same figures); its names stay importable from here."""

from __future__ import annotations

from migd.whatif.figures import REVERSAL_S, ROWS, measure, objective, pct, reversals, table, targets

__all__ = ["REVERSAL_S", "ROWS", "measure", "objective", "pct", "reversals", "table", "targets"]
