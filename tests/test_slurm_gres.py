"""gres.conf and Gres= rendering, without Slurm: runs everywhere (the real-Slurm tests are in test_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from migd.hardware.caps import read_minors
from migd.hardware.ports import read_state
from migd.sim.backend import sim_backend
from migd.sim.devnodes import mig_minors_text
from migd.slurm.gres import GresError, gres_conf, node_gres, records, set_node_gres
from tests.helpers import PROFILES, Migctl, check_golden

SPLIT = """apiVersion: migd/v1
kind: Profile
name: split
gpus:
  - select: {index: [0]}
    mig: enabled
    instances:
      - {profile: 3g, compute: [2c, 1c]}
      - {profile: 1g, count: 2}
  - select: {index: [1]}
    mig: disabled
"""


def test_gres_conf_for_a_mixed_node(tmp_path: Path) -> None:
    """One record per MIG device (a split GI gives one per CI, typed by the CI profile), File= for
    a GPU without MIG; minors come from the driver's table, never computed."""
    m = Migctl(tmp_path, "mixed")
    f = tmp_path / "split.yaml"
    f.write_text(SPLIT)
    assert m("apply", str(f)).code == 0
    minors_file = tmp_path / "mig-minors"
    minors_file.write_text(mig_minors_text(4))
    backend = sim_backend(m.state, "mixed")
    try:
        states = [read_state(backend, g) for g in backend.list_gpus()[:2]]
        recs = records(states, backend.minor_number, read_minors(minors_file), Path("/dev"))
    finally:
        backend.close()
    assert node_gres(recs) == "gpu:1c.3g.20gb:1,gpu:2c.3g.20gb:1,gpu:1g.5gb:2,gpu:a100-sxm4-40gb:1"
    text = gres_conf("gpu1", recs, "split")
    check_golden("gres-split.conf", text)
    assert "File=/dev/nvidia1\n" in text  # GPU 1: no MIG, one whole GPU
    # every MIG record: the GPU node, then its GI and CI capability nodes
    assert all(r.files[0] == "/dev/nvidia0" and len(r.files) == 3 for r in recs if r.mig)


def test_a_minor_missing_from_the_drivers_table_is_an_error(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    backend = sim_backend(m.state, "single-a100")
    try:
        states = [read_state(backend, g) for g in backend.list_gpus()]
        with pytest.raises(GresError, match="not in the driver's mig-minors table"):
            records(states, backend.minor_number, {"config": 1}, Path("/dev"))
    finally:
        backend.close()


CONF = """# cluster
NodeName=gpu1 NodeAddr=10.0.0.1 CPUs=64 Gres=gpu:1g.10gb:7 State=UNKNOWN
NodeName=gpu10 CPUs=64 Gres=gpu:7g.80gb:1
NodeName=gpu2 CPUs=64
"""


@pytest.mark.parametrize("node,gres,line", [
    ("gpu1", "gpu:7g.80gb:1", "NodeName=gpu1 NodeAddr=10.0.0.1 CPUs=64 Gres=gpu:7g.80gb:1 State=UNKNOWN"),
    ("gpu2", "gpu:3g.40gb:2", "NodeName=gpu2 CPUs=64 Gres=gpu:3g.40gb:2"),
    ("gpu10", "", "NodeName=gpu10 CPUs=64"),
])
def test_only_the_nodes_own_gres_changes(node: str, gres: str, line: str) -> None:
    out = set_node_gres(CONF, node, gres)
    assert line in out.splitlines()
    assert [a for a, b in zip(CONF.splitlines(), out.splitlines(), strict=True) if a != b] == \
        [next(x for x in CONF.splitlines() if x.startswith(f"NodeName={node} "))]


def test_a_node_without_its_own_line_is_refused() -> None:
    with pytest.raises(GresError, match="no 'NodeName=gpu3 ...' line"):
        set_node_gres(CONF, "gpu3", "gpu:7g.80gb:1")


def test_a_shared_gres_conf_keeps_the_other_nodes_lines() -> None:
    """One gres.conf for the cluster (gres.conf(5): each line names its NodeName=): a node rewriting its
    records leaves the others' lines, and the operator's, as they were."""
    from migd.slurm.gres import GresRecord
    old = ("# site header\nNodeName=gpu2 Name=gpu Type=7g.80gb MultipleFiles=/dev/nvidia0\n"
           "# written by migd for profile day on gpu1: one record per MIG device (gres.conf(5) MultipleFiles)\n"
           "NodeName=gpu1 Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia0\n")
    new = gres_conf("gpu1", [GresRecord("7g.80gb", ("/dev/nvidia0",), mig=True)], "night", old)
    lines = new.splitlines()
    assert lines[:2] == ["# site header", "NodeName=gpu2 Name=gpu Type=7g.80gb MultipleFiles=/dev/nvidia0"]
    assert lines[2].startswith("# written by migd for profile night on gpu1:")
    assert lines[3:] == ["NodeName=gpu1 Name=gpu Type=7g.80gb MultipleFiles=/dev/nvidia0"]
    assert gres_conf("gpu2", [], "x", new).count("NodeName=gpu1 ") == 1
