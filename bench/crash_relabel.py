"""The crash matrix's owner-change part: SIGKILL a relabel after each file-system step in turn.

A relabel (the same layout, other owners: ``migd/apply/relabel.py``) makes no NVML call, so its cuts
are its writes: the journal, each capability node's chmod/chown/mknod, each /proc capability file,
the owner labels.  The applying child counts those calls and kills itself right after the k-th, for
k = 1 .. all of them.  At the cut, no instance labelled as the new owner's may be open to the old
owner's group; after recovery and a reconcile (what the next migd start does) every instance is the
new owner's once the journal was written (before it, nothing had begun: the old owner's), and the
journal is gone.  Needs root (the capability nodes are real character devices).
"""

from __future__ import annotations

import grp
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from migd.access.control import AccessControl
from migd.access.policy import AccessPolicy, Grant, Unowned
from migd.apply.executor import Applier
from migd.hardware.caps import CapsPaths, ci_cap, gi_cap, read_minors
from migd.profiles.loader import load_profile
from migd.sim import caps
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore

STEPS = ("chmod", "chown", "mknod", "replace", "unlink")  # what a relabel changes on disk


def _teams() -> tuple[grp.struct_group, grp.struct_group]:
    pool = {g.gr_name: g for g in grp.getgrall() if 0 < g.gr_gid < 1000}
    if "audio" in pool and "video" in pool:
        return pool["audio"], pool["video"]
    a, b = list(pool.values())[:2]
    return a, b


def _counting(limit: int | None, seen: list[int]) -> None:
    """Wrap the os calls a relabel writes with: count each; SIGKILL this process after the limit-th."""
    for name in STEPS:
        real: Callable[..., Any] = getattr(os, name)

        def step(*args: Any, _real: Callable[..., Any] = real, **kw: Any) -> Any:
            out = _real(*args, **kw)
            seen[0] += 1
            if limit is not None and seen[0] >= limit:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        setattr(os, name, step)


def _open_to(root: Path, backend: Any, gid: int) -> dict[int, bool]:
    """Each GI (by placement start) of GPU 0: whether any of its nodes is readable by group ``gid``."""
    paths = CapsPaths(root)
    minors = read_minors(paths.mig_minors)
    out = {}
    for gi in backend.list_gpu_instances(0):
        names = [gi_cap(0, gi.id)] + [ci_cap(0, gi.id, ci.id) for ci in gi.compute_instances]
        open_ = False
        for n in names:
            try:
                st = os.lstat(paths.node(minors[n]))
            except FileNotFoundError:
                continue
            open_ |= st.st_gid == gid and bool(st.st_mode & stat.S_IRGRP) or bool(st.st_mode & stat.S_IROTH)
        out[gi.placement.start] = open_
    return out


def run_relabel(workdir: Path, profiles: Path) -> dict[str, object]:
    """day (notebooks: team A) relabelled to training (team B) on one A100, killed at every step."""
    a, b = _teams()
    state, sdir, root = workdir / "relabel.json", workdir / "relabel.d", workdir / "relabel-caps"
    day, moved = profiles / "day.yaml", workdir / "day-training.yaml"
    moved.write_text(day.read_text().replace("owner: notebooks", "owner: training"))
    backend = sim_backend(state, "single-a100")
    Applier(backend, sdir).apply(load_profile(day))
    caps.enable(StateStore(state), root)
    policy = AccessPolicy({"notebooks": Grant(a.gr_name), "training": Grant(b.gr_name)}, Unowned.ROOT, CapsPaths(root))

    def fresh() -> tuple[Applier, AccessControl, Any]:
        be = sim_backend(state, "single-a100")
        ap = Applier(be, sdir)
        ap.access = AccessControl(policy, be, ap.owners.load)
        return ap, ap.access, be

    ap, ac, be = fresh()
    ac.reconcile()
    labels = (sdir / "owners.json").read_bytes()
    counted = [0]
    pid = os.fork()
    if pid == 0:  # one full relabel, counted, to learn how many cuts there are
        _counting(None, counted)
        ap.apply(load_profile(moved))
        os._exit(min(counted[0], 255))
    _, status = os.waitpid(pid, 0)
    total = os.WEXITSTATUS(status)
    failures: list[str] = []
    for k in range(1, total + 1):
        (sdir / "owners.json").write_bytes(labels)
        ac.reconcile()  # back to team A's grants
        child = os.fork()
        if child == 0:
            _counting(k, [0])
            fresh()[0].apply(load_profile(moved))
            os._exit(0)
        _, status = os.waitpid(child, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            failures.append(f"relabel k={k}: not killed (status {status})")
            continue
        begun = (sdir / "journal.json").exists()  # the relabel had begun: recovery finishes it
        now = fresh()
        labelled_b = {s for s, o in now[0].owners.load().get(be.gpu(0).uuid, {}).items() if o == "training"}
        leaked = sorted(s for s, open_ in _open_to(root, be, a.gr_gid).items() if open_ and s in labelled_b)
        if leaked:
            failures.append(f"relabel k={k}: GIs at {leaked} labelled training are open to notebooks' group")
        now[0].recover()
        now[1].reconcile()
        winner, loser = (b, a) if begun or labelled_b else (a, b)
        if any(_open_to(root, be, loser.gr_gid).values()) or not all(_open_to(root, be, winner.gr_gid).values()):
            failures.append(f"relabel k={k}: after recovery not every instance is {winner.gr_name}'s alone")
        if (sdir / "journal.json").exists():
            failures.append(f"relabel k={k}: journal left behind")
        now[2].close()
    be.close()
    return {"fleet": "single-a100", "transition": "day: notebooks->training", "mutations": total,
            "scenarios": total, "failures": failures}
