"""A Slurm cluster on 127.0.0.1 in a temp dir: Debian's slurmctld, slurmd and munge, no systemd, no
accounting (tests/slurm_accounting.py adds slurmdbd over MariaDB).  Device files are real character
nodes made with mknod (migd.sim.devnodes), so slurmd checks gres.conf exactly as on a GPU node.
Several nodes run as several slurmd on this host, in Slurm's multiple-slurmd mode (Debian's 22.05
build has it): each NodeName its own Port=, slurmd's pid file, spool dir and log named with %n
(slurm.conf(5)), each node its own device dir.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from migd.sim.devnodes import make_device_nodes

TOOLS = ("slurmctld", "slurmd", "scontrol", "squeue", "sbatch", "munged", "mungekey")
NODE = "gpu1"


def missing_reason() -> str | None:
    absent = [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing; .ci/run installs slurmctld slurmd " \
               "slurm-client munge)"
    if os.geteuid() != 0:
        return "the one-node Slurm cluster needs root (munged, slurmd and mknod of device files)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SLURM_CONF = """\
ClusterName=migd
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket={d}/run/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
StateSaveLocation={d}/spool/ctld
SlurmdSpoolDir={d}/spool/d-%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
{accounting}
SlurmdTimeout=30
{settings}{node_lines}{others}PartitionName=main Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, gpus: int | Mapping[str, int], nodes: tuple[str, ...] = (NODE,)) -> None:
        """``gpus``: each node's GPU count, or one for all."""
        self.dir = Path(tempfile.mkdtemp(prefix="migd-slurm-", dir="/tmp"))  # short: socket paths
        for sub in ("run", "log", "spool/ctld", "etc"):
            (self.dir / sub).mkdir(parents=True)
        os.chmod(self.dir, 0o700)
        self.nodes = nodes
        self.node = nodes[0]
        self.devs = {n: self.dir / ("dev" if k == 0 else f"dev-{n}") for k, n in enumerate(nodes)}
        count = gpus if isinstance(gpus, Mapping) else dict.fromkeys(nodes, gpus)
        self.minors = {n: make_device_nodes(d, count[n]) for n, d in self.devs.items()}
        self.dev, self.mig_minors = self.devs[self.node], self.minors[self.node]
        self.conf = self.dir / "etc" / "slurm.conf"
        self.gres_conf = self.dir / "etc" / "gres.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def pid_file(self, node: str | None = None) -> Path:
        return self.dir / "run" / f"slurmd-{node or self.node}.pid"

    def sbin(self, name: str) -> str:
        return shutil.which(name) or f"/usr/sbin/{name}"

    # -- life cycle -------------------------------------------------------------------------------
    def start(self, gres: str | dict[str, str], gres_conf: str, others: tuple[str, ...] = (),
              catalog: str | None = None, cpus: int = 2, settings: str = "") -> None:
        """``others``: more nodes of the partition that never run a slurmd (fleet-wave tests drain them).
        ``catalog``: a FUTURE node of the partition declaring these GRES, so jobs asking for a MIG type
        no node offers right now are queued rather than refused (docs/demand.md).  ``cpus``: each node's
        CPUs= (every job takes one core: more than this host has lets a node run as many jobs as its MIG
        instances, slurmd told to trust the configuration); ``settings``: more slurm.conf lines."""
        d = self.dir
        key = d / "etc" / "munge.key"
        subprocess.run([self.sbin("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True)
        os.chmod(key, 0o600)
        subprocess.run([self.sbin("munged"), "--force", f"--socket={d}/run/munge.sock", f"--key-file={key}",
                        f"--pid-file={d}/run/munged.pid", f"--log-file={d}/log/munged.log",
                        f"--seed-file={d}/run/munge.seed"], check=True, capture_output=True)
        per = gres if isinstance(gres, dict) else {self.node: gres}
        if cpus > 2:
            settings = "SlurmdParameters=config_overrides\n" + settings
        node_lines = "".join(f"NodeName={n} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={cpus} RealMemory=500 "
                             f"Gres={per.get(n, '')} State=UNKNOWN\n" for n in self.nodes)
        members = ",".join((*self.nodes, *others, *(["catalog"] if catalog else [])))
        self.conf.write_text(SLURM_CONF.format(host=socket.gethostname(), d=d, ctld_port=_free_port(),
                                               node_lines=node_lines, nodes=members, settings=settings,
                                               others="".join(f"NodeName={o} NodeAddr=127.0.0.1 CPUs=2 "
                                                              "RealMemory=500 State=UNKNOWN\n" for o in others)
                                               + (f"NodeName=catalog NodeAddr=127.0.0.1 Port={_free_port()} CPUs=2 "
                                                  f"RealMemory=500 Gres={catalog} State=FUTURE\n" if catalog else ""),
                                               accounting=self.accounting()))
        self.gres_conf.write_text(gres_conf)
        self.before_slurmctld()
        self.run_sbin("slurmctld", "-i")
        self.wait(lambda: self.ok("scontrol", "ping"), "slurmctld")
        for n in self.nodes:
            self.run_sbin("slurmd", "-N", n)
        self.wait(lambda: all("IDLE" in self.state(n) for n in self.nodes), "the nodes to register")

    def accounting(self) -> str:
        """slurm.conf's accounting lines (tests/slurm_accounting.py's cluster keeps accounts in slurmdbd)."""
        return "AccountingStorageType=accounting_storage/none"

    def before_slurmctld(self) -> None:
        """Called once munged runs and the files are written, before slurmctld starts."""

    def run_sbin(self, name: str, *args: str) -> None:
        subprocess.run([self.sbin(name), *args], env=self.env, check=True, capture_output=True, timeout=30)

    def stop(self) -> None:
        for pid_file in (*(f"slurmd-{n}.pid" for n in self.nodes), "slurmctld.pid", "munged.pid"):
            p = self.dir / "run" / pid_file
            try:
                os.kill(int(p.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(0.3)
        self._kill_leftovers()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """Job steps (slurmstepd, the jobs' shells) outlive slurmd: every process whose environment
        names this cluster's SLURM_CONF is ours."""
        mark = f"SLURM_CONF={self.conf}".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass

    # -- commands the tests and migd's settings use -----------------------------------------------
    def cmd(self, *argv: str, check: bool = True) -> str:
        p = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: {p.stderr.strip()}")
        return p.stdout

    def ok(self, *argv: str) -> bool:
        return subprocess.run(list(argv), env=self.env, capture_output=True, timeout=30).returncode == 0

    def pid_script(self, name: str, body: str) -> list[str]:
        """An executable script in the cluster dir (migd's restart commands point at these)."""
        path = self.dir / "etc" / name
        path.write_text("#!/bin/sh\nexport SLURM_CONF=" + str(self.conf) + "\n" + body)
        path.chmod(0o755)
        return [str(path)]

    def restart_commands(self, node: str | None = None) -> dict[str, list[str]]:
        node = node or self.node
        d, sbin, pid = self.dir, self.sbin, self.pid_file(node)
        stop_d = self.pid_script(f"stop-slurmd-{node}", f"kill $(cat {pid})\n"
                                 f"while kill -0 $(cat {pid} 2>/dev/null) 2>/dev/null; do sleep 0.05; done\n")
        restart_ctld = self.pid_script("restart-slurmctld", f"kill $(cat {d}/run/slurmctld.pid)\n"
                                       f"while kill -0 $(cat {d}/run/slurmctld.pid 2>/dev/null) 2>/dev/null; do "
                                       f"sleep 0.05; done\nexec {sbin('slurmctld')}\n")
        start_d = self.pid_script(f"start-slurmd-{node}", f"exec {sbin('slurmd')} -N {node}\n")
        return {"stop_slurmd": stop_d, "restart_slurmctld": restart_ctld, "start_slurmd": start_d}

    def slurm_section(self, waves: int | None = None, node: str | None = None, **commands: list[str]) -> str:
        """migd's ``slurm:`` config section for a node of this cluster (restart commands overridable)."""
        node = node or self.node
        cmds = {**self.restart_commands(node), **commands}
        lines = ["slurm:", f"  node: {node}", f"  slurm_conf: {self.conf}", f"  gres_conf: {self.gres_conf}",
                 f"  device_dir: {self.devs[node]}", f"  mig_minors: {self.minors[node]}", "  register_timeout: 30s",
                 f"  env: {{SLURM_CONF: {self.conf}}}", "  maintenance_ahead: 15m", "  maintenance_window: 30m",
                 "  partition: main"]
        lines += [f"  max_in_maintenance: {waves}"] if waves else []
        lines += [f"  {k}: {json.dumps(v)}" for k, v in cmds.items()]
        return "\n".join(lines) + "\n"

    # -- what the tests look at -------------------------------------------------------------------
    def show(self, node: str | None = None) -> dict[str, str]:
        line = self.cmd("scontrol", "show", "node", "-o", node or self.node).strip()
        import re
        return dict(f.split("=", 1) for f in re.split(r" (?=[A-Za-z_]+=)", line) if "=" in f)

    def state(self, node: str | None = None) -> str:
        try:
            return self.show(node).get("State", "")
        except AssertionError:
            return ""

    def submit(self, gres: str, script: str, *extra: str) -> str:
        return self.submit_asking(f"--gres={gres}", script, *extra)

    def submit_asking(self, ask: str, script: str, *extra: str) -> str:
        """A batch job that asks for GPUs the way ``ask`` does (``--gres=``, ``--gpus=``, ...)."""
        out = self.cmd("sbatch", "--parsable", ask, "-o", str(self.dir / "job-%j.out"), *extra, "--wrap", script)
        return out.strip().split(";")[0]

    def job_state(self, job: str) -> str:
        out = self.cmd("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
        return out or "GONE"

    @staticmethod
    def wait(ok: object, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.2)


def skip_without_slurm() -> None:
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("MIGD_REQUIRE_SLURM") == "1":
            pytest.fail(f"MIGD_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
