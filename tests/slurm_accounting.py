"""tests/slurm_cluster.py's cluster with accounting: Debian's slurmdbd over a MariaDB of its own, so
``sacct`` answers from a real job database, as on a site's cluster.

MariaDB runs from a temp datadir (``mariadb-install-db``, then ``mariadbd`` as root with
``--user=root``) on a loopback port and a socket in the cluster dir; slurmdbd listens on another
loopback port and stores in it as a user made for it; slurmctld sends its jobs there
(``AccountingStorageType=accounting_storage/slurmdbd``), tracking every MIG type's GRES as TRES
(``AccountingStorageTRES``), so ``AllocTRES`` names them.  The cluster, its accounts and root's
associations are made with ``sacctmgr`` before slurmctld starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster, _free_port
from tests.slurm_cluster import missing_reason as slurm_missing

DB_TOOLS = ("slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db", "mariadb")
DB_USER, DB_PASS, DB_NAME = "slurm", "migd-test", "slurm_acct_db"

SLURMDBD_CONF = """\
AuthType=auth/munge
AuthInfo=socket={d}/run/munge.sock
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort={dbd_port}
SlurmUser=root
PidFile={d}/run/slurmdbd.pid
LogFile={d}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser={user}
StoragePass={password}
StorageLoc={name}
"""


def missing_reason() -> str | None:
    reason = slurm_missing()
    if reason is not None:
        return reason
    absent = [t for t in DB_TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    if absent:
        return f"Slurm's accounting is not installed ({', '.join(absent)} missing; .ci/run installs slurmdbd " \
               "mariadb-server)"
    return None


def skip_without_slurmdbd() -> None:
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("MIGD_REQUIRE_SLURMDBD") == "1":
            pytest.fail(f"MIGD_REQUIRE_SLURMDBD=1 but {reason}")
        pytest.skip(reason)


class AccountedCluster(SlurmCluster):
    """A SlurmCluster whose jobs slurmdbd records in MariaDB; ``accounts`` are made, root in each."""

    def __init__(self, gpus: int, accounts: tuple[str, ...], tres: tuple[str, ...]) -> None:
        super().__init__(gpus)
        self.accounts, self.tres = accounts, tres
        self.db_port, self.dbd_port = _free_port(), _free_port()
        self.db_sock = self.dir / "run" / "db.sock"
        self.db: subprocess.Popen[bytes] | None = None

    def accounting(self) -> str:
        gres = ",".join(["gres/gpu", *(f"gres/gpu:{t}" for t in self.tres)])
        return ("AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
                f"AccountingStoragePort={self.dbd_port}\nAccountingStorageTRES={gres}\n"
                f"AccountingStoragePass={self.dir}/run/munge.sock")  # (the munge socket of slurmdbd's clients)

    def before_slurmctld(self) -> None:
        self._start_mariadb()
        conf = self.conf.parent / "slurmdbd.conf"  # slurmdbd reads it beside $SLURM_CONF
        conf.write_text(SLURMDBD_CONF.format(d=self.dir, dbd_port=self.dbd_port, db_port=self.db_port,
                                             user=DB_USER, password=DB_PASS, name=DB_NAME))
        conf.chmod(0o600)
        self.run_sbin("slurmdbd")
        self.wait(lambda: self.ok("sacctmgr", "-n", "list", "cluster"), "slurmdbd", timeout_s=60)
        self.cmd("sacctmgr", "-i", "add", "cluster", "migd")
        self.cmd("sacctmgr", "-i", "add", "account", ",".join(self.accounts), "cluster=migd")
        self.cmd("sacctmgr", "-i", "add", "user", "root", f"account={','.join(self.accounts)}", "cluster=migd")

    def _start_mariadb(self) -> None:
        data = self.dir / "db"
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                        "--auth-root-authentication-method=socket", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)
        self.db = subprocess.Popen(
            [self.sbin("mariadbd"), "--no-defaults", f"--datadir={data}", f"--socket={self.db_sock}",
             f"--port={self.db_port}", "--bind-address=127.0.0.1", "--user=root", f"--pid-file={self.dir}/run/db.pid",
             f"--log-error={self.dir}/log/mariadb.log", "--skip-log-bin", "--innodb-buffer-pool-size=16M"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait(lambda: self._sql("SELECT 1"), "MariaDB", timeout_s=60)
        ok = self._sql(f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}'; "
                       f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1'")
        assert ok, (self.dir / "log" / "mariadb.log").read_text()[-2000:]

    def _sql(self, statement: str) -> bool:
        r = subprocess.run(["mariadb", "--no-defaults", "-S", str(self.db_sock), "-u", "root", "-e", statement],
                           capture_output=True, timeout=30)
        return r.returncode == 0

    def sacct(self, *fields: str, extra: tuple[str, ...] = ("-X",)) -> str:
        """``sacct --parsable2`` of every job of every user since the epoch, as an operator runs it."""
        return self.cmd("sacct", "--parsable2", "-a", *extra, "-S", "1970-01-01", "-o", ",".join(fields))

    def stop(self) -> None:
        pid = self.dir / "run" / "slurmdbd.pid"
        try:
            os.kill(int(pid.read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        if self.db is not None:
            self.db.terminate()
            try:
                self.db.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.db.kill()
                self.db.wait()
        time.sleep(0.1)
        super().stop()
