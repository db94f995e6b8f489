"""Every subcommand and option of migctl and migd says what it does in --help."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from migd.ctl.migctl import parser as migctl_parser
from migd.daemon.main import parser as migd_parser

pytestmark = pytest.mark.integration  # every program's --help


def _undocumented(p: argparse.ArgumentParser, where: str) -> list[str]:
    missing = []
    for action in p._actions:  # noqa: SLF001 - argparse has no public list of its arguments
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        name = "/".join(action.option_strings) or action.dest
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            helps = {a.dest: a.help for a in action._choices_actions}  # noqa: SLF001
            for sub, sp in action.choices.items():
                if not helps.get(sub):
                    missing.append(f"{where} {sub}")
                missing += _undocumented(sp, f"{where} {sub}")
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{where} {name}")
    return missing


def test_every_option_has_help() -> None:
    assert _undocumented(migctl_parser(), "migctl") + _undocumented(migd_parser(), "migd") == []


@pytest.mark.parametrize("argv", [["migd.ctl.migctl", "--help"], ["migd.ctl.migctl", "apply", "--help"],
                                  ["migd.daemon.main", "--help"]])
def test_help_runs(argv: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage:" in r.stdout and not r.stderr


def test_migctl_starts_without_what_only_one_command_needs() -> None:
    """Every migctl command pays for what migctl imports at start: the what-if's replay model and
    migd.yaml's loader (APScheduler's cron, asyncio with it) are imported by that command alone."""
    probe = "import sys, migd.ctl.migctl; print(sorted({m.split('.')[0] if not m.startswith('migd.') else " \
            "'.'.join(m.split('.')[:2]) for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    for heavy in ("'apscheduler'", "'asyncio'", "'migd.whatif'", "'migd.daemon'"):
        assert heavy not in loaded, loaded
