"""Hooks release what they take on every path: processes, pipes, memory, and are
checked when they run, not only when loaded (class 3).  Each hook is a real process started by a
real ``migctl apply --local --hooks`` (or the same runner migd uses)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from migd.apply.hooks import Hook, HookError, Hooks
from migd.apply.lock import ApplyLock, LockBusy
from tests.helpers import PROFILES, Migctl


def _script(tmp: Path, name: str, body: str) -> Path:
    path = tmp / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _hooks(tmp: Path, program: Path, timeout: str = "3s", phase: str = "apply-start") -> Path:
    path = tmp / "hooks.yaml"
    path.write_text(f"hooks:\n  {phase}:\n    - {{command: [{program}], timeout: {timeout}}}\n")
    path.chmod(0o644)
    return path


def _alive(marker: str) -> list[str]:
    r = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return r.stdout.split()


@pytest.mark.integration
def test_a_hook_that_hangs_in_a_child_leaves_no_process_behind(tmp_path: Path) -> None:
    """It used to kill only the hook's shell: each retry left another root ``sleep`` forever."""
    marker = f"sleep 987{os.getpid() % 1000}.5"
    hook = _script(tmp_path, "hang.sh", f"{marker}\n")
    m = Migctl(tmp_path, "single-a100")
    for _ in range(2):  # a retry
        r = m("apply", "--local", str(PROFILES / "day.yaml"), "--hooks", str(_hooks(tmp_path, hook, "1s")))
        assert r.code == 1 and "timed out after 1s (its process group was killed)" in r.err, r.err
    deadline = time.monotonic() + 10
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(marker) == []


@pytest.mark.integration
def test_a_hook_that_leaves_a_helper_holding_its_output_is_done_when_it_exits(tmp_path: Path) -> None:
    """It used to wait for end-of-file on the pipe the helper held: every apply 'timed out'."""
    marker = f"sleep 876{os.getpid() % 1000}.5"
    hook = _script(tmp_path, "helper.sh", f"{marker} &\necho started a helper\nexit 0\n")
    m = Migctl(tmp_path, "single-a100")
    try:
        r = m("apply", "--local", str(PROFILES / "day.yaml"), "--hooks", str(_hooks(tmp_path, hook, "20s")))
        assert r.code == 0, r.err
        assert "timed out" not in r.err
    finally:
        subprocess.run(["pkill", "-f", marker], check=False)


@pytest.mark.integration
def test_a_hook_that_prints_without_end_does_not_grow_migd(tmp_path: Path) -> None:
    """200 MB of output used to be kept whole (migd's RSS 610 MB); only the tail is kept now."""
    hook = _script(tmp_path, "loud.sh", "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | head -c 200000000\n"
                   "echo\necho last line\nexit 7\n")
    # VmHWM: this process's own peak (ru_maxrss would carry over pytest's, from before the exec)
    code = ("import sys\nfrom migd.apply.hooks import Hook, Hooks, HookError\n"
            f"hooks = Hooks({{'apply-start': [Hook(argv=({str(hook)!r},), timeout_s=120)]}})\n"
            "try:\n    hooks.run('apply-start', {})\nexcept HookError as e:\n    print(e)\n"
            "print(next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM')) // 1024)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    message, peak_mib = r.stdout.splitlines()
    assert message == f"apply-start: hook {hook} exited 7: last line", r.stdout
    assert int(peak_mib) < 120, f"peak RSS {peak_mib} MiB while a hook printed 200 MB"


def test_a_missing_hook_is_refused_when_loaded(tmp_path: Path) -> None:
    """A hook path that does not exist yet could be created later by someone else, and run as root."""
    m = Migctl(tmp_path, "single-a100")
    hooks = _hooks(tmp_path, tmp_path / "not-yet.sh")
    r = m("apply", "--local", str(PROFILES / "day.yaml"), "--hooks", str(hooks))
    assert r.code == 2 and "does not exist" in r.err and str(hooks) in r.err, r.err
    assert not (m.state_dir / "journal.json").exists()


@pytest.mark.parametrize("entry, said", [
    ('{command: /bin/true, args: ["a\\0b"]}', "holds a NUL byte"),
    ('{command: /bin/true, envs: {"A=B": x}}', "is not an environment variable name"),
    ('{command: /bin/true, envs: {"": x}}', "is not an environment variable name"),
    ('{command: /bin/true, envs: {A: "x\\0y"}}', "holds a NUL byte"),
    ('{command: /bin/true, workdir: "/tmp\\0x"}', "holds a NUL byte")])
def test_a_hook_no_program_could_be_given_is_refused_when_loaded(tmp_path: Path, entry: str, said: str) -> None:
    """A NUL in an argument, environment value or working directory, or a name holding ``=``, passed
    loading and crashed the apply (``ValueError: embedded null byte``), at apply-exit after the GPUs had
    changed; it is one line naming the hooks file, exit 2, nothing changed."""
    m = Migctl(tmp_path, "single-a100")
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(f"version: v1\nhooks:\n  apply-exit:\n    - {entry}\n")
    hooks.chmod(0o644)
    r = m("apply", "--local", str(PROFILES / "day.yaml"), "--hooks", str(hooks))
    assert r.code == 2 and r.err.startswith(f"error: {hooks}:4:") and said in r.err and r.err.count("\n") == 1, r.err
    assert not (m.state_dir / "journal.json").exists() and m("status").out.count("MIG disabled") == 1


@pytest.mark.integration
def test_slurms_environment_is_checked_as_a_hooks_is(tmp_path: Path) -> None:
    """``slurm.env`` reaches every Slurm command as a hook's ``envs`` reaches its program."""
    cfg = tmp_path / "migd.yaml"
    cfg.write_text(f"profiles_dir: {PROFILES}\nschedule:\n  - {{profile: day, at: \"08:30\"}}\n"
                   "slurm: {node: n1, env: {\"A=B\": x}}\n")
    r = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(cfg), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not an environment variable name" in r.stderr and r.stderr.count("\n") == 1, r


@pytest.mark.skipif(os.geteuid() != 0, reason="StrictModes applies to root")
@pytest.mark.integration
def test_a_hook_made_writable_after_loading_is_refused_when_it_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    hook = _script(tmp_path, "hook.sh", f"touch {ran}\n")
    tmp_path.chmod(0o755)
    hooks = Hooks({"apply-start": [Hook(argv=(str(hook),), timeout_s=5, strict=True)]})
    hooks.run("apply-start", {})
    assert ran.exists()
    ran.unlink()
    hook.chmod(0o777)  # someone loosened it after migd loaded its config
    with pytest.raises(HookError, match="writable by group or others"):
        hooks.run("apply-start", {})
    assert not ran.exists()


def test_a_full_disk_when_the_lock_is_taken_does_not_keep_it(tmp_path: Path) -> None:
    """The lock's PID could not be written (ENOSPC): its descriptor was never closed, and every later
    apply of that process was 'held by pid unknown'.  A failed acquire now releases it."""
    path = tmp_path / "state" / "apply.lock"
    lock = ApplyLock(path)
    real_pwrite = os.pwrite

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(28, "No space left on device")
    os.pwrite = full  # type: ignore[assignment]
    try:
        with pytest.raises(OSError, match="No space left"):
            lock.acquire()
    finally:
        os.pwrite = real_pwrite
    with ApplyLock(path), pytest.raises(LockBusy):  # free again, and held by this one
        ApplyLock(path).acquire()


def test_the_lock_file_is_never_opened_through_a_symlink(tmp_path: Path) -> None:
    """A planted ``apply.lock -> /etc/...`` used to have root truncate the target to write a PID."""
    victim = tmp_path / "victim.conf"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "apply.lock").symlink_to(victim)
    m = Migctl(tmp_path, "single-a100")
    m.state_dir = state
    r = m("apply", "--local", str(PROFILES / "day.yaml"))
    assert r.code == 2 and "apply.lock: is a symbolic link" in r.err and "Traceback" not in r.err, r.err
    assert victim.read_text() == "precious\n"
