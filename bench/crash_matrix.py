#!/usr/bin/env python3
"""Crash at every step: SIGKILL the applying process after each NVML mutation in turn.

For each fleet and transition, the old profile is applied, then a forked child applies
the new one and the simulated driver kills it (SIGKILL) right after its k-th mutating
NVML call, for k = 1 .. every mutation the transition makes.  Recovery then runs as the
next migd/migctl start would.  Every GPU must end in either the old or the new layout,
the journal must be gone, and a process running on an instance both layouts keep must
still be there.

An owner change (the same layout, other owners) is killed after each of its file-system
steps instead (``crash_access.py``: it makes no NVML call; as root only).

    python3 bench/crash_matrix.py            # full matrix (dgx-a100, dgx-h100; 3 transitions)
    python3 bench/crash_matrix.py --sample 64  # every 64th NVML step, first and last (what pytest runs)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.crash_access import run_access  # noqa: E402
from migd.apply.executor import Applier  # noqa: E402
from migd.apply.relabel import labels_of  # noqa: E402
from migd.apply.result import ApplyOptions  # noqa: E402
from migd.profiles.loader import load_profile  # noqa: E402
from migd.sim import world  # noqa: E402
from migd.sim.backend import sim_backend  # noqa: E402
from migd.sim.state import StateStore  # noqa: E402

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
TRANSITIONS = [("day", "night"), ("night", "day"), ("balanced", "day")]


def layout_matches(applier: Applier, name: str) -> dict[int, bool]:
    """Each GPU: whether it holds the profile's layout with the profile's owner labels (labels that
    lag behind the layout would grant its instances by the other layout's owners)."""
    owners = applier.owners.load()
    return {p.gpu.index: not p.changes and labels_of(p) == owners.get(p.gpu.uuid, {})
            for p in applier.plan(load_profile(PROFILES / f"{name}.yaml"))}


def run_transition(fleet: str, old: str, new: str, sample: int, workdir: Path) -> dict[str, object]:
    state, sdir = workdir / f"{fleet}-{old}-{new}.json", workdir / f"{fleet}-{old}-{new}.d"
    backend = sim_backend(state, fleet)
    applier = Applier(backend, sdir)
    applier.apply(load_profile(PROFILES / f"{old}.yaml"))
    store = StateStore(state)
    keeper = None
    if (old, new) == ("balanced", "day"):  # a busy instance that both layouts keep (a 1g of balanced)
        gi = next(g for g in store.read().gpus[0].gis if g.size == 1)
        keeper = world.start_process(store, 0, gi.id, 0)
    snapshot, owners = state.read_bytes(), (sdir / "owners.json").read_bytes()
    before = store.read().mutations
    applier.apply(load_profile(PROFILES / f"{new}.yaml"))
    total = store.read().mutations - before
    backend.close()
    failures: list[str] = []
    steps = [k for k in range(1, total + 1) if k % sample == 0 or k in (1, total)]
    for k in steps:
        state.write_bytes(snapshot)
        (sdir / "owners.json").write_bytes(owners)
        world.crash_after_mutations(store, k)
        pid = os.fork()
        if pid == 0:  # the applying process
            try:
                child = Applier(sim_backend(state, fleet), sdir)
                child.apply(load_profile(PROFILES / f"{new}.yaml"), ApplyOptions(on_busy="refuse"))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9):
            failures.append(f"k={k}: the apply was not killed (status {status})")
            continue
        world.crash_after_mutations(store, None)
        fresh = sim_backend(state, fleet)  # the next start
        recovering = Applier(fresh, sdir)
        recovering.recover()
        old_ok, new_ok = layout_matches(recovering, old), layout_matches(recovering, new)
        bad = [i for i in old_ok if not (old_ok[i] or new_ok[i])]
        if bad:
            failures.append(f"k={k}: GPU(s) {bad} in neither layout (with its owners)")
        if (sdir / "journal.json").exists():
            failures.append(f"k={k}: journal left behind")
        if keeper is not None and not any(p.pid == keeper for p in store.read().gpus[0].processes):
            failures.append(f"k={k}: the busy instance's process is gone")
        fresh.close()
    return {"fleet": fleet, "transition": f"{old}->{new}", "mutations": total, "scenarios": len(steps),
            "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=1, help="crash after every Nth mutation only")
    ap.add_argument("--fleets", default="dgx-a100,dgx-h100")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fleet in args.fleets.split(","):
            for old, new in TRANSITIONS:
                rows.append(run_transition(fleet, old, new, max(1, args.sample), Path(tmp)))
        if os.geteuid() == 0:  # the capability nodes are real character devices
            rows += run_access(Path(tmp), PROFILES)
        else:
            print("owner changes not run: they need root (mknod)", file=sys.stderr)
    total = sum(int(str(r["scenarios"])) for r in rows)
    failed = [f for r in rows for f in r["failures"]]  # type: ignore[attr-defined]
    if args.json:
        print(json.dumps({"rows": rows, "scenarios": total, "failures": failed,
                          "seconds": round(time.monotonic() - t0, 1)}))
    else:
        print(f"{'fleet':<10} {'transition':<15} {'mutations':>9} {'scenarios':>9} {'failures':>8}")
        for r in rows:
            print(f"{r['fleet']:<10} {r['transition']:<15} {r['mutations']:>9} {r['scenarios']:>9} "
                  f"{len(r['failures']):>8}")  # type: ignore[arg-type]
        print(f"crash scenarios run: {total}, failures: {len(failed)}, {time.monotonic() - t0:.0f}s")
        for f in failed:
            print("  FAIL", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
