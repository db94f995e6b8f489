"""The one-node Slurm cluster with migd's simulated GPU beside it, as the Slurm tests use it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from migd.config.migdyaml import load_config
from migd.daemon.clock import Clock
from migd.daemon.service import Daemon
from migd.hardware.caps import read_minors
from migd.hardware.nvml.backend import NvmlBackend
from migd.hardware.ports import read_state
from migd.sim.backend import sim_backend
from migd.sim.fleets import FLEETS
from migd.slurm.gres import gres_conf, node_gres, records
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, Migctl
from tests.slurm_cluster import SlurmCluster, skip_without_slurm

FLEET = "single-a100"
NIGHT = datetime.fromisoformat("2026-11-23T19:00:05+09:00")  # Monday, just after the night transition
DAY_LAYOUT = [("1g.10gb", s, ["1g.10gb"]) for s in range(7)]
NIGHT_LAYOUT = [("7g.80gb", 0, ["7g.80gb"])]
CONFIG = """\
timezone: Asia/Seoul
profiles_dir: profiles
schedule:
  - {{profile: day,   at: "{day_at}", days: "{days}"}}
  - {{profile: night, at: "19:00", days: "{days}"}}
metrics: {{enabled: false}}
"""


@dataclass
class Node:
    cluster: SlurmCluster
    migctl: Migctl
    backend: NvmlBackend
    tmp: Path

    def daemon(self, clock: Clock, day_at: str = "08:30", days: str = "mon-fri", waves: int | None = None,
               schedule: str | None = None, path_first: Path | None = None, settings: str = "", top: str = "",
               **commands: list[str]) -> Daemon:
        """An in-process migd for this node: ``schedule`` replaces the schedule's lines, ``path_first`` goes
        before $PATH in Slurm commands' environment (fake commands), ``settings`` adds to ``slurm:``."""
        cfg = self.tmp / "migd.yaml"
        text = CONFIG.format(day_at=day_at, days=days)
        if schedule is not None:
            text = text.split("schedule:")[0] + "schedule:\n" + schedule + "metrics: {enabled: false}\n"
        section = self.cluster.slurm_section(waves, **commands) + settings
        if path_first is not None:
            c = self.cluster
            section = section.replace(f"env: {{SLURM_CONF: {c.conf}}}",
                                      f"env: {{SLURM_CONF: {c.conf}, PATH: '{path_first}:{os.environ['PATH']}'}}")
        cfg.write_text(text + top + section)
        os.chmod(cfg, 0o644)
        return Daemon(load_config(cfg), self.backend, self.migctl.state_dir, clock)

    def fake(self, name: str, body: str) -> Path:
        """A fake Slurm command ``name`` in a directory of its own (``path_first``)."""
        fake = self.tmp / "fakebin"
        fake.mkdir(exist_ok=True)
        (fake / name).write_text("#!/bin/sh\n" + body)
        (fake / name).chmod(0o755)
        return fake

    def layout(self) -> list[tuple[str, int, list[str]]]:
        return self.migctl.layout()[0]


@contextmanager
def _node(tmp_path: Path, layout: str, others: tuple[str, ...] = (), catalog: str | None = None,
          fleet: str = FLEET) -> Iterator[Node]:
    skip_without_slurm()
    m = Migctl(tmp_path, fleet)
    assert m("apply", str(PROFILES / f"{layout}.yaml")).code == 0
    (tmp_path / "profiles").mkdir()
    for f in PROFILES.glob("*.yaml"):
        shutil.copy(f, tmp_path / "profiles" / f.name)
        os.chmod(tmp_path / "profiles" / f.name, 0o644)
    backend = sim_backend(m.state, fleet)
    cluster = SlurmCluster(gpus=len(FLEETS[fleet]))
    try:
        recs = records([read_state(backend, g) for g in backend.list_gpus()], backend.minor_number,
                       read_minors(cluster.mig_minors), cluster.dev)
        cluster.start(node_gres(recs), gres_conf(cluster.node, recs, layout), others, catalog)
        yield Node(cluster, m, backend, tmp_path)
    finally:
        backend.close()
        cluster.stop()


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    """The node in the day layout (``request.param``: more partition nodes without a slurmd)."""
    with _node(tmp_path, "day", tuple(getattr(request, "param", ()))) as n:
        yield n


CATALOG = "gpu:1g.10gb:7,gpu:3g.40gb:2,gpu:7g.80gb:1"  # every candidate's MIG types (an A100's)


@pytest.fixture
def night_node(tmp_path: Path) -> Iterator[Node]:
    """The node in the night layout, with a FUTURE catalog node so day-type jobs can queue."""
    with _node(tmp_path, "night", catalog=CATALOG) as n:
        yield n


@pytest.fixture
def shared_partition_node(tmp_path: Path) -> Iterator[Node]:
    """The node in the night layout, in a partition that also offers a whole GPU's type (``gpu:a100``, as a
    partition with non-MIG nodes does; the catalog node declares it)."""
    with _node(tmp_path, "night", catalog=CATALOG + ",gpu:a100:1") as n:
        yield n


PAIR_CATALOG = "gpu:1g.12gb:14,gpu:2g.24gb:2,gpu:3g.47gb:2,gpu:7g.94gb:2"  # every candidate's types (H100 NVL)


@pytest.fixture
def pair_node(tmp_path: Path) -> Iterator[Node]:
    """A node of two H100 NVL in the night layout (one 7g each), with a catalog node for every type, so a
    per-GPU mix of the candidates can be wanted, applied and published."""
    with _node(tmp_path, "night", catalog=PAIR_CATALOG, fleet="h100-nvl") as n:
        yield n


@contextmanager
def migd_fleet(tmp_path: Path, layouts: Mapping[str, str], config: str, fleet: str | Mapping[str, str] = FLEET,
               catalog: str = CATALOG, cpus: int = 2,
               settings: str = "") -> Iterator[tuple[SlurmCluster, dict[str, MigdProcess]]]:
    """Nodes named as ``layouts``' keys, each a slurmd of one cluster (Slurm's multiple-slurmd mode) and
    its own migd process (configured with ``config`` and the node's ``slurm:`` section, not started) over
    its own simulated ``fleet`` (one for all, or each node's), whose GPUs hold the node's layout.  Every
    migd's log is checked for a traceback at the end."""
    skip_without_slurm()
    fleets = fleet if isinstance(fleet, Mapping) else dict.fromkeys(layouts, fleet)
    cluster = SlurmCluster(gpus={n: len(FLEETS[f]) for n, f in fleets.items()}, nodes=tuple(layouts))
    migds: dict[str, MigdProcess] = {}
    try:
        gres, conf = {}, ""
        for n, layout in layouts.items():
            (tmp_path / n).mkdir()
            m = migds[n] = MigdProcess(tmp_path / n, fleets[n])
            assert m.migctl("apply", str(PROFILES / f"{layout}.yaml")).code == 0
            backend = sim_backend(m.migctl.state, m.fleet)
            try:
                recs = records([read_state(backend, g) for g in backend.list_gpus()], backend.minor_number,
                               read_minors(cluster.minors[n]), cluster.devs[n])
            finally:
                backend.close()
            gres[n], conf = node_gres(recs), gres_conf(n, recs, layout, conf)
        cluster.start(gres, conf, catalog=catalog, cpus=cpus, settings=settings)
        for n, m in migds.items():
            m.config.write_text(config.replace("{slurm}", cluster.slurm_section(1, node=n)))
            m.config.chmod(0o644)
        yield cluster, migds
    finally:
        for m in migds.values():
            m.close()
            assert "Traceback" not in (m.log.read_text() if m.log.exists() else ""), m.log.read_text()[-3000:]
        cluster.stop()
