"""Time from a transition to the Slurm node back in service with the new GRES.

Runs migd's day->night switch on a real one-node Slurm cluster (tests/slurm_cluster.py: needs
root and Debian's slurmctld/slurmd/munge) over the simulated GPU, and beside it, in the same run,
the bare Slurm part done by hand (write the files, stop slurmd, restart slurmctld, start slurmd,
wait for registration) as the reference.  Prints the total, the Slurm part, the NVML apply and
what is left: migd's own work (planning, journal, GRES rendering, bookkeeping).

    python3 bench/slurm_switch.py [--reps N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from migd.config.migdyaml import load_config  # noqa: E402
from migd.daemon.clock import Clock  # noqa: E402
from migd.daemon.service import Daemon  # noqa: E402
from migd.hardware.caps import read_minors  # noqa: E402
from migd.hardware.ports import read_state  # noqa: E402
from migd.sim.backend import sim_backend  # noqa: E402
from migd.slurm.gres import gres_conf, node_gres, records  # noqa: E402
from tests.helpers import PROFILES, Migctl  # noqa: E402
from tests.slurm_cluster import SlurmCluster, missing_reason  # noqa: E402

NIGHT = datetime.fromisoformat("2026-11-23T19:00:05+09:00")
CONFIG = """\
timezone: Asia/Seoul
profiles_dir: profiles
schedule:
  - {profile: day, at: "08:30", days: mon-fri}
  - {profile: night, at: "19:00", days: mon-fri}
metrics: {enabled: false}
"""


class Timer:
    """Time spent in the wrapped calls; a call made inside another wrapped call counts once."""

    def __init__(self) -> None:
        self.total = 0.0
        self.depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.total += time.perf_counter() - t0
        return timed


def migd_switch(tmp: Path) -> dict[str, float]:
    m = Migctl(tmp, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    (tmp / "profiles").mkdir()
    for f in PROFILES.glob("*.yaml"):
        shutil.copy(f, tmp / "profiles" / f.name)
        os.chmod(tmp / "profiles" / f.name, 0o644)
    backend = sim_backend(m.state, "single-a100")
    c = SlurmCluster(gpus=1)
    try:
        recs = records([read_state(backend, g) for g in backend.list_gpus()], backend.minor_number,
                       read_minors(c.mig_minors), c.dev)
        c.start(node_gres(recs), gres_conf(c.node, recs, "day"))
        (tmp / "migd.yaml").write_text(CONFIG + c.slurm_section())
        os.chmod(tmp / "migd.yaml", 0o644)
        d = Daemon(load_config(tmp / "migd.yaml"), backend, m.state_dir, Clock(NIGHT))
        assert d.slurm is not None
        slurm = Timer()
        gate = d.slurm.gate
        gate._run = slurm.wrap(gate._run)  # type: ignore[method-assign]
        gate.ctl._run = slurm.wrap(gate.ctl._run)  # type: ignore[method-assign]
        gate._until = slurm.wrap(gate._until)  # type: ignore[method-assign]
        apply = Timer()
        d.applier.apply_plans = apply.wrap(d.applier.apply_plans)  # type: ignore[method-assign]
        t0 = time.perf_counter()
        d.reconcile("transition")
        total = time.perf_counter() - t0
        assert c.show()["Gres"] == "gpu:7g.80gb:1" and "DRAIN" not in c.state(), c.show()
        return {"total": total, "slurm": slurm.total, "apply": apply.total,
                "migd": total - slurm.total - apply.total}
    finally:
        backend.close()
        c.stop()


def by_hand() -> float:
    """The reference: the same Slurm sequence as shell commands, timed from the file write."""
    c = SlurmCluster(gpus=1)
    try:
        c.start("gpu:1g.10gb:1", f"NodeName={c.node} Name=gpu Type=1g.10gb MultipleFiles={c.dev}/nvidia0,"
                f"{c.dev}/nvidia-caps/nvidia-cap66,{c.dev}/nvidia-caps/nvidia-cap67\n")
        cmds = c.restart_commands()
        c.cmd("scontrol", "update", f"nodename={c.node}", "state=drain", "reason=bench")
        t0 = time.perf_counter()
        c.gres_conf.write_text(f"NodeName={c.node} Name=gpu Type=7g.80gb MultipleFiles={c.dev}/nvidia0,"
                               f"{c.dev}/nvidia-caps/nvidia-cap3,{c.dev}/nvidia-caps/nvidia-cap4\n")
        c.conf.write_text(c.conf.read_text().replace("Gres=gpu:1g.10gb:1", "Gres=gpu:7g.80gb:1"))
        for step in ("stop_slurmd", "restart_slurmctld"):
            c.cmd(*cmds[step])
        c.wait(lambda: c.ok("scontrol", "ping"), "slurmctld")
        c.cmd(*cmds["start_slurmd"])
        c.wait(lambda: c.show().get("Gres") == "gpu:7g.80gb:1" and "NOT_RESPONDING" not in c.state(), "register")
        c.cmd("scontrol", "update", f"nodename={c.node}", "state=resume")
        return time.perf_counter() - t0
    finally:
        c.stop()


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    reason = missing_reason()
    if reason is not None:
        print(f"slurm switch benchmark skipped: {reason}")
        return 0
    runs, refs = [], []
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="migd-bench-") as d:
            runs.append(migd_switch(Path(d)))
        refs.append(by_hand())
    med = {k: median([r[k] for r in runs]) for k in runs[0]}
    print(f"{'Slurm day->night switch, 1 node, median of ' + str(args.reps):<52} {'migd':>10} {'by hand':>10}")
    print("-" * 74)
    print(f"{'transition -> node in service with the new GRES':<52} {med['total']:>9.2f}s {median(refs):>9.2f}s")
    print(f"{'  of which Slurm (commands, restart, registration)':<52} {med['slurm']:>9.2f}s")
    print(f"{'  of which the NVML apply (simulated driver)':<52} {med['apply']:>9.2f}s")
    print(f"{'  of which migd itself':<52} {med['migd']:>9.2f}s  ({100 * med['migd'] / med['total']:.0f}%)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
