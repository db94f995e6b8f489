"""What is asked of migd before its daemon serves (migd/daemon/early.py): kept, then handed over once."""

from __future__ import annotations

import signal
from pathlib import Path

from migd.config.migdyaml import load_config
from migd.daemon.early import Early
from tests.helpers import PROFILES


def config(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "profiles").mkdir(exist_ok=True)
    for name in ("day", "night"):
        (tmp_path / "profiles" / f"{name}.yaml").write_text((PROFILES / f"{name}.yaml").read_text())
    p = tmp_path / "migd.yaml"
    p.write_text("timezone: UTC\nschedule:\n  - {profile: day, at: '08:30'}\n" + extra)
    return p


def test_signals_and_reloads_before_the_hand_over_are_kept_and_given_once(tmp_path: Path) -> None:
    path = config(tmp_path)
    early = Early(str(path))
    early.started = load_config(path)
    early.signal(signal.SIGHUP)
    early.signal(signal.SIGTERM)
    assert early.reload().error is None and early.hup.is_set()
    path.write_text("schedule: [\n")
    assert early.reload().error is not None and not early.hup.is_set()  # (a bad file drops the kept reload)
    got: list[int] = []
    early.hand_over(got.append)
    assert got == [signal.SIGTERM]  # (the SIGHUP went with the rejected reload)
    early.signal(signal.SIGHUP)
    assert got == [signal.SIGTERM, signal.SIGHUP]


def test_a_reload_answered_as_the_sockets_pass_over_goes_to_the_daemon_only_if_it_reads(tmp_path: Path) -> None:
    """A reload the waiting sockets took as they passed to the daemon: a bad file is rejected and the
    daemon is not told to read it (it would reject it again); a good one is a SIGHUP to it, said as now."""
    path = config(tmp_path, "sample_interval: 5s\n")
    early = Early(str(path))
    early.started = load_config(path)
    got: list[int] = []
    early.hand_over(got.append)
    path.write_text("schedule: [\n")
    assert early.reload().error is not None and got == []
    config(tmp_path, "sample_interval: 7s\n")
    done = early.reload()
    assert done.error is None and got == [signal.SIGHUP] and not early.hup.is_set()
    assert done.detail == f"{path}: 2 profiles, 1 transitions; migd reads it again now; restart needed for " \
                          "sample_interval", done.detail


def test_a_stop_before_the_hand_over_is_handed_on_as_the_signal_it_was(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) while migd started was handed to the daemon as SIGTERM, and logged as one."""
    early = Early(str(config(tmp_path)))
    early.signal(signal.SIGINT)
    got: list[int] = []
    early.hand_over(got.append)
    assert got == [signal.SIGINT]
