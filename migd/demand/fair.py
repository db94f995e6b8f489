"""Fairness between accounts: each account's pending demand counts up to its max-min fair share.

Water-filling: with capacity C slices and accounts asking a_1..a_k slices, the level L is the one at
which sum(min(a_i, L)) = min(C, sum(a_i)); an account asking less than L counts in full, one asking
more counts as L.  So one department's long queue cannot make every node take its layout while
another's jobs wait: past its share, its extra demand weighs nothing until the others are served.
"""

from __future__ import annotations

from collections.abc import Mapping


def fair_weights(asks: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Account -> the fraction of its demand that counts (1.0 at or under its fair share)."""
    total = sum(asks.values())
    if total <= capacity or total <= 0:
        return {a: 1.0 for a in asks}
    left, level = capacity, max(asks.values())  # (total > capacity: some account asks more than its share)
    ordered = sorted(asks.items(), key=lambda kv: (kv[1], kv[0]))
    for k, (_, ask) in enumerate(ordered):
        share = left / (len(ordered) - k)
        if ask > share:
            level = share
            break
        left -= ask
    return {a: (1.0 if ask <= level else level / ask) for a, ask in asks.items()}
