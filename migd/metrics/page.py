"""``GET /``: one read-only HTML page for the people who share the GPUs.

Rendered on the server from the sampler's snapshot (the one ``/metrics`` exports) and the daemon's
status; no script, no external stylesheet, font or image (an air-gapped node shows it as it is), and
``<meta http-equiv="refresh">`` reloads it at the sampling interval.  Each GPU is a row of its
memory slices (placements, NVIDIA's MIG user guide) with each GPU instance a block where it sits,
coloured by owner: its profile, owner, activity (or "no activity source" on GPUs without GPM),
memory used and processes.  Above: the active profile and why, the next transition, GPUs that wait
or carry a fault, and each owner's share of the slices now and over today.  The page is rendered once per snapshot
and status change and served as bytes, like the exposition.
"""

from __future__ import annotations

import hashlib
import html
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from migd.api.daemon import wait_words
from migd.catalog.models import Placement
from migd.metrics import share
from migd.metrics.snapshot import GiSample, GpuSample, Snapshot
from migd.printable import shown

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.3em}
.summary p{margin:.2em 0}.gpu{margin:1em 0}.gpu h2{font-size:1em;margin:.3em 0}
.map{display:grid;gap:3px;max-width:64em}
.gi,.free,.unusable{border-radius:4px;padding:.4em;min-height:4.5em;font-size:12px}.free{background:#eee;color:#888}
.unusable{background:repeating-linear-gradient(45deg,#f4f4f4 0 6px,#e4e4e4 6px 12px);color:#999}
.gi span{display:block}.warn{color:#a40}.owners span{margin-right:1.2em}
"""


def escape(text: object) -> str:
    """Text on the page: HTML-escaped, and each unprintable character (an ESC or a newline in a Slurm or
    NVML string) shown as its escape (``migd.printable``), as migctl shows it."""
    return html.escape(shown(text))


def owner_colour(owner: str) -> str:
    """A stable, light colour per owner (the same on every node and every render)."""
    hue = int(hashlib.sha256(owner.encode()).hexdigest()[:4], 16) % 360
    return f"hsl({hue},60%,80%)"


def render_page(snap: Snapshot | None, status: Mapping[str, Any], refresh_s: float,
                today: Mapping[str, float] | None = None) -> bytes:
    e = escape
    parts = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
             f"<meta http-equiv=\"refresh\" content=\"{max(1, round(refresh_s))}\">",
             f"<title>migd: MIG instances</title><style>{_STYLE}</style></head><body>",
             "<h1>MIG instances on this node</h1>", _summary(snap, status), _today(today or {}, status)]
    for g in snap.gpus if snap else ():
        parts.append(_gpu(g, status.get("gpus", {}).get(str(g.info.index))))
    for u in snap.unread if snap else ():
        parts.append(f"<section class=\"gpu unread\" data-gpu=\"{u.index}\"><h2 class=\"warn\">GPU {u.index}: "
                     f"{'LOST' if u.lost else 'not readable'}: {e(u.error)}</h2></section>")
    parts.append("</body></html>")
    return "".join(parts).encode()


def _summary(snap: Snapshot | None, status: Mapping[str, Any]) -> str:
    e = escape
    active = status.get("active")
    why = f" ({e(active['reason'])})" if active else ""
    lines = [f"<p id=\"active\">active profile: <b>{e(active['profile']) if active else 'none yet'}</b>{why}</p>"]
    nxt = status.get("next")
    lines.append(f"<p id=\"next\">next transition: {e(nxt['profile'])} at {e(nxt['local'])}</p>" if nxt else
                 "<p id=\"next\">next transition: none</p>")
    for i, g in sorted(status.get("gpus", {}).items()):
        if g.get("state") not in (None, "converged"):
            lines.append(f"<p class=\"warn\">GPU {e(i)}: {e(g['state'])}: {e(wait_words(g.get('reason') or ''))}</p>")
    applying = status.get("applying") or {}
    for i, pids in sorted(applying.get("waiting", {}).items()):
        lines.append(f"<p class=\"warn\">GPU {e(i)}: waiting: the manual apply of {e(applying['profile'])} waits for "
                     f"processes {e(', '.join(map(str, pids)))}</p>")
    for uuid, fault in status.get("unhealthy", {}).items():
        lines.append(f"<p class=\"warn\">unhealthy {e(uuid)}: {e(fault)}</p>")
    lines.append(_owners(snap))
    return "<div class=\"summary\">" + "".join(lines) + "</div>"


def _owners(snap: Snapshot | None) -> str:
    """Each owner's share of the node's compute slices, as the instances stand now."""
    held = share.held(snap) if snap else Counter()
    held.pop(share.FREE, None)
    total = sum(g.compute_slices for g in snap.gpus) if snap else 0
    shares = "".join(f"<span class=\"share\" data-owner=\"{escape(o)}\">{escape(o)}: {n}/{total} slices "
                     f"({n / total:.0%})</span>" for o, n in sorted(held.items()) if total)
    return f"<p class=\"owners\">share of the slices now: {shares or 'no instances'}</p>"


def _today(shares: Mapping[str, float], status: Mapping[str, Any]) -> str:
    """Each owner's share of the slices since local midnight (``metrics/share.py``)."""
    e = escape
    parts = "".join(f"<span class=\"share-today\" data-owner=\"{e(o)}\">{e(o)}: {f:.0%}</span>"
                    for o, f in shares.items())
    zone = e(str(status.get("timezone", "")))
    return f"<p class=\"owners\" id=\"today\">share of the slices today ({zone}): {parts or 'not yet measured'}</p>"


def _gpu(g: GpuSample, progress: Mapping[str, Any] | None) -> str:
    e = escape
    slots = max(g.memory_slices, 1)
    state = f" <span class=\"warn\">{e(progress['state'])}</span>" if progress and progress.get("state") not in (
        None, "converged") else ""
    blocks: list[str] = []
    taken: set[int] = set()
    for gi in sorted(g.instances, key=lambda x: x.placement_start):
        blocks.append(_block(gi))
        taken.update(range(gi.placement_start, gi.placement_start + gi.placement_size))
    blocks += _empty(g, taken) if g.instances else []
    mode = "MIG" if g.info.mig_current else "MIG disabled"
    body = "".join(blocks) if g.instances else f"<div class=\"free\" style=\"grid-column:1/span {slots}\">{mode}, " \
                                                f"{g.processes} process(es)</div>"
    return (f"<section class=\"gpu\" data-gpu=\"{g.info.index}\" data-slices=\"{slots}\"><h2>GPU {g.info.index}: "
            f"{e(g.info.name)}{state}</h2><div class=\"map\" style=\"grid-template-columns:repeat({slots},1fr)\">"
            f"{body}</div></section>")


def _empty(g: GpuSample, taken: set[int]) -> list[str]:
    """A block per memory slice no instance holds: "free" where some profile could still be made on it,
    "unusable" where none can while the other instances stand (an A100's or H100's eighth slice beside
    seven 1g instances: it is only ever part of a larger placement, and no compute slice is left)."""
    model = g.info.model
    if model is None:
        usable, takers = set(range(g.memory_slices)), {}
    else:
        compute_free = model.compute_slices - sum(gi.compute_slices for gi in g.instances)
        usable = model.usable_slices([Placement(gi.placement_start, gi.placement_size) for gi in g.instances],
                                     compute_free)
        takers = {s: [f"{p.name} at {pl}" for p in model.profiles for pl in p.placements if pl.start <= s < pl.end]
                  for s in range(g.memory_slices)}
    out = []
    for s in range(g.memory_slices):
        where = f"data-slice=\"{s}\" style=\"grid-column:{s + 1}/span 1\""
        if s in taken:
            continue
        if s in usable:
            out.append(f"<div class=\"free\" {where}>free</div>")
        else:
            why = f"no instance fits on this memory slice beside the ones there now; it is part of " \
                  f"{', '.join(takers.get(s, [])) or 'no placement'}"
            out.append(f"<div class=\"unusable\" {where} title=\"{escape(why)}\">unusable now</div>")
    return out


def _block(gi: GiSample) -> str:
    e = escape
    owner = gi.owner or "-"
    sm = gi.activity.sm_active if gi.activity is not None else None
    act = f"SM {sm:.0%}" if sm is not None else ("SM -" if gi.activity is not None else "no activity source")
    mem = f"{(gi.memory_used_bytes or 0) >> 20} / {(gi.memory_total_bytes or 0) >> 20} MiB" \
        if gi.memory_total_bytes else "memory: -"
    return (f"<div class=\"gi\" data-owner=\"{e(owner)}\" data-profile=\"{e(gi.profile)}\" "
            f"data-start=\"{gi.placement_start}\" data-size=\"{gi.placement_size}\" "
            f"style=\"grid-column:{gi.placement_start + 1}/span {gi.placement_size};background:{owner_colour(owner)}\">"
            f"<span class=\"profile\">{e(gi.profile)}</span><span class=\"owner\">{e(owner)}</span>"
            f"<span class=\"activity\">{e(act)}</span><span class=\"memory\">{e(mem)}</span>"
            f"<span class=\"processes\">{gi.processes} process(es)</span></div>")


class Page:
    """The page as bytes, rendered again only when the snapshot or the status changed (a page per
    request would put HTML rendering on the event loop that serves /metrics).  The status is looked at
    at most once per ``status_every_s`` for a snapshot already rendered: building it per request cost
    the page twice /metrics' p99 (bench/run.py's page row)."""

    def __init__(self, snapshot: Any, status: Any, refresh_s: float,
                 today: Callable[[], Mapping[str, float]] = dict, status_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._snapshot, self._status, self.refresh_s, self._today = snapshot, status, refresh_s, today
        self._key: tuple[Any, str] | None = None
        self._bytes = b""
        self._every, self._clock, self._looked = status_every_s, clock, -float("inf")

    def body(self) -> bytes:
        snap, now = self._snapshot(), self._clock()
        if self._key is not None and snap is self._key[0] and now - self._looked < self._every:
            return self._bytes
        self._looked = now
        doc = self._status()
        key = (snap, repr(sorted(doc.items())) if isinstance(doc, dict) else repr(doc))
        if key != self._key:
            self._key, self._bytes = key, render_page(snap, doc, self.refresh_s, self._today())
        return self._bytes
