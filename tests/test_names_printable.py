"""Terminal control characters never reach a terminal (issue: "terminal control characters reach
terminals").  A name an operator writes in a file (a mig-parted config, an owner, a group, a Slurm node
or planner, a schedule entry) is refused at load when it holds an unprintable character, in one line
naming file and line, exit 2, nothing changed; mig-parted's names get no rule beyond that.  Text that
cannot be checked at load (Slurm's node names and drain reasons, NVML's strings, messages quoting them)
is shown escaped where it is written as text: migctl's tables, root's and every user's through the
read-only socket, migd's log lines, the page, /metrics labels.  JSON stays exact."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from migd.api.daemon import DaemonDoc
from migd.ctl.client import request
from migd.ctl.text import daemon_table
from migd.daemon.main import setup_logging
from migd.metrics.gpus import gpu_families
from migd.metrics.page import render_page
from migd.printable import shown
from migd.wire import from_json
from tests.daemon_harness import MigdProcess
from tests.helpers import GOLDEN, PROFILES, Migctl, migctl_as, need_root, sampled

NOBODY = 65534
# YAML's double-quoted escapes: each a character a terminal acts on, or one that reorders or splits a line
UNPRINTABLE = {"ESC": ("\\e[31m", "U+001B"), "BEL": ("\\a", "U+0007"), "newline": ("\\n", "U+000A"),
               "C1 CSI": ("\\x9b2J", "U+009B"), "line separator": ("\\u2028", "U+2028"),
               "bidi override": ("\\u202e", "U+202E"), "DEL": ("\\x7f", "U+007F")}
IDS = list(UNPRINTABLE)


def printable_text(text: str) -> bool:
    """Nothing a terminal would act on: every character printable, newlines only as line ends."""
    return all(c.isprintable() for line in text.split("\n") for c in line)


def _mig_parted(bad: str) -> str:
    return ("version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"
            f"  \"all-1g{bad}\":\n    - devices: all\n      mig-enabled: true\n      mig-devices: {{\"1g.10gb\": 7}}\n")


# -- (a) refused at load ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", IDS)
@pytest.mark.integration
def test_a_mig_parted_config_name_with_an_unprintable_character_is_refused(tmp_path: Path, kind: str) -> None:
    escape, code = UNPRINTABLE[kind]
    f = tmp_path / "mig.yaml"
    f.write_text(_mig_parted(escape))
    m = Migctl(tmp_path, "single-a100")
    assert m("status").code == 0
    before = m.state.read_bytes()
    for argv in (["apply", "-f", str(f), "-c", "all-disabled"], ["plan", str(f), "--config", "all-disabled"],
                 ["validate", str(f)]):
        p = m.process(*argv)
        assert p.returncode == 2 and p.stdout == "", (argv, p)
        assert p.stderr.startswith(f"error: {f}:6:3: mig-configs: ") and code in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1 and printable_text(p.stderr) and "Traceback" not in p.stderr, p.stderr
    assert m.state.read_bytes() == before  # nothing changed


def test_mig_parted_names_get_no_rule_beyond_that(tmp_path: Path) -> None:
    """mig-parted takes any YAML key: a printable name that migd's own names could not be still loads."""
    f = tmp_path / "mig.yaml"
    f.write_text(_mig_parted("").replace('"all-1g"', '"tout 1g, été (설정) #2"'))
    m = Migctl(tmp_path, "single-a100")
    r = m("plan", str(f), "--config", "tout 1g, été (설정) #2")
    assert r.code == 0 and r.out.startswith("tout 1g, été (설정) #2: 1 GPU(s) to change"), r


CONFIG = """\
timezone: Asia/Seoul
profiles_dir: profiles
schedule:
  - {profile: day, at: "08:30"}
  - {profile: night, at: "19:00"}
metrics: {enabled: false}
"""
# where a name is written in migd.yaml, and the line it is on there
IN_CONFIG = {
    "access owner": ('access: {owners: {"team%s": {group: root}}}\n', 7),
    "access group": ('access:\n  owners:\n    team: {group: "root%s"}\n', 9),
    "schedule entry": (None, 5),
    "slurm node": ('slurm: {node: "gpu1%s", partition: main}\n', 7),
    "slurm partition": ('slurm:\n  node: gpu1\n  partition: "main%s"\n', 9),
    "demand planner": ('slurm:\n  node: gpu1\n  partition: main\n  demand:\n    mode: dry-run\n'
                       '    planner: "gpu1%s"\n    candidates: [day, night]\n', 12),
}


def _check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(config), "--check"],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path)
    m.config.write_text(CONFIG)
    yield m
    m.close()


@pytest.mark.parametrize("kind", ["ESC", "BEL", "newline", "bidi override"])
@pytest.mark.parametrize("where", list(IN_CONFIG))
@pytest.mark.integration
def test_a_name_in_migd_yaml_with_an_unprintable_character_is_refused(migd: MigdProcess, where: str,
                                                                      kind: str) -> None:
    escape, code = UNPRINTABLE[kind]
    text, line = IN_CONFIG[where]
    if text is None:
        migd.config.write_text(CONFIG.replace("profile: night", f'profile: "night{escape}"'))
    else:
        migd.config.write_text(CONFIG + text % escape)
    p = _check(migd.config)
    assert p.returncode == 2 and p.stdout == "", p
    assert p.stderr.startswith(f"{migd.config}:{line}:") and code in p.stderr and "unprintable" in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and printable_text(p.stderr) and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("kind", ["ESC", "newline"])
@pytest.mark.integration
def test_a_mig_parted_file_among_migds_profiles_is_refused_on_its_line(migd: MigdProcess, kind: str) -> None:
    escape, code = UNPRINTABLE[kind]
    f = migd.tmp / "profiles" / "mig.yaml"
    f.write_text(_mig_parted(escape))
    f.chmod(0o644)
    p = _check(migd.config)
    assert p.returncode == 2 and p.stderr.startswith(f"{f}:6:3: mig-configs: ") and code in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and printable_text(p.stderr), p.stderr
    f.write_text(_mig_parted(""))  # the same file with printable names: its configs are migd's profiles
    p = _check(migd.config)
    assert p.returncode == 0 and "ok (6 profile(s)" in p.stdout, p


# -- (b) Slurm's text through the real daemon, to root and to every user ----------------------------------
NODE_NAME = "gpu2\x1b[1G\x1b[2KGPUs: 8 converged"  # (a forged "GPUs:" line on a terminal that acts on ESC)
REASON = "\x1b]0;owned\x07maint\u009b2J\u202eevil"  # a window title set, an 8-bit CSI, a bidi override
SCONTROL = """#!/bin/sh
case "$*" in
  "show node -o gpu1") cat {d}/gpu1 ;;
  "show node -o") cat {d}/gpu1 {d}/gpu2 ;;
esac
exit 0
"""


def _fake_scontrol(d: Path) -> Path:
    (d / "bin").mkdir()
    (d / "gpu1").write_bytes(b"NodeName=gpu1 Arch=x86_64 Gres=gpu:1g.10gb:7 State=IDLE Partitions=main "
                             b"Extra=(null) Reason=(null)\n")
    (d / "gpu2").write_bytes(f"NodeName={NODE_NAME} Arch=x86_64 Gres=(null) State=IDLE+DRAIN Partitions=main "
                             f"Extra=(null) Reason={REASON}\n".encode())
    script = d / "bin" / "scontrol"
    script.write_text(SCONTROL.format(d=d))
    script.chmod(0o755)
    queue = d / "bin" / "squeue"  # (the planner's queue: squeue --json, no job)
    queue.write_text("#!/bin/sh\necho '{\"jobs\": []}'\n")
    queue.chmod(0o755)
    return d / "bin"


@pytest.fixture
def planner(tmp_path: Path) -> Iterator[tuple[MigdProcess, Path]]:
    """migd as its partition's demand planner (dry-run) on a node whose Slurm knows a node named and
    drained by someone who writes escape sequences; its sockets where an ordinary user reaches them."""
    need_root("to become another user")
    run = Path(tempfile.mkdtemp(prefix="migd-run-", dir="/tmp"))
    run.chmod(0o755)
    (run / "migd").mkdir(mode=0o700)
    m = MigdProcess(tmp_path, "single-a100")
    bin_dir = _fake_scontrol(tmp_path)
    with m.config.open("a") as f:
        f.write(f"control_socket: {run / 'migd' / 'control.sock'}\n"
                f"slurm:\n  node: gpu1\n  partition: main\n  slurm_conf: {tmp_path / 'slurm.conf'}\n"
                f"  gres_conf: {tmp_path / 'gres.conf'}\n  mig_minors: {tmp_path / 'mig-minors'}\n"
                f"  env: {{PATH: '{bin_dir}:{os.environ['PATH']}'}}\n"
                "  demand: {mode: dry-run, planner: gpu1, candidates: [day, night], interval: 1s, lease: 1h}\n")
    assert m.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    m.start(now="2026-11-23T10:00:00")
    m.wait_ready()
    sock = run / "migd" / "control.sock"
    m.wait_until(lambda: bool((((request(sock, {"cmd": "status"}) or {})["daemon"].get("demand") or {})
                               .get("plan") or {}).get("skipped")))
    yield m, run
    m.close()
    shutil.rmtree(run, ignore_errors=True)


@pytest.mark.integration
def test_slurm_text_reaches_migctl_daemon_escaped_for_root_and_every_user(planner: tuple[MigdProcess, Path]) -> None:
    m, run = planner
    assert stat.S_IMODE((run / "migd-view" / "status.sock").stat().st_mode) == 0o666
    argv = ["--sim", m.fleet, "--sim-state", str(m.migctl.state), "--state-dir", str(m.migctl.state_dir),
            "--control-socket", str(run / "migd" / "control.sock"), "daemon"]
    code, out, err = migctl_as(NOBODY, NOBODY, argv)  # through the read-only socket
    assert code == 0 and err == "", (out, err)
    assert out == m.migctl(*argv[6:]).out  # what root reads
    assert printable_text(out) and not any(b < 0x20 and b != 0x0A for b in out.encode()), out
    assert [ln for ln in out.splitlines() if ln.startswith("GPUs:")] == ["GPUs: 1 converged"], out
    said = f"  skipped {shown(NODE_NAME)}: drained by an operator ({shown(REASON)})"
    assert said == "  skipped gpu2\\x1b[1G\\x1b[2KGPUs: 8 converged: drained by an operator " \
                   "(\\x1b]0;owned\\x07maint\\x9b2J\\u202eevil)" and said in out.splitlines(), out
    code, out, err = migctl_as(NOBODY, NOBODY, [*argv, "-o", "json"])  # the document stays exact
    assert code == 0 and f"{NODE_NAME}: drained by an operator ({REASON})" in \
        json.loads(out)["demand"]["plan"]["skipped"], out
    assert printable_text(m.log.read_text())  # (migd's own log lines too)
    m.assert_no_traceback()


# -- (c) migd's log lines ---------------------------------------------------------------------------------
def _formatter(journal: bool, monkeypatch: pytest.MonkeyPatch) -> logging.Formatter:
    """The formatter migd's start-up installs: journald's (``JOURNAL_STREAM`` set), or the plain one."""
    if journal:
        monkeypatch.setenv("JOURNAL_STREAM", "8:1234")
    else:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        setup_logging("info")
        formatter = root.handlers[0].formatter
    finally:
        root.handlers[:], root.level = kept
    assert formatter is not None
    return formatter


@pytest.mark.parametrize("journal", [True, False])
def test_one_log_record_is_one_escaped_line(journal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    formatter = _formatter(journal, monkeypatch)
    said = ("gpu2", REASON + "\n<2>forged")
    rec = logging.LogRecord("migd", logging.WARNING, __file__, 1, "Slurm: node %s: %s", said, None)
    line = formatter.format(rec)
    assert line.endswith("Slurm: node gpu2: \\x1b]0;owned\\x07maint\\x9b2J\\u202eevil\\n<2>forged"), line
    assert "\n" not in line and printable_text(line) and (line.startswith("<4>") if journal
                                                                  else " WARNING migd: " in line), line
    try:
        raise RuntimeError("boom\x1b[2J")
    except RuntimeError:
        rec = logging.LogRecord("migd", logging.ERROR, __file__, 1, "pass failed", (), sys.exc_info())
    line = formatter.format(rec)
    assert "\n" not in line and printable_text(line) and "Traceback (most recent call last):\\n" in line, line


# -- tables, the page, /metrics ---------------------------------------------------------------------------
def test_a_newline_in_a_reason_is_no_line_of_its_own() -> None:
    data = json.loads((GOLDEN / "daemon-failed.json").read_text())
    data["gpus"]["0"]["reason"] = "nvml says\nGPUs: 8 converged\x1b[2K"
    text = daemon_table(from_json(DaemonDoc, data))
    assert printable_text(text) and [ln for ln in text.splitlines() if ln.startswith("GPUs:")] == \
        ["GPUs: 1 converged, 2 failed, 1 waiting"], text
    assert "(nvml says\\nGPUs: 8 converged\\x1b[2K); next try" in text, text


def test_the_page_shows_unprintable_characters_as_escapes() -> None:
    status = {"active": {"profile": "day", "reason": "schedule"}, "unhealthy": {"GPU-1": "Xid\x1b[2J 79"},
              "gpus": {"0": {"state": "failed", "reason": f"Slurm: {REASON}\n<p>forged</p>"}}}
    page = render_page(None, status, 15).decode()
    assert printable_text(page), page  # (the stylesheet's newlines are the only ones)
    assert "Slurm: \\x1b]0;owned\\x07maint\\x9b2J\\u202eevil\\n&lt;p&gt;forged&lt;/p&gt;" in page, page
    assert "unhealthy GPU-1: Xid\\x1b[2J 79" in page, page


def test_an_nvml_name_with_an_esc_is_no_esc_in_metrics_labels(tmp_path: Path) -> None:
    snap = sampled(Migctl(tmp_path, "single-a100"), "day")
    g = snap.gpus[0]
    snap = replace(snap, gpus=(replace(g, info=replace(g.info, name="NVIDIA A100\x1b[2J")),))
    info = next(f for f in gpu_families(snap, "node1") if f.name == "migd_gpu_info")
    assert [s.labels["name"] for s in info.samples] == ["NVIDIA A100\\x1b[2J"]
