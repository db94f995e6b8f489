"""Journal discipline: every way an apply can be interrupted leaves a journal that recovers it.

The crash matrix covers SIGKILL after each NVML mutation; these cover the other interruptions:
Ctrl-C, a disk that runs full, a rollback that fails, a GPU missing at recovery, a damaged
journal.  The journal goes only when every GPU it names is in its old or its new layout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.apply.journal import Journal, JournalDoc
from migd.apply.recovery import recover
from migd.errors import ValidationError
from migd.sim import world
from migd.sim.state import StateStore
from tests.helpers import MIGCTL, PROFILES, REPO, Migctl

NIGHT = str(PROFILES / "night.yaml")


def _day(tmp: Path, fleet: str = "single-a100") -> tuple[Migctl, StateStore, object]:
    m = Migctl(tmp, fleet)
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    return m, StateStore(m.state), m.layout()


def _spawn(m: Migctl, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*MIGCTL, "--sim", m.fleet, "--sim-state", str(m.state),
                             "--state-dir", str(m.state_dir), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def _under_way(store: StateStore, steps: int = 3, timeout: float = 30.0) -> None:
    base = store.read().mutations
    deadline = time.monotonic() + timeout
    while store.read().mutations < base + steps:
        assert time.monotonic() < deadline, "the apply never got under way"
        time.sleep(0.02)


def _interrupted(tmp: Path, times: int) -> tuple[Migctl, object, subprocess.Popen[str], str, str]:
    """migctl apply day -> night on a slow driver, Ctrl-C'd ``times`` times once under way."""
    m, store, before = _day(tmp)
    world.set_mutation_delay(store, 0.3)
    p = _spawn(m, "apply", NIGHT)
    _under_way(store)
    for _ in range(times):
        p.send_signal(signal.SIGINT)
        time.sleep(0.1)
    out, err = p.communicate(timeout=60)
    world.set_mutation_delay(store, 0)
    return m, before, p, out, err


@pytest.mark.integration
def test_ctrl_c_cancels_and_says_so_once(tmp_path: Path) -> None:
    """One account, not a log line per GPU (it printed 17 ERROR/WARNING lines on 8 GPUs): what was
    asked, what happened, exit 130; every GPU as it was and no journal left."""
    m, before, p, out, err = _interrupted(tmp_path, 1)
    assert p.returncode == 130 and "Traceback" not in err, (out, err)
    assert err.startswith("cancelling: ") and "interrupted: the apply was cancelled" in err, err
    assert "ERROR" not in err and "WARNING" not in err and len(err.splitlines()) == 2, err
    assert out.startswith("night: cancelled in "), out
    assert "GPU 0 cancelled: stopped on request" in out and m.layout() == before, out
    assert not (m.state_dir / "journal.json").exists()


@pytest.mark.integration
def test_a_second_ctrl_c_keeps_the_journal(tmp_path: Path) -> None:
    m, before, p, out, err = _interrupted(tmp_path, 2)
    # 130 when the interrupt lands between NVML calls; 4 when the simulated library takes it inside
    # a call, fails that call and so fails the rollback: either way the journal stays for recover.
    # A Python callback can be interrupted even before its first line, where ctypes prints
    # "Exception ignored" itself: the simulator's artefact (a real libnvidia-ml runs no Python).
    sim_noise = "Exception ignored on calling ctypes callback function"
    assert p.returncode in (130, 4) and (err.count("Traceback") == err.count(sim_noise)), (out, err)
    assert "migctl recover" in err or "journal keeps the previous layout" in out, (out, err)
    assert (m.state_dir / "journal.json").exists()
    r = m("recover")
    assert r.code == 0 and m.layout() == before and not (m.state_dir / "journal.json").exists(), r.out + r.err


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs for the state dir, so a disk can really run full."""
    where = tmp_path / "fs"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.integration
def test_disk_full_mid_apply_rolls_back_without_a_traceback(tmp_path: Path, small_fs: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    m.state_dir = small_fs / "state"
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    before, store = m.layout(), StateStore(m.state)
    world.fill_disk_after_mutations(store, 3, small_fs / "filler")
    r = m("apply", NIGHT)
    assert r.code == 1 and "Traceback" not in r.err, r.out + r.err
    # the first write after the GPU's change is its owner labels (before the journal says done)
    assert re.search(r"ROLLED BACK: cannot write the (journal|owner labels \S+): No space left on device", r.out), r.out
    assert m.layout() == before  # no GPU instance left without its compute instance
    assert not (m.state_dir / "journal.json").exists()
    (small_fs / "filler").unlink()
    assert m("apply", NIGHT).code == 0


@pytest.mark.integration
def test_disk_full_before_the_first_step_changes_nothing(tmp_path: Path, small_fs: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    m.state_dir = small_fs / "state"
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    before = m.layout()
    world.fill_disk_after_mutations(StateStore(m.state), 0, small_fs / "filler")  # fill now, via any write
    with open(small_fs / "filler", "ab") as f:  # (the simulator fills on a mutation; none comes first here)
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    r = m("apply", NIGHT)
    assert r.code == 1 and "Traceback" not in r.err and "No space left" in r.err, r.err
    assert m.layout() == before and not (m.state_dir / "journal.json").exists()


def test_an_apply_never_runs_over_an_unresolved_journal(tmp_path: Path) -> None:
    """The apply fails, its rollback fails, and so does the next start's: the next apply must not
    overwrite the only record of the previous layout (it used to, and exit 0)."""
    m, store, before = _day(tmp_path)
    world.fail_call(store, "*mutation*", 999, nth=3)  # the apply fails ...
    world.fail_call(store, "*mutation*", 999, nth=4)  # ... and so does its rollback
    r = m("apply", NIGHT)
    assert r.code == 4 and "ROLLBACK FAILED" in r.out
    journal = (m.state_dir / "journal.json").read_text()
    world.fail_call(store, "*mutation*", 999, nth=1)  # the next apply's recovery fails too
    r = m("apply", NIGHT)
    assert r.code == 4 and "interrupted apply is not resolved" in r.err and "Traceback" not in r.err, r.err
    assert json.loads((m.state_dir / "journal.json").read_text())["started"] == json.loads(journal)["started"]
    assert m("recover").code == 0 and m.layout() == before


@pytest.mark.integration
def test_recover_keeps_the_journal_of_a_missing_gpu(tmp_path: Path) -> None:
    m, store, before = _day(tmp_path, "dgx-a100")
    world.crash_after_mutations(store, 20)
    p = _spawn(m, "apply", NIGHT)
    p.communicate(timeout=60)
    assert p.returncode == -9 and m.layout() != before
    world.set_lost(store, 1)
    r = m("recover")
    assert r.code == 4 and "is not present" in r.err and "Traceback" not in r.err, r.out + r.err
    assert (m.state_dir / "journal.json").exists()
    world.set_lost(store, 1, False)
    r = m("recover")
    assert r.code == 0 and m.layout() == before and not (m.state_dir / "journal.json").exists(), r.out


@pytest.mark.parametrize("text, words", [
    ("", "is empty"),
    ('{"schema": "migd.journal/v1", "gpus": {"GPU-1": {"status": "app', "damaged, not JSON"),
    ('{"profile": "night", "gpus": {"GPU-1": {"status": "applying"}}}', "gpus.GPU-1.before"),
    ('{"schema": "migd.journal/v1", "gpus": []}', "gpus"),
    ('{"schema": "migd.journal/v1", "gpus": {"GPU-1": {"status": "odd", "before": {}}}}', "gpus.GPU-1.status"),
    ('[1, 2]', "schema"),
])
@pytest.mark.integration
def test_a_damaged_journal_is_a_located_error_and_is_kept(tmp_path: Path, text: str, words: str) -> None:
    m, _, before = _day(tmp_path)
    journal = m.state_dir / "journal.json"
    journal.write_text(text)
    for args in (("recover",), ("apply", NIGHT), ("apply", NIGHT, "--dry-run")):
        r = m(*args)
        assert r.code == 2 and "Traceback" not in r.err and str(journal) in r.err and words in r.err, (args, r.err)
        assert len(r.err.strip().splitlines()) == 1 and "recover --discard" in r.err
    assert journal.read_text() == text and m.layout() == before
    r = m("recover", "--discard", "--yes")
    assert r.code == 0 and not journal.exists() and list(m.state_dir.glob("journal.json.discarded-*"))
    assert m("apply", NIGHT).code == 0


EDITS = {  # a hand edit of the last GPU's layout before the apply: what recovery would have restored
    "a negative GI start": ("start", -5, "instances[0]: start -5 is not one for 1 of 8 slices (0 to 7)"),
    "a GI start of 21 digits": ("start", 10**20, "instances[0]: start 100000000... (21 digits) is not one for 1 of 8"),
    "a negative CI start": ("cis", [[0, -3]], "instances[0].cis[0]: start -3 is not one for 1 of 1 slices"),
    "an unknown CI profile": ("cis", [[99, 0]], "instances[0].cis[0]: CI profile 99 is unknown in 1g.10gb"),
}


@pytest.mark.integration
def test_a_hand_edited_layout_in_the_journal_is_refused_before_any_gpu_is_restored(tmp_path: Path) -> None:
    """A negative start was "ValueError: negative shift count" (a huge one an OverflowError) in the planner, at
    migd's start, recover and apply; an unknown CI profile was restored as the GI's default CI.  Each is one
    line naming the file and field, and no GPU is restored before it (the edited one is the last)."""
    m, store, before = _day(tmp_path, "dgx-a100")
    world.crash_after_mutations(store, 20)
    p = _spawn(m, "apply", NIGHT)
    p.communicate(timeout=60)
    crashed, journal = m.layout(), m.state_dir / "journal.json"
    assert p.returncode == -9 and crashed != before
    doc = json.loads(journal.read_text())
    last = list(doc["gpus"])[-1]
    for case, (key, value, words) in EDITS.items():
        edited = json.loads(json.dumps(doc))
        edited["gpus"][last]["before"]["instances"][0][key] = value
        journal.write_text(json.dumps(edited))
        for args in (("recover",), ("apply", NIGHT)):
            r = m(*args)
            assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, (case, r.err)
            assert f"{journal}: gpus.{last}.before: {words}" in r.err and "recover --discard" in r.err, (case, r.err)
            assert m.layout() == crashed and json.loads(journal.read_text()) == edited, case
    journal.write_text(json.dumps(doc))
    assert m("recover").code == 0 and m.layout() == before


def test_recover_names_the_journal_whatever_its_load_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ValueError that is no ValidationError (int()'s digit limit was one) was reported as "None: ..."."""
    journal = Journal(tmp_path / "journal.json")
    journal.path.write_text("{}")

    def load() -> JournalDoc:
        raise ValueError("odd")

    monkeypatch.setattr(journal, "load", load)
    with pytest.raises(ValidationError) as e:
        recover(journal, None, None, None)  # type: ignore[arg-type]  (none is reached)
    assert str(e.value).startswith(f"{journal.path}: odd; kept for the operator"), str(e.value)


def test_statefile_symlinks_are_never_followed(tmp_path: Path) -> None:
    """Another user plants symlinks in the state dir: root's apply must not write through them."""
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    owners = m.state_dir / "owners.json"
    owners.unlink()
    owners.symlink_to(victim)
    for pid in range(os.getpid() - 5, os.getpid() + 50):  # the old predictable temp names, too
        (m.state_dir / f".owners.json.{pid}.tmp").symlink_to(victim)
    assert m("apply", NIGHT).code == 0
    assert victim.read_text() == "precious\n" and not owners.is_symlink()
    journal = m.state_dir / "journal.json"
    journal.symlink_to(victim)
    r = m("apply", str(PROFILES / "day.yaml"))
    assert r.code == 2 and "is a symbolic link" in r.err and victim.read_text() == "precious\n", r.err


def test_an_apply_writes_the_journal_at_most_twice_per_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16: what recovery needs is the before-layouts (one write) and each GPU's outcome (one
    write per GPU), not every step: 145 synced writes for day->night on 8 GPUs became 9."""
    import migd.apply.journal as journal_module
    writes: list[str] = []
    real = journal_module.atomic_write_json

    def counting(path: Path, data: object, mode: int = 0o600, **how: bool) -> None:
        writes.append(str(path))
        real(path, data, mode, **how)
    monkeypatch.setattr(journal_module, "atomic_write_json", counting)
    m = Migctl(tmp_path, "dgx-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    writes.clear()
    assert m("apply", NIGHT).code == 0
    assert 0 < len(writes) <= 2 * 8 and len(writes) == 1 + 8


def test_an_apply_syncs_the_journal_at_most_twice_per_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16 counts fsync calls: every atomic write syncs its file and, but for a GPU's outcome,
    its directory (the journal's previous version is as safe to find after a power loss: it names
    the GPU as still applying, which recovery rolls back).  day->night on 8 GPUs: 18 calls became 10."""
    synced: list[tuple[int, str]] = []  # (thread, path): GPUs are applied in parallel
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append((threading.get_ident(), os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)
    monkeypatch.setattr(os, "fsync", counting)
    m = Migctl(tmp_path, "dgx-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    synced.clear()
    assert m("apply", NIGHT).code == 0
    state_dir = str(m.state_dir.resolve())
    journal = [i for i, (_, p) in enumerate(synced) if ".journal.json." in p]
    # the directory a thread syncs next after a journal file is the journal's
    dirs = [i for i in journal
            if next((p for t, p in synced[i + 1:] if t == synced[i][0]), None) == state_dir]
    assert len(journal) == 1 + 8 and len(dirs) == 1, synced
    assert len(journal) + len(dirs) <= 2 * 8


@pytest.mark.integration
def test_a_full_disk_when_the_lock_is_taken_leaves_the_lock_free(tmp_path: Path, small_fs: Path) -> None:
    """The lock's PID could not be written (ENOSPC): its descriptor used to stay open, and every later
    apply of that process (migd's, for as long as it lived) was refused: "held by pid unknown"."""
    m = Migctl(tmp_path, "single-a100")
    m.state_dir = small_fs / "state"
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    (m.state_dir / "apply.lock").unlink()  # the next apply creates it anew: its PID needs a block
    with open(small_fs / "filler", "ab", buffering=0) as f:  # the file system full to the last block
        for size in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    r = m("apply", NIGHT)
    assert r.code == 1 and "No space left" in r.err and "Traceback" not in r.err, r.err
    (small_fs / "filler").unlink()
    r = m("apply", NIGHT)  # the same process, as migd is: the lock is free again
    assert r.code == 0, r.err
