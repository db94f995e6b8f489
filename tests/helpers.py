"""Shared test helpers: run migctl in-process against a simulated fleet."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from migd.ctl.migctl import main

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"
REFERENCE = REPO / "tests" / "fixtures" / "reference"  # copies, see SOURCES.md there
GOLDEN = REPO / "tests" / "golden"


def required_tool(name: str, require_env: str, install: str) -> str:
    """The path of a program a test needs; without it the test skips with a reason, or fails where
    CI installed it and said so (``require_env``=1)."""
    import shutil

    import pytest
    path = shutil.which(name)
    if path is None:
        if os.environ.get(require_env) == "1":
            pytest.fail(f"{name} is missing ({install})")
        pytest.skip(f"{name} is not installed ({install}; .ci/run installs it)")
    return path


def check_golden(name: str, text: str) -> None:
    """Pin ``text`` byte for byte; ``MIGD_UPDATE_GOLDEN=1`` rewrites the file (review the diff)."""
    path = GOLDEN / name
    if os.environ.get("MIGD_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with MIGD_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} differs from its golden file (MIGD_UPDATE_GOLDEN=1 rewrites it)"


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


MIGCTL = [sys.executable, "-m", "migd.ctl.migctl"]  # migctl as the console script runs it
NO_JOBS = '{"jobs": []}'  # squeue --json of an empty queue


class Migctl:
    """migctl bound to one simulator state file and state dir."""

    def __init__(self, tmp: Path, fleet: str) -> None:
        self.fleet = fleet
        self.state = tmp / f"{fleet}.json"
        self.state_dir = tmp / f"{fleet}.d"

    def __call__(self, *args: str) -> Run:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(["--sim", self.fleet, "--sim-state", str(self.state), "--state-dir", str(self.state_dir),
                         *args])
        return Run(code, out.getvalue(), err.getvalue())

    def process(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """migctl as the user runs it: its own process, bound to the same node and state dir."""
        return subprocess.run([*MIGCTL, "--sim", self.fleet, "--sim-state", str(self.state),
                               "--state-dir", str(self.state_dir), *args], capture_output=True, text=True,
                              timeout=timeout)

    def layout(self) -> list[list[tuple[str, int, list[str]]]]:
        r = self("status", "-o", "json")
        assert r.code == 0, r.err
        doc = r.json()
        return [[(i["profile"], i["placement"]["start"], [c["profile"] for c in i["compute_instances"]])
                 for i in g["instances"]] for g in doc["gpus"]]


def migctl_as(uid: int, gid: int, argv: list[str]) -> tuple[int, str, str]:
    """migctl's main as user ``uid`` in group ``gid`` alone (a forked child that changed its ids; not
    exec'd: the interpreter may sit where that user cannot reach it): exit code, stdout, stderr."""
    outs = [os.pipe(), os.pipe()]
    pid = os.fork()
    if pid == 0:  # child
        code = 99
        try:
            for r, _ in outs:
                os.close(r)
            sys.stdout, sys.stderr = open(outs[0][1], "w"), open(outs[1][1], "w")  # noqa: SIM115
            os.setgroups([gid])
            os.setgid(gid)
            os.setuid(uid)
            code = main(argv)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    texts = []
    for _, w in outs:
        os.close(w)
    for r, _ in outs:
        with os.fdopen(r) as f:
            texts.append(f.read())
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), texts[0], texts[1]


def need_root(why: str) -> None:
    """Skip unless root; where CI runs as root (MIGD_REQUIRE_ROOT=1) a missing root fails instead."""
    if os.geteuid() == 0:
        return
    if os.environ.get("MIGD_REQUIRE_ROOT") == "1":
        pytest.fail(f"needs root ({why}); CI runs as root")
    pytest.skip(f"needs root: {why}")


def sampled(m: Migctl, profile: str | None = None) -> Any:
    """One sampler snapshot of ``m``'s node (after applying ``profile``, if given), read as migd's sampler
    reads it, with the owner labels of its state dir."""
    import threading

    from migd.apply.executor import Applier
    from migd.metrics.sampler import Sampler
    from migd.sim.backend import sim_backend
    if profile is not None:
        assert m("apply", str(PROFILES / f"{profile}.yaml")).code == 0
    backend = sim_backend(m.state, m.fleet)
    try:
        return Sampler(backend, threading.RLock(), Applier(backend, m.state_dir).owners.load, 60).sample_once()
    finally:
        backend.close()
