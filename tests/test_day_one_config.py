"""Issue 39, second pass: migd.yaml as a mig-parted operator writes it.  A mig-parted hooks file named in
``hooks:`` was refused; ``reconcile_interval: 0s`` and ``sample_interval: 0.5s`` passed ``--check`` and
were quietly raised; ``--check`` was silent about owners without an access entry that start-up warns
about.  Through the real ``migd --check`` and migd."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES

pytestmark = pytest.mark.integration  # real migd daemons


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path)
    yield m
    m.close()


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="dgx-a100", reconcile_interval="1s", busy_timeout="30m")
    yield m
    m.close()


# -- 10b: mig-parted's hooks file in migd.yaml ------------------------------------------------------------
def test_a_mig_parted_hooks_file_is_accepted_in_migds_config(migd: MigdProcess) -> None:
    ran = migd.tmp / "hooks.ran"
    hooks = migd.tmp / "hooks-default.yaml"
    hooks.write_text("version: v1\nhooks:\n  apply-start:\n  - workdir: \"/\"\n    command: \"/bin/sh\"\n"
                     f"    args: [\"-c\", \"echo $MIG_PARTED_SELECTED_CONFIG >> {ran}\"]\n")
    os.chmod(hooks, 0o644)
    with open(migd.config, "a") as f:
        f.write("hooks: hooks-default.yaml\n")
    check = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    assert ran.read_text().split() == ["day"]
    # one that cannot be read: one line naming it, exit 2
    migd.config.write_text(migd.config.read_text().replace("hooks-default.yaml", "missing.yaml"))
    bad = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr and len(bad.stderr.splitlines()) == 1, bad.stderr


# -- 9: the smaller ones ----------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [("reconcile_interval", "0s"), ("sample_interval", "0.5s")])
def test_an_interval_under_a_second_is_an_error_not_quietly_raised(migd: MigdProcess, key: str, value: str) -> None:
    migd.write_config(**{key: value})
    check = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 2, check
    assert check.stderr.count("\n") == 1 and key in check.stderr and "at least 1s" in check.stderr, check.stderr


@pytest.mark.parametrize("key, value, said", [
    ("busy_timeout", "1" * 5000 + "h", "is not a duration"),  # (a traceback: Python's int digit limit)
    ("sample_interval", "99999999999999999999999h", "is not a duration"),  # (the sampler died on it)
    ("reconcile_interval", "9000h", "is longer than a year (at most 8784h)")])
def test_a_duration_too_long_for_any_clock_is_one_line_at_check_and_reload(migd: MigdProcess, key: str, value: str,
                                                                          said: str) -> None:
    """Passed by --check, such a value crashed migd at its first use, or at a reload (SIGHUP) of the
    running one; it is refused as any bad value is, and a running migd keeps its configuration."""
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    good = migd.config.read_text()
    migd.write_config(**{key: value})
    check = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 2 and check.stderr.count("\n") == 1 and key in check.stderr and said in check.stderr, \
        check
    reload = migd.migctl("reload")
    assert reload.code == 2 and said in reload.err and "keeps its running configuration" in reload.err, reload
    migd.config.write_text(good)
    assert migd.migctl("reload").code == 0 and "Traceback" not in migd.log.read_text()


def test_check_says_what_start_up_warns_about_owners_without_access(migd: MigdProcess) -> None:
    with open(migd.config, "a") as f:
        f.write("access: {owners: {notebooks: {group: root}}}\n")  # training, inference: no entry
    check = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check
    warned = [ln for ln in check.stderr.splitlines() if "have no access entry" in ln]
    assert any("profile night: owner(s) training have no access entry: their instances are root's only" in ln
               for ln in warned), check.stderr
    assert check.stdout.startswith(f"{migd.config}: ok (4 profile(s), ") and check.stdout.endswith(" transition(s))\n")




def test_the_default_profiles_dir_is_beside_a_config_named_by_a_relative_path(tmp_path: Path) -> None:
    """``--config cfg/migd.yaml`` without ``profiles_dir`` looked in cfg/cfg/profiles."""
    (tmp_path / "cfg").mkdir()
    shutil.copytree(PROFILES, tmp_path / "cfg" / "profiles")
    (tmp_path / "cfg" / "migd.yaml").write_text('schedule:\n  - {profile: day, at: "08:30"}\n')
    check = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", "cfg/migd.yaml", "--check"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert check.returncode == 0 and check.stdout.startswith("cfg/migd.yaml: ok ("), check


def test_a_control_socket_path_too_long_for_a_socket_is_refused_at_check(tmp_path: Path) -> None:
    """It passed --check and stopped the start with ``not starting: : AF_UNIX path too long``."""
    cfg = tmp_path / "migd.yaml"
    sock = "/run/" + "x" * 100 + "/control.sock"
    cfg.write_text(f'profiles_dir: {PROFILES}\nschedule:\n  - {{profile: day, at: "08:30"}}\ncontrol_socket: {sock}\n')
    check = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(cfg), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 2 and check.stderr.startswith(f"{cfg}:4:") and "control_socket" in check.stderr, check
    assert "a Unix socket's path is at most 107" in check.stderr and check.stderr.count("\n") == 1, check


def test_a_socket_path_too_long_beside_a_sim_state_is_said_at_start(tmp_path: Path) -> None:
    """The control socket beside a deep --sim-state (or given by --control-socket) is checked as the
    config's is: it stopped the start with ``not starting: : AF_UNIX path too long``."""
    deep = tmp_path / ("d" * (120 - len(str(tmp_path))))
    deep.mkdir()
    cfg = tmp_path / "migd.yaml"
    cfg.write_text(f'profiles_dir: {PROFILES}\nschedule:\n  - {{profile: day, at: "08:30"}}\n')
    r = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--sim", "dgx-h100", "--sim-state",
                        str(deep / "sim.json"), "--config", str(cfg), "--metrics-listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r
    assert f"not starting: {deep / 'sim.json.d' / 'control.sock'}: is " in r.stderr, r.stderr
    assert "a Unix socket's path is at most 107 (unix(7))" in r.stderr, r.stderr


def test_a_huge_integer_in_a_profile_is_one_line_and_a_running_migd_keeps_its_configuration(migd: MigdProcess) -> None:
    """YAML 1.1 reads 0x and 0o integers of any length, and the error naming one (``not N``) raised
    ValueError past Python's 4,300 digits: ``migctl validate`` printed a traceback, and a reload with
    such a profile in the profiles directory killed the running migd."""
    huge = "0x" + "f" * 3600
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    bad = migd.tmp / "profiles" / "huge.yaml"
    bad.write_text("apiVersion: migd/v1\nkind: Profile\nname: huge\ngpus:\n  - select: all\n"
                   f"    instances: [{{profile: 1g, count: {huge}}}]\n")
    said = "huge.yaml:6:38: gpus[0].instances[0].count: "
    validate = migd.migctl("validate", str(bad))
    assert validate.code == 2 and validate.err.count("\n") == 1 and said in validate.err, validate
    assert "is not an integer migd reads (at most 40 characters)" in validate.err
    reload = migd.migctl("reload")
    assert reload.code == 2 and said in reload.err and "keeps its running configuration" in reload.err, reload
    assert migd.proc is not None and migd.proc.poll() is None
    bad.unlink()
    assert migd.migctl("reload").code == 0
    assert migd.stop() == 0
    migd.assert_no_traceback()


@pytest.mark.parametrize("line, said", [
    ('state_dir: "/tmp/st\\0ate"', "state_dir: holds a NUL byte"),  # (--check said ok; the start, a traceback)
    ('hooks: "hooks\\0.yaml"', "hooks: holds a NUL byte"),  # (a traceback in --check itself)
    ("strict_permissions: !!bool x", "strict_permissions: must be true or false, not 'x'")])  # (read as false)
def test_a_value_no_kernel_or_yaml_reads_is_refused_at_check(migd: MigdProcess, line: str, said: str) -> None:
    with migd.config.open("a") as f:
        f.write(line + "\n")
    check = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 2 and check.stderr.count("\n") == 1 and said in check.stderr, check


@pytest.mark.parametrize("value, said", [
    ("nope", "profiles_dir: profiles directory cannot be read: No such file or directory"),
    ("x" * 300, "profiles_dir: profiles directory cannot be read: File name too long"),  # (was "[Errno 36] File
    # name too long: '<the whole path>'", no file, line or field)
    ("migd.yaml", "profiles_dir: the profiles directory is a file, not a directory")])
def test_a_profiles_dir_that_cannot_be_listed_is_said_where_the_configuration_names_it(
        tmp_path: Path, value: str, said: str) -> None:
    from migd.config.migdyaml import load_config
    from migd.errors import ValidationError

    config = tmp_path / "migd.yaml"
    config.write_text(f"schedule:\n  - {{profile: day, at: '08:00'}}\nprofiles_dir: {value}\n")
    with pytest.raises(ValidationError) as e:
        load_config(config, config.read_text())
    assert str(e.value) == f"{config}:3:15: {said}", str(e.value)


def test_a_profiles_dir_this_user_may_not_list_is_said_not_taken_for_empty(tmp_path: Path) -> None:
    """glob finds nothing in a directory its reader may not list, and the schedule's profiles were then
    said not to exist: ``migctl what-if --config /etc/migd/migd.yaml``, which any user may run, misled."""
    from migd.ctl import whatif  # noqa: F401 - imported before the fork, which cannot read this interpreter's files
    from tests.helpers import migctl_as, need_root

    need_root("to become another user")
    tmp_path = Path(tempfile.mkdtemp(prefix="migd-cfg-", dir="/tmp"))  # (pytest's is root's alone: 0700 above)
    tmp_path.chmod(0o755)
    shutil.copytree(PROFILES, tmp_path / "profiles")
    (tmp_path / "profiles").chmod(0o700)
    config = tmp_path / "migd.yaml"
    config.write_text("schedule:\n  - {profile: day, at: '08:00'}\n")
    config.chmod(0o644)
    sacct = Path(__file__).resolve().parent / "fixtures" / "slurm" / "sacct-parsable2.txt"
    try:
        code, _, err = migctl_as(65534, 65534, ["what-if", "--sacct", str(sacct), "--config", str(config)])
    finally:
        shutil.rmtree(tmp_path)
    assert code == 2 and err == f"error: {tmp_path / 'profiles'}: profiles directory cannot be read: Permission " \
                                f"denied (the default, beside migd.yaml; profiles_dir: names another)\n", err
