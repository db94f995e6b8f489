"""The wire types of ``migd.api``: what a client sends is what migd reads back, field for field, and a
request migd cannot use is refused by name."""

from __future__ import annotations

import pytest

from migd.api.control import DAEMON_LOCK_TIMEOUT_S, ApplyRequest, ManualApply
from migd.apply.result import OnBusy
from migd.errors import ValidationError


def test_an_apply_request_survives_the_socket() -> None:
    sent = ApplyRequest("/home/a/night.yaml", "apiVersion: migd/v1\n", "cfg", ManualApply(
        on_busy=OnBusy.WAIT, dry_run=True, busy_timeout_s=90.0, lock_timeout_s=0.0, parallel=False, mode_only=True),
        withdraw_on_hangup=True)
    wire = sent.to_json()
    assert wire["cmd"] == "apply" and wire["on_busy"] == "wait"
    assert ApplyRequest.from_json(wire) == sent


def test_a_request_from_an_older_client_takes_the_daemons_defaults() -> None:
    got = ApplyRequest.from_json({"cmd": "apply", "file": "p.yaml", "text": "x: 1\n"})
    assert got.options == ManualApply() and got.options.lock_timeout_s == DAEMON_LOCK_TIMEOUT_S
    assert got.withdraw_on_hangup is False  # only a client that asks for it is withdrawn by a hang-up


@pytest.mark.parametrize(("req", "error"), [
    ({"cmd": "apply", "file": "p.yaml"}, "carries no profile text"),
    ({"cmd": "apply", "file": 7, "text": ""}, "file: must be text"),
    ({"cmd": "apply", "file": "p.yaml", "text": "", "config": ["a"]}, "config: must be text"),
])
def test_a_request_migd_cannot_use_is_refused_by_name(req: dict[str, object], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        ApplyRequest.from_json(req)


@pytest.mark.parametrize("bad", [{"on_busy": "maybe"}, {"busy_timeout_s": -1}, {"lock_timeout_s": True}])
def test_bad_options_are_value_errors(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ApplyRequest.from_json({"cmd": "apply", "file": "p.yaml", "text": "", **bad})
