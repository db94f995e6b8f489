"""Every file migd keeps is untrusted until checked (issue 29, class 3): damaged, of the right schema
but the wrong inner shape, or hand-edited, it is refused with one line naming the file and the field,
and what does not depend on it goes on: migd starts, ``migctl status`` answers."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.apply.journal import left_behind
from migd.apply.owners import Owners
from migd.state.override import OverrideStore
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, Migctl

OWNERS = {
    "a list where a map belongs": {"schema": "migd.owners/v1", "gpus": {"GPU-1": ["notebooks"]}},
    "a key that is not a slice": {"schema": "migd.owners/v1", "gpus": {"GPU-1": {"first": "notebooks"}}},
    "an owner that is not text": {"schema": "migd.owners/v1", "gpus": {"GPU-1": {"0": 7}}},
    "gpus not a map": {"schema": "migd.owners/v1", "gpus": [1, 2]},
}


def _status(m: Migctl) -> subprocess.CompletedProcess[str]:
    return m.process("status", timeout=60)


@pytest.mark.parametrize("case", sorted(OWNERS))
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
