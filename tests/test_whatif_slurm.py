"""``migctl what-if`` reads what a real Slurm's accounting says: Debian's Slurm 22.05 with slurmdbd over
MariaDB (tests/slurm_accounting.py) runs jobs that ask MIG types, and ``sacct --parsable2`` of them is
read back as the jobs, types, accounts and times that were submitted, then weighed and its suggestion
loaded by ``migd --check``.

``MIGD_RECORD_SACCT=FILE`` also writes the sacct output there (and, with job steps, FILE-steps): how
tests/fixtures/slurm/sacct-parsable2.txt was recorded (tests/fixtures/slurm/SOURCES.md).  Skipped
where slurmdbd or MariaDB is missing or not root, unless MIGD_REQUIRE_SLURMDBD=1 (.ci/run sets it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from migd.whatif.sacct import FIELDS, read_sacct
from tests.slurm_accounting import AccountedCluster, skip_without_slurmdbd

pytestmark = pytest.mark.integration  # Slurm, slurmdbd and MariaDB, and migctl and migd as programs

REPO = Path(__file__).resolve().parents[1]
TYPES = ("1g.10gb", "3g.40gb", "7g.80gb")
NODE_GRES = "gpu:1g.10gb:2,gpu:3g.40gb:1"  # the node offers two 1g and one 3g; 7g only a FUTURE node declares
CONFIG = f"""\
timezone: UTC
profiles_dir: {REPO / "profiles"}
strict_permissions: false
schedule:
  - {{profile: day,   at: "08:30", days: mon-fri}}
  - {{profile: night, at: "19:00", days: mon-fri}}
slurm:
  node: gpu1
  partition: main
  demand: {{mode: dry-run, planner: gpu1, candidates: [day, night, balanced]}}
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[AccountedCluster]:
    skip_without_slurmdbd()
    c = AccountedCluster(3, ("physics", "bio"), TYPES)
    try:
        gres_conf = "".join(f"NodeName=gpu1 Name=gpu Type={t} File={c.dev}/nvidia{i}\n"
                            for i, t in enumerate(("1g.10gb", "1g.10gb", "3g.40gb")))
        c.start(NODE_GRES, gres_conf, catalog="gpu:1g.10gb:2,gpu:3g.40gb:1,gpu:7g.80gb:1")
        yield c
    finally:
        c.stop()


def _jobs(c: AccountedCluster) -> dict[str, tuple[str, str, int, int]]:
    """Submitted: job id -> (account, MIG type asked ('' for any), instances, time limit in seconds)."""
    asked = {c.submit("gpu:1g.10gb:1", "sleep 3", "-A", "physics", "-t", "5"): ("physics", "1g.10gb", 1, 300),
             c.submit("gpu:1g.10gb:2", "sleep 2", "-A", "bio", "-t", "1-00:00:00"): ("bio", "1g.10gb", 2, 86400),
             c.submit("gpu:3g.40gb:1", "sleep 1", "-A", "bio", "-t", "10:00"): ("bio", "3g.40gb", 1, 600),
             c.submit("gpu:7g.80gb:1", "sleep 1", "-A", "physics", "-t", "30"): ("physics", "7g.80gb", 1, 1800),
             c.submit("gpu:1", "sleep 1", "-A", "bio", "-t", "20"): ("bio", "", 1, 1200)}
    array = c.submit("gpu:1g.10gb:1", "sleep 1", "-A", "physics", "-t", "15", "--array=0-1")
    asked.update({f"{array}_{i}": ("physics", "1g.10gb", 1, 900) for i in (0, 1)})
    # over two nodes, one a FUTURE node: pending, its ReqTRES the job's total (four 1g), its NNodes 2
    asked[c.submit("gpu:1g.10gb:2", "sleep 1", "-A", "bio", "-t", "40", "-N", "2")] = ("bio", "1g.10gb", 2, 2400)
    withdrawn = c.submit("gpu:7g.80gb:1", "sleep 1", "-A", "bio", "-t", "5")  # pending for resources, cancelled
    c.cmd("scancel", withdrawn)  # (sacct: Start and End the cancel time, no AllocTRES)
    return asked


def test_sacct_from_slurmdbd_is_read_as_the_jobs_submitted(cluster: AccountedCluster, tmp_path: Path) -> None:
    c = cluster
    submitted = _jobs(c)
    pending = sorted(j for j, a in submitted.items() if a[1] == "7g.80gb" or a[3] == 2400)  # no node offers 7g
    # now, and one node runs no job over two
    c.wait(lambda: sorted(c.cmd("squeue", "-h", "-o", "%i").split()) == pending, "every job but those two to end", 60)
    fields = FIELDS.split(",")
    c.wait(lambda: c.sacct(*fields).count("COMPLETED") == len(submitted) - 2, "slurmdbd to hold every end", 30)
    text = c.sacct(*fields)
    path = tmp_path / "jobs.sacct"
    path.write_text(text)
    rec = read_sacct(path)

    untyped = next(j for j in rec.trace.jobs if j.time_limit_s == 1200)
    assert untyped.account == "bio" and untyped.gres in ("1g.10gb", "3g.40gb")  # AllocTRES: the type it got
    got = sorted((j.account, j.gres, j.count, j.time_limit_s) for j in rec.trace.jobs)
    assert got == sorted((a, t or untyped.gres, n, limit) for a, t, n, limit in submitted.values())
    assert rec.skipped == {"ended before starting": 1}  # the withdrawn one
    seven = next(j for j in rec.trace.jobs if j.gres == "7g.80gb")
    assert seven.duration_s == 30 * 60  # still pending: replayed to its limit
    wide = next(j for j in rec.trace.jobs if j.time_limit_s == 2400)
    assert (wide.nodes, wide.count, wide.duration_s) == (2, 2, 2400)  # one job, its share on each node
    assert "gres/gpu:1g.10gb=4" in next(line for line in text.splitlines() if "|00:40:00|" in line)  # (the total)
    assert {j.nodes for j in rec.trace.jobs if j is not wide} == {1}
    ran = [j for j in rec.trace.jobs if j.gres != "7g.80gb" and j is not wide]
    assert all(1 <= j.duration_s <= 10 for j in ran)  # sleep 1-3 s, as Slurm timed them
    assert all(0 <= j.submit_s <= 10 for j in rec.trace.jobs)  # submitted within seconds of each other
    assert rec.nodes == {"gpu1"}
    first = min(datetime.fromisoformat(line.split("|")[1]) for line in text.splitlines()[1:] if line)
    assert rec.trace.start == first

    steps = c.sacct(*fields, extra=())
    if os.environ.get("MIGD_RECORD_SACCT"):
        record = Path(os.environ["MIGD_RECORD_SACCT"])
        record.write_text(text)
        record.with_name(record.stem + "-steps" + record.suffix).write_text(steps)
    assert ".batch|" in steps and read_sacct(path, steps).trace == rec.trace  # job steps are skipped

    _weigh_and_suggest(path, tmp_path)


def _weigh_and_suggest(path: Path, tmp_path: Path) -> None:
    """migctl what-if on the record, and its suggestion loaded by migd itself."""
    cfg = tmp_path / "migd.yaml"
    cfg.write_text(CONFIG)
    migctl = [sys.executable, "-m", "migd.ctl.migctl", "what-if", "--sacct", str(path), "--config", str(cfg),
              "--gpus", "1", "--search", "4"]
    r = subprocess.run([*migctl, "-o", "json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["nodes"] == 1 and set(doc["policies"]) == {"migd demand", "current schedule", "best fixed mix"}
    assert set(doc["policies"]["best fixed mix"]["p95_by_type_s"]) == set(TYPES)
    r = subprocess.run([*migctl, "--suggest", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "best fixed mix" in r.stdout and "p95 7g.80gb" in r.stdout, r.stderr
    assert "mig-configs:" in (tmp_path / "out" / "mig-parted.yaml").read_text()
    check = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--check", "--config",
                            str(tmp_path / "out" / "migd.whatif-1.yaml")], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
