"""The crash matrix's access-by-owner part: SIGKILL an apply after each file-system step in turn.

With access by owner an apply also writes: the journal, each capability node's chmod/chown/mknod,
each /proc capability file (``DeviceFileModify``), the owner labels.  The applying child counts those
calls and kills itself right after the k-th, for k = 1 .. all of them, in two transitions on one A100:

- an owner change (day's instances from notebooks, team A, to training, team B; no NVML call): at the
  cut no instance labelled the new owner's is open to the old owner's group; after recovery and a
  reconcile (what the next migd start does) every instance is the new owner's once the journal was
  written (before it, nothing had begun: the old owner's);
- a re-cut (day, team A's, to night, training's): at the cut no instance the apply created is open
  to anyone but the owner its label already names (the GPU was closed before its first change, each
  new instance sealed as it was made, opened only once its labels were written);
  after recovery and a reconcile the GPU holds day open to A alone or night open to B alone.

No journal may be left either way.  Needs root (the capability nodes are real character devices).
"""

from __future__ import annotations

import grp
import os
import shutil
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from migd.access.enforce import AccessControl
from migd.access.policy import AccessPolicy, Grant, Unowned
from migd.apply.executor import Applier
from migd.hardware.caps import CapsPaths, ci_cap, gi_cap, read_minors
from migd.profiles.loader import load_profile
from migd.sim import caps, caps_tree
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore

STEPS = ("chmod", "chown", "mknod", "replace", "unlink")  # what an apply with access by owner changes on disk
FLEET = "single-a100"


def _teams() -> tuple[grp.struct_group, grp.struct_group]:
    pool = {g.gr_name: g for g in grp.getgrall() if 0 < g.gr_gid < 1000}
    if "audio" in pool and "video" in pool:
        return pool["audio"], pool["video"]
    a, b = list(pool.values())[:2]
    return a, b


def _counting(limit: int | None, seen: list[int]) -> None:
    """Wrap the os calls an apply writes with: count each; SIGKILL this process after the limit-th."""
    for name in STEPS:
        real: Callable[..., Any] = getattr(os, name)

        def step(*args: Any, _real: Callable[..., Any] = real, **kw: Any) -> Any:
            out = _real(*args, **kw)
            seen[0] += 1
            if limit is not None and seen[0] >= limit:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        setattr(os, name, step)


def _open_to(root: Path, backend: Any, gid: int) -> dict[tuple[int, int], bool]:
    """Each GI of GPU 0, by (profile id, placement start): whether any of its nodes is readable by
    group ``gid`` (or by everyone)."""
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
        out[(gi.profile_id, gi.placement.start)] = open_
    return out


class Node:
    """One simulated A100 with its capability tree and migd's state, applied to over and over."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.a, self.b = _teams()
        self.state, self.sdir, self.root = workdir / f"{name}.json", workdir / f"{name}.d", workdir / f"{name}-caps"
        self.policy = AccessPolicy({"notebooks": Grant(self.a.gr_name), "training": Grant(self.b.gr_name)},
                                   Unowned.ROOT, CapsPaths(self.root))
        self.total = 0

    def fresh(self) -> tuple[Applier, AccessControl, Any]:
        """What a (re)started migd has: an applier with access control over a new NVML session."""
        be = sim_backend(self.state, FLEET)
        ap = Applier(be, self.sdir)
        ap.access = AccessControl(self.policy, be, ap.owners.load)
        return ap, ap.access, be

    def cuts(self, profile: Path) -> int:
        """How many writes a whole apply of ``profile`` makes (counted in a child, nothing kept)."""
        snapshot, labels = self.state.read_bytes(), (self.sdir / "owners.json").read_bytes()
        counted = [0]
        pid = os.fork()
        if pid == 0:
            _counting(None, counted)
            self.fresh()[0].apply(load_profile(profile))
            os._exit(min(counted[0], 255))
        _, status = os.waitpid(pid, 0)
        self.restore(snapshot, labels)
        return os.WEXITSTATUS(status)

    def restore(self, snapshot: bytes, labels: bytes) -> None:
        self.state.write_bytes(snapshot)
        (self.sdir / "owners.json").write_bytes(labels)
        paths = CapsPaths(self.root)
        for d in paths.proc_caps.glob("gpu*/mig/gi*"):  # the driver's /proc tree, as restored
            shutil.rmtree(d)
        for node in paths.dev.iterdir():  # no node but those the reconcile below makes (as after a boot)
            node.unlink()
        with StateStore(self.state).transaction() as s:
            s.caps_synced = []
            caps_tree.sync(s)
        ap, ac, be = self.fresh()
        ac.reconcile()
        be.close()

    def each_cut(self, day: Path, profile: Path, what: str, failures: list[str]) -> Iterator[int]:
        """Day applied and open to its owners, then ``profile`` applied and killed after each write in
        turn: yields k with the node as the kill left it (a child that was not killed is a failure)."""
        Applier(sim_backend(self.state, FLEET), self.sdir).apply(load_profile(day))
        caps.enable(StateStore(self.state), self.root)
        ap, ac, be = self.fresh()
        ac.reconcile()
        be.close()
        snapshot, labels = self.state.read_bytes(), (self.sdir / "owners.json").read_bytes()
        self.total = self.cuts(profile)
        for k in range(1, self.total + 1):
            self.restore(snapshot, labels)
            why = self.killed_at(k, profile)
            if why is None:
                yield k
            else:
                failures.append(f"{what} k={k}: not killed ({why})")

    def killed_at(self, k: int, profile: Path) -> str | None:
        """Apply ``profile`` in a child killed after its k-th write; None, or why it was not killed."""
        child = os.fork()
        if child == 0:
            _counting(k, [0])
            self.fresh()[0].apply(load_profile(profile))
            os._exit(0)
        _, status = os.waitpid(child, 0)
        return None if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL else f"status {status}"


def run_relabel(workdir: Path, profiles: Path) -> dict[str, object]:
    """day (notebooks: team A) relabelled to training (team B), killed at every write."""
    n = Node(workdir, "relabel")
    day, moved = profiles / "day.yaml", workdir / "day-training.yaml"
    moved.write_text(day.read_text().replace("owner: notebooks", "owner: training"))
    failures: list[str] = []
    for k in n.each_cut(day, moved, "relabel", failures):
        begun = (n.sdir / "journal.json").exists()  # the relabel had begun: recovery finishes it
        now, check, be = n.fresh()
        labelled_b = {s for s, o in now.owners.load().get(be.gpu(0).uuid, {}).items() if o == "training"}
        leaked = sorted(s for (_, s), open_ in _open_to(n.root, be, n.a.gr_gid).items() if open_ and s in labelled_b)
        if leaked:
            failures.append(f"relabel k={k}: GIs at {leaked} labelled training are open to notebooks' group")
        now.recover()
        check.reconcile()
        winner, loser = (n.b, n.a) if begun or labelled_b else (n.a, n.b)
        if any(_open_to(n.root, be, loser.gr_gid).values()) or not all(_open_to(n.root, be, winner.gr_gid).values()):
            failures.append(f"relabel k={k}: after recovery not every instance is {winner.gr_name}'s alone")
        if (n.sdir / "journal.json").exists():
            failures.append(f"relabel k={k}: journal left behind")
        be.close()
    return {"fleet": FLEET, "transition": "day: notebooks->training", "mutations": n.total, "scenarios": n.total,
            "failures": failures}


def run_recut(workdir: Path, profiles: Path) -> dict[str, object]:
    """day (notebooks: team A) to night (training: team B) with access by owner, killed at every write."""
    n = Node(workdir, "recut")
    failures: list[str] = []
    before: set[tuple[int, int]] = set()
    for k in n.each_cut(profiles / "day.yaml", profiles / "night.yaml", "re-cut", failures):
        now, check, be = n.fresh()
        before = before or {key for key, _ in _day_instances(n, profiles)}
        said = now.owners.load().get(be.gpu(0).uuid, {})
        made = {key for key, open_ in _open_to(n.root, be, n.a.gr_gid).items() if open_ and key not in before}
        made |= {key for key, open_ in _open_to(n.root, be, n.b.gr_gid).items()
                 if open_ and key not in before and said.get(key[1]) != "training"}
        if made:
            failures.append(f"re-cut k={k}: instances {sorted(made)} made by the apply are open at the cut, and not "
                            "to the owner their label names")
        now.recover()
        check.reconcile()
        to_a, to_b = _open_to(n.root, be, n.a.gr_gid), _open_to(n.root, be, n.b.gr_gid)
        day_a = set(to_a) == before and all(to_a.values()) and not any(to_b.values())
        night_b = len(to_b) == 1 and all(to_b.values()) and not any(to_a.values())
        if not (day_a or night_b):
            failures.append(f"re-cut k={k}: after recovery neither day open to A alone nor night to B alone")
        if (n.sdir / "journal.json").exists():
            failures.append(f"re-cut k={k}: journal left behind")
        be.close()
    return {"fleet": FLEET, "transition": "day->night with access", "mutations": n.total, "scenarios": n.total,
            "failures": failures}


def _day_instances(n: Node, profiles: Path) -> list[tuple[tuple[int, int], str]]:
    """Day's instances on this GPU, by (GI profile id, placement start), planned afresh."""
    ap, _, be = n.fresh()
    plan = ap.plan(load_profile(profiles / "day.yaml"))[0]
    be.close()
    return [((t.gi_profile_id, t.placement.start), t.owner or "") for t in plan.targets]


def run_access(workdir: Path, profiles: Path) -> list[dict[str, object]]:
    return [run_relabel(workdir, profiles), run_recut(workdir, profiles)]
