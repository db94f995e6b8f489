"""What a mig-parted operator still tripped on at migctl: each through the
real migctl process, as typed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import MIGCTL, PROFILES, REFERENCE, Migctl, migctl_as, need_root

pytestmark = pytest.mark.integration  # migctl and migd as programs

MIG_PARTED = str(REFERENCE / "mig-parted-config-default.yaml")


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="dgx-a100")
    yield m
    m.close()


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    line, = err.splitlines()
    return line


# --- 10a: mig-parted's own flags --------------------------------------------------------------------

def test_mig_parteds_flags_carry_over(tmp_path: Path) -> None:
    """``migctl apply -f config.yaml -c all-1g.10gb`` was "unrecognized arguments": -f/--config-file,
    -c/--selected-config, -m/--mode-only and -k/--hooks-file are mig-parted's (its apply and assert)."""
    m = Migctl(tmp_path, "dgx-a100")
    r = m.process("plan", "-f", MIG_PARTED, "-c", "all-1g.10gb")
    assert r.returncode == 0 and r.stdout.startswith("all-1g.10gb: 8 GPU(s) to change"), r
    r = m.process("apply", "-f", MIG_PARTED, "-c", "all-1g.10gb")
    assert r.returncode == 0 and r.stdout.startswith("all-1g.10gb: applied in "), r
    r = m.process("assert", "--config-file", MIG_PARTED, "--selected-config", "all-1g.10gb")
    assert (r.returncode, r.stdout) == (0, "all-1g.10gb: applied on 8 GPU(s)\n"), r
    r = m.process("assert", "-m", "-f", MIG_PARTED, "-c", "all-disabled")  # the mode alone: not applied
    assert r.returncode == 1 and r.stdout.startswith("all-disabled: NOT applied (8 of 8"), r
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text("version: v1\nhooks: {}\n")
    hooks.chmod(0o600)
    r = m.process("apply", "--dry-run", "-k", str(hooks), "-f", MIG_PARTED, "-c", "all-1g.10gb")
    assert r.returncode == 0 and "dry run, nothing changed" in r.stdout, r


@pytest.mark.parametrize(("args", "says"), [
    ((MIG_PARTED, "-f", MIG_PARTED, "-c", "all-1g.10gb"), "the file is given twice"),
    (("-c", "all-1g.10gb"), "the following arguments are required: FILE (or -f/--config-file FILE)"),
])
def test_the_file_is_given_once(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    r = Migctl(tmp_path, "dgx-a100").process("apply", *args)
    assert r.returncode == 2 and r.stdout == "", r
    line = _one_line(r.stderr)
    assert line.startswith("migctl apply: error: ") and says in line, line


# --- 9: one clear line for a bad value ----------------------------------------------------------------

def test_an_unknown_on_busy_lists_words_not_enum_reprs(tmp_path: Path) -> None:
    r = Migctl(tmp_path, "dgx-a100").process("apply", "--on-busy", "kill", str(PROFILES / "night.yaml"))
    assert r.returncode == 2 and r.stdout == "", r
    line = _one_line(r.stderr)
    assert "invalid choice: 'kill' (choose from 'refuse', 'wait', 'force')" in line and "OnBusy" not in line, line


@pytest.mark.parametrize("value", [["--busy-timeout", "-5m"], ["--busy-timeout=-5m"], ["--busy-timeout", "-90"]])
def test_a_negative_duration_is_refused_in_words(tmp_path: Path, value: list[str]) -> None:
    """``--busy-timeout -5m`` said "expected one argument": argparse took -5m for an option."""
    r = Migctl(tmp_path, "dgx-a100").process("apply", *value, str(PROFILES / "night.yaml"))
    assert r.returncode == 2 and r.stdout == "", r
    line = _one_line(r.stderr)
    assert line.startswith("migctl apply: error: argument --busy-timeout: a duration cannot be negative, not '-"), line


@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "directory", "stdin not UTF-8", "stdin endless"])
def test_a_profile_that_is_not_a_regular_file_is_one_line_not_a_hang(tmp_path: Path, source: str) -> None:
    """A FIFO blocked migctl for ever and /dev/zero read until memory ran out; bytes on standard input
    that are not UTF-8 were a traceback.  Each is refused in one line naming it, exit 2."""
    m = Migctl(tmp_path, "dgx-a100")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    path = {"fifo": str(fifo), "/dev/zero": "/dev/zero", "directory": str(tmp_path)}.get(source, "-")
    stdin = {"stdin not UTF-8": b"name: \xff\n", "stdin endless": None}.get(source, b"")
    cmd = [*MIGCTL, "--sim", m.fleet, "--sim-state", str(m.state), "--state-dir", str(m.state_dir), "plan", path]
    if stdin is None:
        with open("/dev/zero", "rb") as zero:
            r = subprocess.run(cmd, stdin=zero, capture_output=True, timeout=60)
    else:
        r = subprocess.run(cmd, input=stdin, capture_output=True, timeout=60)
    err = r.stderr.decode()
    said = path if path != "-" else "<stdin>"
    assert r.returncode == 2 and err.startswith(f"error: {said}: ") and err.count("\n") == 1, (r.returncode, err)


@pytest.mark.parametrize("cmd", [("status",), ("apply", "--local", str(PROFILES / "day.yaml"))])
def test_a_state_dir_that_is_a_file_is_one_line_naming_it(tmp_path: Path, cmd: tuple[str, ...]) -> None:
    """It was ``not applied: Not a directory`` (no path), exit 1, for a read-only status too."""
    m = Migctl(tmp_path, "dgx-a100")
    m.state_dir.write_text("")
    r = m(*cmd)
    assert (r.code, r.out, r.err) == (2, "", f"error: {m.state_dir}: the state dir is not a directory\n"), r


def test_resume_as_an_ordinary_user_says_who_may(tmp_path: Path) -> None:
    """It printed ``not permitted: [Errno 13] Permission denied: Permission denied (...)``."""
    need_root("to become another user")
    m = Migctl(tmp_path, "dgx-a100")
    assert m("status").code == 0  # makes the state dir, root's and 0700: its socket is out of reach
    run = Path(tempfile.mkdtemp(prefix="migd-run-", dir="/tmp"))
    try:
        run.chmod(0o755)
        (run / "migd").mkdir(mode=0o700)  # as /run/migd
        sock = run / "migd" / "world.sock"
        for cmd in (["resume"], ["clear-fault", "0"], ["reload"]):
            code, out, err = migctl_as(65534, 65534, ["--control-socket", str(sock), *cmd])
            assert (code, out) == (1, ""), (cmd, code, out, err)
            line = _one_line(err)
            assert line == (f"not permitted: `migctl {cmd[0]}` asks migd through its control socket {sock}, which "
                            f"only root may use (sudo migctl {cmd[0]})"), line
    finally:
        shutil.rmtree(run)


# --- 9: plan's words add up; doctor's columns line up --------------------------------------------------

def test_a_plans_words_add_up_to_its_count(tmp_path: Path) -> None:
    """"16 operation(s) (enable MIG, create 7 GI, create 7 CI)" named 15: the conditional reset."""
    r = Migctl(tmp_path, "dgx-a100").process("plan", "-v", str(PROFILES / "day.yaml"))
    assert r.returncode == 0, r
    lines = r.stdout.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"GPU \d+ \(.*?\): .*?: (\d+) operation\(s\) \((.*)\), \d+ instance", line)
        if m is None:
            continue
        said = sum(int(n.group(1)) if (n := re.search(r" (\d+) ", f" {w} ")) else 1 for w in m.group(2).split(", "))
        listed = next((n for n, x in enumerate(lines[i + 1:]) if not x.startswith("  ")), len(lines) - i - 1)
        assert said == int(m.group(1)) == listed, line


@pytest.mark.parametrize("verbose", [(), ("-v",)])
def test_doctors_columns_line_up_with_gpu_ranges(tmp_path: Path, verbose: tuple[str, ...]) -> None:
    r = Migctl(tmp_path, "dgx-a100").process("doctor", *verbose)
    assert r.returncode == 0, r
    rows = [re.match(r"(node|GPU [\d,-]+) +\S", line) for line in r.stdout.splitlines()[1:]]
    assert len({row.end() if row else None for row in rows}) == 1, r.stdout  # one column, where it starts


# --- 8: tables lead with a summary and group GPUs that read the same; -v: every GPU --------------------

def test_tables_group_gpus_and_verbose_lists_every_one(tmp_path: Path) -> None:
    """``status`` printed 64 lines for 8 GPUs and no summary; ``-v`` changed nothing, nor for ``assert``
    and ``isolation`` (the goldens pin each table at each verbosity)."""
    m = Migctl(tmp_path, "dgx-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    night = str(PROFILES / "night.yaml")
    status, everything = m.process("status"), m.process("status", "-v")
    assert status.stdout.splitlines() == [
        "status: 8 GPU(s), MIG enabled on 8, 56 MIG device(s); no processes; -v lists every MIG device with its UUID",
        "GPU 0-7 (A100-SXM4-80GB): MIG enabled: 7x1g.10gb (owner notebooks)"], status.stdout
    assert everything.stdout.count(" MIG-") == 56 and everything.stdout.startswith("status: 8 GPU(s)"), everything
    for cmd in (("assert", night), ("isolation", "--profile", night)):
        short, long = m.process(*cmd), m.process(*cmd, "-v")
        assert len(short.stdout.splitlines()) <= 9 and len(long.stdout.splitlines()) > 8 * 1, (short, long)
        assert short.stdout.splitlines()[0].split(";")[0] == long.stdout.splitlines()[0].split(";")[0], (short, long)


# --- 9: a busy refusal through migd is a document too --------------------------------------------------

def test_a_busy_refusal_through_migd_writes_its_apply_document(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T10:00:00")  # Monday 10:00 KST: day
    migd.wait_ready()
    store = StateStore(migd.migctl.state)
    world.start_process(store, 0, store.read().gpus[0].gis[0].id, 0)
    r = migd.migctl.process("apply", str(PROFILES / "night.yaml"), "-o", "json")
    assert r.returncode == 3, r
    assert _one_line(r.stderr).startswith("error (from migd): instances with running processes"), r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "migd.apply/v1" and doc["ok"] is False and doc["results"] == [], doc
    assert doc["error"].startswith("instances with running processes would be destroyed: GPU 0: "), doc["error"]
    assert doc["gpus"][0]["operations"][0]["busy_pids"], doc["gpus"][0]
    assert migd.assert_profile("day")


# --- 6: a local apply while migd is stopped, and a manual apply kept on disk ---------------------------

def test_a_local_apply_takes_the_place_of_a_kept_manual_apply(migd: MigdProcess) -> None:
    """A local apply made while migd was stopped was undone at migd's next start by the older manual apply
    kept on disk, and the local apply said nothing of it."""
    migd.start(now="2026-11-23T10:00:00")  # Monday 10:00 KST: day; 19:00 KST is 10:00 UTC
    migd.wait_ready()
    r = migd.migctl.process("apply", str(PROFILES / "balanced.yaml"))
    assert r.returncode == 0 and "balanced holds until 2026-11-23T10:00:00+00:00" in r.stdout, r
    assert migd.stop() == 0
    r = migd.migctl.process("apply", "--mode-only", str(PROFILES / "night.yaml"))  # leaves the instances: no
    assert r.returncode == 0, r
    kept = migd.migctl.state_dir / "override.json"
    assert r.stdout.splitlines()[-1] == (f"the kept manual apply of balanced ({kept}) still holds: migd puts it "
                                         "back at its next start, until 2026-11-23T10:00:00+00:00; `migctl resume` "
                                         "drops it"), r.stdout
    r = migd.migctl.process("apply", str(PROFILES / "night.yaml"))
    assert r.returncode == 0 and r.stderr == "", r
    assert r.stdout.splitlines()[-1] == ("night holds in place of the kept manual apply of balanced until "
                                         "2026-11-23T10:00:00+00:00: migd takes it up at its next start; "
                                         "`migctl resume` drops it"), r.stdout
    migd.start(now="2026-11-23T11:00:00")  # 11:00 KST: still before the transition the hold lasts until
    migd.wait_ready()
    assert migd.assert_profile("night"), migd.migctl.layout()
    doc = migd.control({"cmd": "status"})["daemon"]
    assert doc["active"]["reason"] == "manual" and doc["override"]["profile"] == "night", doc["active"]
    assert doc["override"]["until"] == "2026-11-23T10:00:00+00:00", doc["override"]
