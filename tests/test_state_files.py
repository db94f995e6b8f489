"""Every file migd keeps is untrusted until checked: damaged, of the right schema
but the wrong inner shape, or hand-edited, it is refused with one line naming the file and the field,
and what does not depend on it goes on: migd starts, ``migctl status`` answers.

Each file is a wire type (``migd.wire``), read and written by ``apply/statefile.py``; the files in
``tests/fixtures/state/`` are as migd wrote them before (commit aea9e7e, its own checks): they read,
and are written again byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.api.slurm import Phase, SlurmState
from migd.apply.journal import JournalDoc, Step, left_behind
from migd.apply.owners import Owners, OwnersDoc
from migd.apply.statefile import load
from migd.catalog.models import MODELS
from migd.errors import ValidationError
from migd.slurm.demandplan import History
from migd.slurm.transition import load_state
from migd.state.override import OverrideDoc, OverrideStore
from migd.wire import WireError, from_json, to_json
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, Migctl

STATE = Path(__file__).parent / "fixtures" / "state"
KINDS = {"journal.json": JournalDoc, "journal-relabel.json": JournalDoc, "owners.json": OwnersDoc,
         "override.json": OverrideDoc, "slurm.json": SlurmState, "demand.json": History}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_file_as_migd_wrote_it_reads_and_is_written_the_same(name: str) -> None:
    doc = load(STATE / name, KINDS[name])
    assert json.dumps(to_json(doc), separators=(",", ":")) == (STATE / name).read_text()


def test_what_the_files_say_is_read_back(tmp_path: Path) -> None:
    """The values behind the bytes: owner labels by GI start, a failed GPU's layout before, a relabel's
    labels after, the hold's times with their offsets, a switch's layouts kept for its undo."""
    journal = load(STATE / "journal.json", JournalDoc)
    ((uuid, entry),) = journal.unfinished().items()
    assert entry.status is Step.FAILED and entry.owners_before == dict.fromkeys(range(7), "notebooks")
    model = next(m for k, m in MODELS.items() if "A100" in k and "80" in k)
    assert len(entry.before.desired(model).instances) == 7 and journal.profile == "night"
    relabel = load(STATE / "journal-relabel.json", JournalDoc).gpus["GPU-1"]
    assert relabel.status is Step.RELABELING and relabel.owners_after == {0: "training"}
    assert Owners(STATE / "owners.json").load() == {uuid: dict.fromkeys(range(7), "notebooks")}
    kept = tmp_path / "override.json"
    kept.write_bytes((STATE / "override.json").read_bytes())
    ov = OverrideStore(kept).load()
    assert ov is not None and ov.profile.name == "night" and ov.until is not None and ov.until.utcoffset() is not None
    assert ov.until.isoformat() == "2026-11-23T19:00:00+00:00" and ov.since.isoformat() == "2026-11-23T02:30:00+00:00"
    switch = load_state(STATE / "slurm.json")
    assert switch.phase is Phase.SWITCHING and switch.before["GPU-1"].owners[0] == "notebooks"
    assert switch.before["GPU-1"].layout == entry.before
    history = load(STATE / "demand.json", History)
    assert history.switches == {"gpu1": (1795000000.0, 1795003600.5)} and history.left == {"gpu1": "day"}
    assert history.seen == {"2g.20gb": (1795003000.0, 1.0)}
    older = json.loads((STATE / "demand.json").read_text())
    del older["seen"]  # (written before the planner kept when it last saw each MIG type)
    (tmp_path / "demand.json").write_text(json.dumps(older))
    assert load(tmp_path / "demand.json", History).seen == {}


def test_a_journal_and_owners_from_before_versions_read_the_same(tmp_path: Path) -> None:
    old = json.loads((STATE / "journal.json").read_text())
    del old["schema"]
    (tmp_path / "journal.json").write_text(json.dumps(old))
    assert load(tmp_path / "journal.json", JournalDoc) == load(STATE / "journal.json", JournalDoc)
    (tmp_path / "owners.json").write_text(json.dumps(json.loads((STATE / "owners.json").read_text())["gpus"]))
    assert Owners(tmp_path / "owners.json").load() == Owners(STATE / "owners.json").load()


SWITCHES = {
    "owners keyed by a name": ("before.GPU-1.owners.first", {"layout": {"mig": True, "instances": []},
                                                            "owners": {"first": "nlp"}}),
    "a layout that is not one": ("before.GPU-1.layout", {"layout": [], "owners": {}}),
    "a CI without its start": ("before.GPU-1.layout.instances[0].cis[0]", {"layout": {"mig": True, "instances": [
        {"profile_id": 19, "start": 0, "owner": None, "cis": [[0]]}]}}),
}


@pytest.mark.parametrize("case", sorted(SWITCHES))
def test_a_misshapen_slurm_state_is_named_and_read_as_serving(tmp_path: Path, case: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    field, before = SWITCHES[case]
    doc = json.loads((STATE / "slurm.json").read_text())
    doc["before"] = {"GPU-1": before}
    path = tmp_path / "slurm.json"
    path.write_text(json.dumps(doc))
    assert load_state(path) == SlurmState()
    assert f"{path}: {field}: " in caplog.text, caplog.text


OWNERS = {
    "a list where a map belongs": {"schema": "migd.owners/v1", "gpus": {"GPU-1": ["notebooks"]}},
    "a key that is not a slice": {"schema": "migd.owners/v1", "gpus": {"GPU-1": {"first": "notebooks"}}},
    "an owner that is not text": {"schema": "migd.owners/v1", "gpus": {"GPU-1": {"0": 7}}},
    "gpus not a map": {"schema": "migd.owners/v1", "gpus": [1, 2]},
}


def _status(m: Migctl) -> subprocess.CompletedProcess[str]:
    return m.process("status", timeout=60)


@pytest.mark.parametrize("case", sorted(OWNERS))
@pytest.mark.integration
def test_a_misshapen_owners_file_is_ignored_with_a_named_field(tmp_path: Path, case: str) -> None:
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", "--local", str(PROFILES / "balanced.yaml")).code == 0
    (m.state_dir / "owners.json").write_text(json.dumps(OWNERS[case]))
    r = _status(m)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "GPU 0" in r.stdout
    assert f"owner labels ignored: {m.state_dir / 'owners.json'}: gpus" in r.stderr, r.stderr
    assert Owners(m.state_dir / "owners.json").load() == {}


JOURNALS = {
    "an index that is not a number": ("gpus.GPU-1.index", {"index": "zero"}),
    "owners_before keyed by a name": ("gpus.GPU-1.owners_before.first", {"owners_before": {"first": "x"}}),
    "a pid that is text": ("pid", None),
}


@pytest.mark.parametrize("case", sorted(JOURNALS))
@pytest.mark.integration
def test_a_misshapen_journal_is_reported_by_status_not_raised(tmp_path: Path, case: str) -> None:
    field, entry_change = JOURNALS[case]
    m = Migctl(tmp_path, "single-a100")
    assert m("status").code == 0
    entry = {"index": 0, "status": "applying", "done": 1, "ops": 4,
             "before": {"mig": False, "instances": []}, "owners_before": {}}
    doc = {"schema": "migd.journal/v1", "profile": "day", "pid": 1, "started": 0.0,
           "gpus": {"GPU-1": {**entry, **(entry_change or {})}}}
    if entry_change is None:
        doc["pid"] = "one"
    (m.state_dir).mkdir(exist_ok=True, mode=0o700)
    (m.state_dir / "journal.json").write_text(json.dumps(doc))
    r = _status(m)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    journal = m.state_dir / "journal.json"
    assert r.stdout.splitlines()[1].startswith(f"journal {journal} cannot be read ({journal}: {field}: "), r.stdout
    assert left_behind(m.state_dir / "journal.json")["error"]  # type: ignore[index]


DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE = {  # JSON that json.loads and int() refuse with a RecursionError or a ValueError, not a JSONDecodeError
    "nested 100,000 deep": (DEEP, "damaged: nested deeper than 32 levels"),
    "nested 100 deep (json reads it)": ("[" * 100 + "]" * 100, "damaged: nested deeper than 32 levels"),
    "a number of 5000 digits": ('{"pid": ' + "9" * 5000 + "}", "damaged: a number of more than 4300 digits"),
}


@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_file_json_cannot_read_is_one_located_line(tmp_path: Path, name: str, case: str) -> None:
    """Each was a traceback (RecursionError, ValueError) at migd's start and in migctl status."""
    text, words = HOSTILE[case]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValidationError) as e:
        load(path, KINDS[name])
    assert str(e.value) == f"{path}: {words}"


def test_an_int_key_of_5000_digits_is_a_wire_error_with_its_start() -> None:
    """``int()`` refuses more than 4300 digits with a ValueError: it was a traceback, and the field named the
    whole key."""
    with pytest.raises(WireError) as e:
        from_json(OwnersDoc, {"schema": "migd.owners/v1", "gpus": {"GPU-x": {"9" * 5000: "a"}}})
    assert str(e.value) == f"gpus.GPU-x.{'9' * 37}...: key of 5000 digits is not a number migd reads"


@pytest.mark.integration
def test_status_and_migd_over_files_json_cannot_read(tmp_path: Path) -> None:
    """Owners nested 100,000 deep, a journal with a 5000-digit key, an override nested 100,000 deep: one line
    each, ``status`` answers, migd starts (each was a traceback, migd's exit 1)."""
    m = MigdProcess(tmp_path, fleet="single-a100")
    try:
        state = m.migctl.state_dir
        assert m.migctl("apply", "--local", str(PROFILES / "day.yaml")).code == 0
        journal = {"schema": "migd.journal/v1", "profile": "night", "pid": 1, "started": 0.0, "gpus": {"GPU-1": {
            "status": "applying", "before": {"mig": False, "instances": []}, "owners_before": {"9" * 5000: "a"}}}}
        (state / "journal.json").write_text(json.dumps(journal))
        (state / "owners.json").write_text(DEEP)
        (state / "override.json").write_text(DEEP)
        r = _status(m.migctl)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert f"owner labels ignored: {state / 'owners.json'}: damaged: nested deeper than 32 levels" in r.stderr
        assert "key of 5000 digits is not a number migd reads" in r.stdout, r.stdout
        m.start()
        m.wait_ready()
        log = m.log.read_text()
        assert "Traceback" not in log and f"{state / 'override.json'}: damaged: nested deeper than 32" in log, log
        assert "owners_before.99999" in log and "recover --discard" in log, log
    finally:
        m.close()


@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("kind", ["a directory", "a FIFO"])
def test_a_file_that_is_not_a_regular_one_is_one_located_line(tmp_path: Path, name: str, kind: str) -> None:
    """A directory was read as "[Errno 21] Is a directory: 6" (a descriptor, not the file); a FIFO blocked."""
    path = tmp_path / name
    path.mkdir() if kind == "a directory" else os.mkfifo(path)
    with pytest.raises(ValidationError) as e:
        load(path, KINDS[name])
    assert str(e.value) == f"{path}: is {kind}, not a regular file"


@pytest.mark.integration
def test_state_files_that_are_directories_fall_back_as_damaged_ones(tmp_path: Path) -> None:
    """owners.json, override.json and journal.json made directories: ``status`` answers (it stopped, "not applied:
    6: Is a directory"), migd starts and sets the override aside, the journal is kept for ``recover --discard``,
    and the next write of the labels sets their directory aside (no file can be renamed over one)."""
    m = MigdProcess(tmp_path, fleet="single-a100")
    try:
        state = m.migctl.state_dir
        assert m.migctl("apply", "--local", str(PROFILES / "day.yaml")).code == 0
        (state / "owners.json").unlink()
        for name in ("owners.json", "override.json", "journal.json"):
            (state / name).mkdir()
        r = _status(m.migctl)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert f"owner labels ignored: {state / 'owners.json'}: is a directory, not a regular file" in r.stderr
        assert f"({state / 'journal.json'}: is a directory, not a regular file)" in r.stdout, r.stdout
        r = m.migctl.process("recover")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "recover --discard" in r.stderr, r.stderr
        m.start()
        m.wait_ready()
        log = m.log.read_text()
        assert "Traceback" not in log and f"{state / 'override.json'}: is a directory, not a regular file; " \
            f"set aside as {state / 'override.json'}.unreadable-" in log, log
        m.stop()
        assert m.migctl("recover", "--discard", "--yes").code == 0 and not (state / "journal.json").exists()
        r = m.migctl.process("apply", "--local", str(PROFILES / "night.yaml"))
        assert r.returncode == 0 and "set aside as" in r.stderr and (state / "owners.json").is_file(), r.stderr
    finally:
        m.close()


@pytest.mark.parametrize(("pid", "shown"), [(0, "0"), (-1, "-1"), (2**22, "4194304"),
                                            (10**30, "100000000... (31 digits)")])
def test_a_journal_pid_no_process_has_is_refused_by_name(tmp_path: Path, pid: int, shown: str) -> None:
    """0 and -1 name a process group (``os.kill`` succeeds: status said "an apply of night is in progress (pid
    0)"); 10**30 overflowed ``os.kill`` (a traceback in status)."""
    doc = json.loads((STATE / "journal.json").read_text())
    doc["pid"] = pid
    path = tmp_path / "journal.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValidationError) as e:
        load(path, JournalDoc)
    assert str(e.value) == f"{path}: pid: {shown} is not a process id (1 to 4194303)"
    seen = left_behind(path)
    assert seen is not None and seen["running"] is False and seen["error"] == str(e.value)


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="single-a100")
    yield m
    m.close()


def _override(until: object, since: object = "2026-11-23T01:00:00+00:00") -> dict[str, object]:
    return {"schema": "migd.override/v1", "profile": "night", "source": "night.yaml", "config": None,
            "text": (PROFILES / "night.yaml").read_text(), "until": until, "since": since}


@pytest.mark.parametrize(("until", "since", "field"), [
    ("2026-11-23T19:00:00", "2026-11-23T01:00:00+00:00", "until"),  # hand-edited: no UTC offset
    ("2026-11-23T19:00:00+00:00", 1732300000, "since"),
    ("tomorrow", "2026-11-23T01:00:00+00:00", "until"),
])
@pytest.mark.integration
def test_migd_starts_over_a_hand_edited_override(migd: MigdProcess, until: object, since: object,
                                                 field: str) -> None:
    """An override whose ``until`` had no offset crashed migd's start with a traceback (a restart loop)."""
    migd.migctl.state_dir.mkdir(mode=0o700, exist_ok=True)
    path = migd.migctl.state_dir / "override.json"
    path.write_text(json.dumps(_override(until, since)))
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    migd.wait_until(lambda: migd.assert_profile("day"))  # the schedule holds
    log = migd.log.read_text()
    assert "Traceback" not in log
    assert f"ignoring the kept manual override {path}, which cannot be read: {path}: {field}: " in log, log
    assert OverrideStore(path).load() is None


def test_a_kept_override_whose_profile_text_is_bad_says_it_is_the_kept_copy(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The line and column are the kept text's: said as the original path, the operator looked at a file
    that may well be fine."""
    doc = json.loads((STATE / "override.json").read_text())
    doc["text"] = doc["text"].replace("{profile: 7g, owner: training}", "{profile: 7g, count: 99, owner: training}")
    kept = tmp_path / "override.json"
    kept.write_text(json.dumps(doc))
    with caplog.at_level("ERROR"):
        assert OverrideStore(kept).load() is None
    said = f"ignoring the kept manual override {kept}, which cannot be read: the copy of {doc['source']} it keeps " \
           f"(its text) is not a valid profile: {doc['source']}:"
    assert [r.message for r in caplog.records if r.message.startswith(said)], [r.message for r in caplog.records]
    assert not kept.exists()  # (removed: the schedule holds)


@pytest.mark.parametrize("name", ["slurm.json", "demand.json", "owners.json"])
def test_every_state_files_write_sets_a_directory_in_its_place_aside(tmp_path: Path, name: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """No rename puts a file over a directory: the labels' write set one aside, slurm.json's write (in the
    middle of a Slurm switch) failed with IsADirectoryError.  Every write does it now, and says so."""
    from migd.apply.statefile import atomic_write_json
    (tmp_path / name).mkdir()
    with caplog.at_level("ERROR"):
        atomic_write_json(tmp_path / name, {"a": 1})
    assert json.loads((tmp_path / name).read_text()) == {"a": 1}
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith(f"{name}.unreadable-")]
    assert aside.is_dir() and any(f"set aside as {aside}" in r.message for r in caplog.records), caplog.records


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_simulator_state_that_is_no_regular_file_is_a_hardware_error_not_a_hang(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--sim-state`` of a FIFO blocked migctl for ever, and /dev/zero ended in MemoryError (a traceback):
    the simulated node's state is refused as any file that is no regular one (migd.trust)."""
    from migd.ctl.migctl import main as migctl

    state = tmp_path / "fifo" if kind == "fifo" else Path(kind)
    if kind == "fifo":
        os.mkfifo(state)
    code = migctl(["--sim", "dgx-h100", "--sim-state", str(state), "--state-dir", str(tmp_path / "st"), "status"])
    assert code == 4
    err = capsys.readouterr().err
    assert err == f"hardware error: simulator state {state} cannot be read: it is a " \
                  f"{'FIFO' if kind == 'fifo' else 'character device'}, not a regular file\n", err


@pytest.mark.parametrize("text", ['{"gpus": 5}', "[]", "{}"])
def test_a_simulator_state_of_another_shape_is_said_in_one_line_of_migds_words(
        tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON that is no simulated node's state was said in Python's words ("'int' object is not iterable")."""
    from migd.ctl.migctl import main as migctl

    state = tmp_path / "node.json"
    state.write_text(text)
    assert migctl(["--sim", "dgx-h100", "--sim-state", str(state), "--state-dir", str(tmp_path / "st"), "status"]) == 4
    assert capsys.readouterr().err == f"hardware error: simulator state {state} cannot be read: its JSON is not a " \
                                      "simulated node's (a new node is made at a path of its own)\n"
