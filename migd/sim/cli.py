"""``migd-sim``: run any Python NVML program, or nvidia-smi, over a simulated fleet; and act on a
simulated node as the world does (``process start|stop``, ``xid``, ``lose``, ``return``, ``slow``:
:mod:`migd.sim.cli_control`).

``migd-sim exec --sim-state PATH -- COMMAND...`` runs COMMAND with two things added to its
environment: a ``sitecustomize`` module that, as the interpreter starts, makes pynvml load
the simulated C library for PATH (pynvml itself is untouched), and an ``nvidia-smi`` on
PATH that is the fake one over the same state.  A program nobody here wrote — gpustat,
a DCGM-less exporter, a notebook — then sees the simulated GPUs as it would see real ones.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from migd.sim.cli_control import add_commands, add_node_options, run
from migd.sim.state import DEFAULT_FLEET, FLEETS, open_store

_SITECUSTOMIZE = '''\
"""Added by migd-sim exec: pynvml loads the simulated NVML library (migd.sim.library)."""
import os
import sys
try:
    from migd.sim.library import load
    from migd.sim.state import StateStore
    load(StateStore(os.environ["MIGD_SIM_STATE"]))
except Exception as e:  # never keep the program from starting
    print(f"migd-sim: the simulated NVML library could not be loaded: {e}", file=sys.stderr)
'''


def _prepare(root: Path, state: Path) -> dict[str, str]:
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    (root / "bin").mkdir()
    smi = root / "bin" / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m migd.sim.smi \"$@\"\n")
    smi.chmod(0o755)
    env = dict(os.environ)
    env["MIGD_SIM_STATE"] = str(state)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root / "site"), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(root / "bin"), env.get("PATH", "")))
    return env


class _Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line (no usage block), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (-h for help)\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="migd-sim", description="Run programs over a simulated GPU fleet, and act on a simulated "
                  "node as the world does: CUDA processes, Xids, lost GPUs, a slow driver, the driver's device files "
                  "(docs/simulator.md).")
    sub = top.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("exec", help="run COMMAND with pynvml and nvidia-smi seeing the simulated fleet")
    ex.add_argument("--sim-state", required=True, help="the simulator's state file (created if missing)")
    ex.add_argument("--sim", default=DEFAULT_FLEET, choices=sorted(FLEETS),
                    help="fleet for a new state file (default: %(default)s)")
    ex.add_argument("--mig", action="store_true", help="a new state file starts with MIG mode on")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    common = _Parser(add_help=False)
    add_node_options(common)
    add_commands(sub, common)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    if args.command != "exec":
        return run(args)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        top.error("exec needs a command after --")
    state = Path(args.sim_state).resolve()
    try:
        open_store(state, args.sim, args.mig)
    except (OSError, ValueError) as e:
        print(f"migd-sim: {state}: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="migd-sim-") as tmp:
        try:
            return subprocess.run(cmd, env=_prepare(Path(tmp), state), check=False).returncode
        except OSError as e:
            print(f"migd-sim: cannot run {cmd[0]!r}: {e.strerror}", file=sys.stderr)
            return 127


if __name__ == "__main__":
    sys.exit(main())
