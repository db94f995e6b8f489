"""The layout a demand planner wants for a node, kept in the node's own Slurm record (``Extra=``).

``migd:want=day,by=gpu001,at=1795671590,until=1795678790``: which candidate, which planner said so,
when, and until when it holds (a lease: renewed at half its length while the planner lives; once it
ends the node's migd follows its schedule again).  Slurm keeps it across restarts of slurmctld
(StateSaveLocation), shows it in ``scontrol show node``, and every node's migd reads its own record
at each pass anyway: no coordinator of migd's own, no extra channel.  Slurm 22.05 added ``Extra``
(``scontrol update nodename=X extra=...``, scontrol(1)); the Slurm tests here use 22.05.8.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

PREFIX = "migd:want="
SKEW_S = 300.0  # how far the planner's clock may run ahead of a node's before its lease looks too long
_FORM = re.compile(r"^migd:want=([\w.+*/-]+),by=([\w.-]+),at=([0-9]{1,18}),until=([0-9]{1,18})$")  # (day*2/night*6)


@dataclass(frozen=True)
class Want:
    layout: str
    planner: str
    at: float
    until: float

    def text(self) -> str:
        return f"{PREFIX}{self.layout},by={self.planner},at={int(self.at)},until={int(self.until)}"

    @classmethod
    def parse(cls, extra: str) -> Want | None:
        """migd's want in a node's Extra, or None (empty, someone else's, or not in this form)."""
        m = _FORM.match(extra.strip())
        return cls(m.group(1), m.group(2), float(m.group(3)), float(m.group(4))) if m else None

    def holds(self, planner: str, now: float, lease_s: float) -> bool:
        """Said by the planner this node follows, its lease not ended and not beyond the configured one."""
        return self.planner == planner and now < self.until and not self.beyond(now, lease_s)

    def beyond(self, now: float, lease_s: float) -> bool:
        """Its lease runs further than a planner with this ``lease`` writes (beyond clock skew): not a
        lease to follow (``until=`` in milliseconds would otherwise hold a node for 50,000 years)."""
        return self.until - now > lease_s + SKEW_S


def stamp(epoch: float) -> str:
    """A time read from Slurm, in local time; one no calendar holds is shown as the number it is."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))
    except (OverflowError, OSError, ValueError):
        return f"{epoch:.0f} (epoch seconds, out of range)"
