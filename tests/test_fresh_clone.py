"""Every command the README and docs/ give a user, run as written in a fresh clone:
the install as on a node (then migctl as an ordinary user), the demo and what watches it, the
simulator's example.  `pip install ./migd` "from the checkout" was not installable, and migctl, linked
into /usr/local/sbin from a venv made by a root-only interpreter, could not be run by anyone else.

A fresh clone: ``git clone`` of this repository at its HEAD commit (what is committed is what is tested).
What would touch the host runs in a private mount namespace whose /etc, /opt, /usr/local and /tmp are
overlays (the demo's port, 9835, must be free).  Stand-ins, only where
unavoidable: ``sudo`` where it is not installed (the test is root already), ``systemctl`` (no systemd
manages a test: the unit is checked by ``systemd-analyze verify`` where that is installed), and no
NVIDIA driver (``migctl status --mine`` then answers its own one line, exit 4).  pip fetches what the
venv lacks from the package index the machine is configured with, as a user's pip does."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO, need_root

pytestmark = pytest.mark.integration  # a fresh clone, a venv, namespaces

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOBODY = 65534
USER_PATH = "/usr/local/bin:/usr/bin:/bin"  # Debian's PATH for a user: /usr/local/sbin is not on it


def blocks(doc: Path) -> list[str]:
    """The ``sh`` code blocks of a document (an indented one dedented), and each ``$ command`` of its
    ``text`` blocks."""
    text = doc.read_text()
    found = [textwrap.dedent(m.group(2)) for m in re.finditer(r"^( *)```sh\n(.*?)^\1```", text, re.M | re.S)]
    for m in re.finditer(r"^( *)```text\n(.*?)^\1```", text, re.M | re.S):
        found += [line.strip()[2:] + "\n" for line in m.group(2).splitlines() if line.strip().startswith("$ ")]
    return found


def commands(block: str) -> list[str]:
    """One command per line, continuations joined; blank and comment-only lines dropped."""
    lines = block.replace("\\\n", " ").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def section(doc: Path, heading: str) -> list[str]:
    """The commands of the ``sh`` blocks under ``heading`` (to the next heading of its level or above)."""
    text = doc.read_text().split(heading + "\n", 1)[1]
    level = heading.split(" ", 1)[0]
    text = re.split(rf"^#{{1,{len(level)}}} ", text, maxsplit=1, flags=re.M)[0]
    return [c for m in re.finditer(r"^( *)```sh\n(.*?)^\1```", text, re.M | re.S)
            for c in commands(textwrap.dedent(m.group(2)))]


README = REPO / "README.md"
INSTALL = section(README, "## Installing on a real node")
SET_UP = section(README, "## Set-up (two commands, no GPU needed)")
DEMO, WATCH = SET_UP[:1], SET_UP[2:]  # (the second command is the test suite itself: below)
# Run elsewhere, as written: .ci/run runs the README's test command (`pip install -e '.[test]' && pytest`)
# and every command of "Contributing"; this suite cannot run itself.
BY_CI = [SET_UP[1], *section(README, "## Contributing")]


def test_every_command_of_the_docs_is_run_by_a_test() -> None:
    """A command added to the README or docs/ fails here until a test runs it (or .ci/run does)."""
    run = {*INSTALL, *DEMO, *WATCH, *_simulator_commands(), *BY_CI, "migctl status --mine",
           *section(REPO / "docs" / "users.md", "### On the simulator")}  # (run by test_sim_cli.py)
    typed = {(doc.name, c) for doc in DOCS for b in blocks(doc) for c in commands(b)}
    assert {(name, c) for name, c in typed if c not in run} == set()
    assert len(INSTALL) >= 10 and any(c.startswith("sudo ") for c in INSTALL), INSTALL


def _simulator_commands() -> list[str]:
    return [c for b in blocks(REPO / "docs" / "simulator.md") for c in commands(b)]


def _clone(tmp: Path) -> Path:
    """A fresh clone of this repository at its HEAD commit."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    clone = tmp / "migd"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(clone), "-c", "advice.detachedHead=false", "checkout", "-q", head], check=True,
                   timeout=60)
    return clone


def _namespace(why: str) -> None:
    need_root(why)
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("needs unshare(1) and setpriv(1) (util-linux)")


def _overlays(tmp: Path, dirs: tuple[str, ...]) -> str:
    """Shell lines that put a throw-away overlay on each of ``dirs`` (the host's copy stays as it is)."""
    return "\n".join(f"mkdir -p {tmp}/ov/{d}.u {tmp}/ov/{d}.w && mount -t overlay overlay -o "
                     f"lowerdir=/{d},upperdir={tmp}/ov/{d}.u,workdir={tmp}/ov/{d}.w /{d}" for d in dirs)


def _stand_ins(tmp: Path) -> Path:
    """``systemctl`` (no systemd manages a test: it records its arguments) and, where sudo is not installed,
    ``sudo`` (the test is root already: it runs the command)."""
    bin_dir = tmp / "stand-ins"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {tmp}/systemctl.calls\n')
    if shutil.which("sudo") is None:
        (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def _run_in_namespace(script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script], capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode != 0 and "mount" in r.stderr and ("overlay" in r.stderr or "permission denied" in r.stderr):
        pytest.skip(f"no overlay mounts here: {r.stderr.strip()[-300:]}")
    return r


def test_the_readme_installs_as_written_and_any_user_runs_migctl(tmp_path: Path) -> None:
    """The install block, line by line as written, in a fresh clone's top directory, under a strict umask
    (077: what root makes is its own unless the steps say otherwise); its `sudo` lines as root, its other
    line (``migctl status --mine``) as nobody (uid 65534) with a user's PATH; and the Slurm drop-in."""
    _namespace("mount namespaces and another user")
    tmp = tmp_path
    clone = _clone(tmp)
    install = section(clone / "README.md", "## Installing on a real node")  # the clone's own words
    stand_ins = _stand_ins(tmp)
    as_user = (f"cd / && setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups env -i PATH={USER_PATH} "
               f"HOME=/nonexistent")
    steps = []
    for n, c in enumerate(install):
        if c.startswith("sudo "):
            steps.append(c)
        else:  # a user's command: its exit and output are the test's to judge
            steps.append(f"if ({as_user} bash -c {_quote(c)}) >{tmp}/user{n}.out 2>&1; then rc=0; else rc=$?; fi; "
                         f"echo $rc >{tmp}/user{n}.rc")
    verify = "systemd-analyze verify /etc/systemd/system/migd.service" if shutil.which("systemd-analyze") else "true"
    script = "\n".join(["set -e", _overlays(tmp, ("etc", "opt", "usr/local")), f"export PATH={stand_ins}:$PATH",
                        "umask 077", f"cd {clone}", *steps,
                        f"({as_user} migctl --version) >{tmp}/version.out 2>&1",
                        f"{verify} >{tmp}/verify.out 2>&1"])
    r = _run_in_namespace(script)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "/etc/migd/migd.yaml: ok (4 profile(s)" in r.stdout, r.stdout[-2000:]
    assert (tmp / "version.out").read_text().startswith("migctl "), (tmp / "version.out").read_text()
    users = [n for n, c in enumerate(install) if not c.startswith("sudo ")]
    assert [install[n].split("#")[0].strip() for n in users] == ["migctl status --mine"], install
    for n in users:
        said, rc = (tmp / f"user{n}.out").read_text(), int((tmp / f"user{n}.rc").read_text())
        # migctl's own answer (exit 0 some, 1 none, 4 no driver here), not the shell's 126/127
        assert rc in (0, 1, 4) and "Traceback" not in said and len(said.strip().splitlines()) == 1, (rc, said)
    assert "migd.service" not in (tmp / "verify.out").read_text(), (tmp / "verify.out").read_text()
    assert (tmp / "systemctl.calls").read_text().splitlines() == ["daemon-reload", "enable --now migd"]
    assert (tmp / "ov" / "etc.u" / "systemd" / "system" / "migd.service.d" / "slurm.conf").exists()
    assert not Path("/etc/migd").exists() and not Path("/opt/migd").exists()  # the host is untouched


def _quote(command: str) -> str:
    return "'" + command.replace("'", "'\"'\"'") + "'"


def test_the_demo_and_what_watches_it_run_as_written(tmp_path: Path) -> None:
    """The README's demo (its first set-up command, the daemon on a simulated DGX A100 reaching night at the
    19:00 transition), the three commands that watch it from another shell, the rehearsal of day one's
    trouble (migd-sim slow, process, xid, lose, return; each exits 0), and docs/simulator.md's example,
    as written, in a fresh clone with a venv of its own; Ctrl-C stops the demo, exit 0."""
    _namespace("a mount namespace (the demo's /tmp paths)")
    if shutil.which("curl") is None:
        pytest.skip("needs curl")
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 9835)) == 0:
            pytest.skip("port 9835, the demo's, is taken on this machine")
    tmp = tmp_path
    clone = _clone(tmp)
    set_up = section(clone / "README.md", "## Set-up (two commands, no GPU needed)")
    watch = [*set_up[2:], *(c for b in blocks(clone / "docs" / "simulator.md") for c in commands(b))]
    venv = tmp / "venv"  # the user's environment: its packages the test's (no download but the build's)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    demo = set_up[0]
    script = "\n".join([
        "set -e", _overlays(tmp, ("tmp",)), f"export PATH={venv}/bin:$PATH", f"cd {clone}",
        f"setsid bash -c {_quote(demo)} >{tmp}/demo.log 2>&1 &", "demo=$!",
        "for i in $(seq 600); do [ \"$(curl -s 127.0.0.1:9835/metrics | grep -c '^migd_instance_info.*7g.80gb')\" "
        "= 8 ] && break; sleep 0.5; done",
        "set +e", *(f"echo '>>> {i}'\n{c}\necho \"rc=$?\"" for i, c in enumerate(watch)),  # (c may end in a comment)
        "kill -INT -- -$demo; wait $demo; echo \">>> demo exit $?\"",
        f"echo '<<< log'; cat {tmp}/demo.log"])  # (written under the overlay: gone with the namespace)
    r = _run_in_namespace(script, timeout=900)
    said, _, log = r.stdout.partition("<<< log\n")
    assert r.returncode == 0 and "Traceback" not in log, said[-3000:] + r.stderr[-3000:] + log[-3000:]
    out = said.split(">>> ")
    status, metrics, smi = out[1], out[2], out[3]
    assert status.startswith("0\nstatus: 8 GPU(s), MIG enabled on 8, 8 MIG device(s)") and "7g.80gb" in status, status
    assert metrics.count("migd_instance_info{") == 8 and 'profile="7g.80gb"' in metrics, metrics
    assert "MIG 7g.80gb" in smi or "7g.80gb" in smi, smi
    readme = len(set_up) - 2  # the README's own commands come first in ``watch``, then docs/simulator.md's
    rehearsal = [o for o, c in zip(out[1:1 + readme], watch[:readme], strict=True)
                 if c.startswith(("migd-sim ", "migctl --sim dgx-a100 apply"))]
    assert len(rehearsal) == 7 and all(o.rstrip().endswith("rc=0") for o in rehearsal), rehearsal
    assert re.search(r"^\d+$", rehearsal[3].split("\n")[1]), rehearsal[3]  # process start prints its pid
    simulated = ">>> ".join(out[4:])
    assert "day: applied in " in simulated and "81559" in simulated and "1g.10gb" in simulated, simulated
    assert out[-1].strip() == "demo exit 0", out[-1]
    assert "GPU 0: MIG mode enabled" in log and "night" in log, log[-2000:]
