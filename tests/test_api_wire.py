"""The wire types of ``migd.api``: what a client sends is what migd reads back, field for field, and a
request migd cannot use is refused by name."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from migd.api.commands import (
    DAEMON_LOCK_TIMEOUT_S,
    ApplyReply,
    ApplyRequest,
    Ask,
    BadJson,
    ClearedReply,
    ManualApply,
    Refusal,
    ReloadReply,
    ResumeReply,
    parse_object,
)
from migd.apply.result import OnBusy
from migd.errors import ValidationError
from migd.wire import Value, WireError, from_json, to_json


def test_an_apply_request_survives_the_socket() -> None:
    sent = ApplyRequest.of("/home/a/night.yaml", "apiVersion: migd/v1\n", "cfg", ManualApply(
        on_busy=OnBusy.WAIT, dry_run=True, busy_timeout_s=90.0, lock_timeout_s=0.0, parallel=False, mode_only=True),
        withdraw_on_hangup=True)
    wire = to_json(sent)
    assert wire["cmd"] == "apply" and wire["on_busy"] == "wait" and wire["busy_timeout_s"] == 90.0  # (flat)
    assert from_json(ApplyRequest, wire) == sent and from_json(ApplyRequest, wire).options == sent.options


def test_a_request_from_an_older_client_takes_the_daemons_defaults() -> None:
    got = from_json(ApplyRequest, {"cmd": "apply", "file": "p.yaml", "text": "x: 1\n"})
    assert got.options == ManualApply() and got.options.lock_timeout_s == DAEMON_LOCK_TIMEOUT_S
    assert got.withdraw_on_hangup is False  # only a client that asks for it is withdrawn by a hang-up


def test_a_request_without_the_profile_text_is_refused_by_name() -> None:
    got = from_json(ApplyRequest, {"cmd": "apply", "file": "p.yaml"})
    with pytest.raises(ValidationError, match="carries no profile text"):
        got.profile_text()


def test_a_profile_text_no_file_could_hold_is_refused_naming_the_file() -> None:
    got = from_json(ApplyRequest, {"cmd": "apply", "file": "p.yaml", "text": "name: a\udc80\n"})
    with pytest.raises(ValidationError, match=r"^p.yaml: the profile text is not UTF-8 \(a lone surrogate at "
                                              r"character 7\)$"):
        got.profile_text()


@pytest.mark.parametrize(("req", "error"), [
    ({"cmd": "apply", "file": 7, "text": ""}, "file: expected str"),
    ({"cmd": "apply", "file": "p.yaml", "text": "", "config": ["a"]}, "config: expected str"),
    ({"cmd": "apply", "file": "p.yaml", "text": "", "on_busy": "maybe"}, "on_busy: 'maybe' is not one of"),
    ({"cmd": "apply", "file": "p.yaml", "text": "", "lock_timeout_s": True}, "lock_timeout_s: expected float"),
    ({"cmd": "apply", "file": "p.yaml", "text": "", "busy_timeout_s": -1},
     "busy_timeout_s -1: must be seconds from 0 to 31622400 \\(a year\\)"),
    ({"cmd": "reboot"}, "cmd: 'reboot' is not one of status, layout"),
    ({"cmd": ["status"]}, "cmd: \\['status'\\] is not one of"),
])
def test_a_request_migd_cannot_use_is_refused_by_name(req: dict[str, object], error: str) -> None:
    """Every field is read through its type: a misfit is a ValueError naming the field (said to the
    client as `bad request: ...`)."""
    kind = ApplyRequest if req.get("cmd") == "apply" else Ask
    with pytest.raises(ValueError, match=error):
        from_json(kind, req)


@pytest.mark.parametrize("reply", [
    Refusal(False, 2, "bad request: x"), ReloadReply(True, 0, "ok"), ClearedReply(True, 0, ("GPU-1",)),
    ResumeReply(True, 0, None, "day", None), ApplyReply(False, 3, "busy", ("w",)),
])
def test_each_reply_survives_the_socket(reply: object) -> None:
    assert from_json(type(reply), json.loads(json.dumps(to_json(reply)))) == reply


def test_the_slurm_state_survives_its_file(tmp_path: Path) -> None:
    """migd.slurm/v2 as SlurmGate writes and reads it; the snapshot is a copy the daemon's thread cannot
    change under a scrape, and status shows the switch, not the layouts kept for a rollback."""
    from migd.api.slurm import Phase, SlurmSnapshot, SlurmState, SwitchBefore
    from migd.apply.journal import InstanceDoc, LayoutDoc
    from migd.apply.statefile import atomic_write_json, load, read_json
    before = {"GPU-1": SwitchBefore(LayoutDoc(True, (InstanceDoc(9, 0, owner="nlp", cis=((0, 0),)),)), {0: "nlp"})}
    state = SlurmState(Phase.RESUMING, "night", False, "migd-gpu1", 1795000000.0, 3, None, "jobs 7, 9", 1794999000.5,
                       True, "switched to night", True, before)
    path = tmp_path / "slurm.json"
    atomic_write_json(path, state)
    doc = read_json(path)
    assert doc["schema"] == "migd.slurm/v2" and doc["before"]["GPU-1"]["owners"] == {"0": "nlp"}
    assert load(path, SlurmState) == state
    snap = SlurmSnapshot.of("gpu1", state)
    state.phase = Phase.SERVING
    state.before.clear()
    assert snap.state.phase is Phase.RESUMING and snap.state.before and snap.view().node == "gpu1"
    assert "before" not in to_json(snap.view()) and to_json(snap.view())["ended_reason"] == "switched to night"


def test_a_v1_slurm_state_reads_as_v2(tmp_path: Path) -> None:
    """A file a migd before v2 left mid-switch is taken up by this one (the fields v2 added keep defaults)."""
    from migd.api.slurm import Phase
    from migd.slurm.transition import load_state
    path = tmp_path / "slurm.json"
    path.write_text('{"schema": "migd.slurm/v1", "phase": "switching", "profile": "night", "was_serving": true, '
                    '"reservation": null, "gres_in_sync": null}')
    state = load_state(path)
    assert state.phase is Phase.SWITCHING and state.profile == "night" and state.before == {} and state.agree


def test_a_kept_manual_apply_survives_its_file(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from migd.profiles.loader import load_profile
    from migd.state.override import Override, OverrideStore
    from tests.helpers import PROFILES
    text = (PROFILES / "night.yaml").read_text()
    ov = Override(load_profile("/home/a/night.yaml", text=text), datetime(2026, 11, 23, 10, tzinfo=timezone.utc),
                  datetime(2026, 11, 23, 2, tzinfo=timezone.utc))
    store = OverrideStore(tmp_path / "override.json")
    store.save(ov)
    back = store.load()
    assert back is not None and (back.profile.name, back.profile.source, back.until, back.since) == \
        ("night", "/home/a/night.yaml", ov.until, ov.since) and back.profile.sections == ov.profile.sections


@dataclass(frozen=True)
class _Even(Value):
    """A checked scalar for the tests below: an even number."""

    n: int

    def __post_init__(self) -> None:
        if self.n % 2:
            raise ValueError(f"{self.n} is odd")


@dataclass(frozen=True)
class _Pairs:
    """A record whose own check fails (ValueError in ``__post_init__``)."""

    pair: tuple[int, str]

    def __post_init__(self) -> None:
        if self.pair[0] < 0:
            raise ValueError("the pair's number must not be negative")


@dataclass(frozen=True)
class _Doc:
    SCHEMA: ClassVar[str] = "test.doc/v2"
    READS: ClassVar[tuple[str | None, ...]] = ("test.doc/v2", "test.doc/v1", None)
    evens: dict[int, _Even] = field(default_factory=dict)
    pairs: tuple[_Pairs, ...] = ()


def test_checked_values_numbered_keys_and_pairs_survive_the_wire() -> None:
    """What JSON cannot say by itself, said by a type: a checked scalar is written as its one field, an
    ``int`` key in decimal, ``tuple[A, B]`` as a list of two; a v1 document and one without a schema read."""
    doc = _Doc({0: _Even(2), 10: _Even(4)}, (_Pairs((1, "a")),))
    data = to_json(doc)
    assert data == {"schema": "test.doc/v2", "evens": {"0": 2, "10": 4}, "pairs": [{"pair": [1, "a"]}]}
    assert from_json(_Doc, json.loads(json.dumps(data))) == doc
    assert from_json(_Doc, {"schema": "test.doc/v1"}) == from_json(_Doc, {}) == _Doc()


@pytest.mark.parametrize(("data", "said"), [
    ({"evens": {"0": 3}}, "evens.0: 3 is odd"),
    ({"evens": {"first": 2}}, "evens.first: key 'first' is not a number"),
    ({"evens": {"-2": 2}}, "evens.-2: key '-2' is not a number"),
    ({"pairs": [{"pair": [1, "a", 2]}]}, "pairs[0].pair: expected 2 items, not 3"),
    ({"pairs": [{"pair": [1, 2]}]}, "pairs[0].pair[1]: expected str, not 2"),
    ({"pairs": [{"pair": [-1, "a"]}]}, "pairs[0]: the pair's number must not be negative"),
    ({"schema": "test.doc/v3"}, "schema: expected 'test.doc/v2' or 'test.doc/v1', not 'test.doc/v3'"),
    ([1, 2], "schema: expected a test.doc/v2 mapping, not list"),
])
def test_a_checked_value_that_does_not_fit_is_named_by_its_field(data: object, said: str) -> None:
    with pytest.raises(WireError) as e:
        from_json(_Doc, data)
    assert str(e.value) == said


def test_a_state_file_that_does_not_fit_names_the_file_and_the_field(tmp_path: Path) -> None:
    """``statefile.load``: the wire type's misfit as one line, ``path: field: what``."""
    from migd.apply.statefile import atomic_write_json, load
    path = tmp_path / "doc.json"
    atomic_write_json(path, _Doc({2: _Even(2)}))
    assert load(path, _Doc) == _Doc({2: _Even(2)})
    assert path.read_text() == '{"schema":"test.doc/v2","evens":{"2":2},"pairs":[]}'
    path.write_text('{"schema": "test.doc/v2", "evens": {"2": 5}}')
    with pytest.raises(ValidationError) as e:
        load(path, _Doc)
    assert str(e.value) == f"{path}: evens.2: 5 is odd"


@pytest.mark.parametrize("line,said", [
    (b'{"cmd": "status", "x": ' + b"9" * 5000 + b"}", "JSON with a number of more than 4300 digits"),
    (b"[" * 100 + b"]" * 100, "JSON nested deeper than 32 levels"),
    (b"status please", "not JSON (Expecting value: line 1 column 1 (char 0))"),
], ids=["long number", "deep", "not JSON"])
def test_a_socket_line_migd_cannot_read_says_why_in_words(line: bytes, said: str) -> None:
    """It said ``JSON a number of more than 4300 digits``."""
    with pytest.raises(BadJson) as e:
        parse_object(line)
    assert str(e.value) == said
