"""Whole numbers in text someone else wrote: ASCII digits and few, or nothing (never a traceback).

``'²'.isdigit()`` is true and ``int('²')`` raises; ``int`` takes ``'٣'`` and refuses 4,300 digits.  Each
reader below used ``str.isdigit`` or ``\\d`` and then ``int``."""

from __future__ import annotations

from pathlib import Path

import pytest

from migd.daemon.sdnotify import Notifier
from migd.demand.inputs import Layout
from migd.hardware.caps import read_minors
from migd.numeral import is_whole, whole
from migd.slurm.demandplan import layout_of
from migd.slurm.hostlist import hostnames
from migd.slurm.want import Want


@pytest.mark.parametrize("text,read", [
    ("0", 0), ("7", 7), ("007", 7), ("123456789012345678", 123456789012345678),
    ("1234567890123456789", None), ("9" * 5000, None),
    ("²", None), ("٣", None), ("3²", None), (" 3", None), ("3 ", None), ("+3", None), ("-3", None),
    ("1_000", None), ("", None), ("3.0", None),
], ids=lambda v: v if isinstance(v, str) and len(v) < 24 else None)
def test_whole_reads_ascii_digits_and_few(text: str, read: int | None) -> None:
    assert whole(text) == read
    assert is_whole(text) is (read is not None)


def test_whole_takes_a_tighter_bound() -> None:
    assert whole("65535", 5) == 65535 and whole("065535", 5) is None


def test_a_slurm_gres_count_that_is_not_ascii_digits_matches_no_layout() -> None:
    layouts = {"night": Layout.of("night", {"7g.80gb": 8})}
    assert layout_of("gpu:7g.80gb:8(S:0-1)", layouts) == "night"
    assert layout_of("gpu:7g.80gb:²", layouts) is None
    assert layout_of(f"gpu:7g.80gb:{'8' * 5000}", layouts) is None


def test_a_hostlist_range_that_is_not_ascii_digits_is_not_read() -> None:
    assert hostnames("gpu[01-03]") == {"gpu01", "gpu02", "gpu03"}
    assert hostnames("gpu[²-3]") is None and hostnames("gpu[1-٣]") is None


def test_a_want_with_a_time_past_migd_s_digits_is_not_a_want() -> None:
    assert Want.parse("migd:want=night,by=gpu001,at=1700000000,until=1700007200") is not None
    assert Want.parse(f"migd:want=night,by=gpu001,at={'1' * 5000},until=1700007200") is None
    assert Want.parse("migd:want=night,by=gpu001,at=١٧٠٠٠٠٠٠٠٠,until=1700007200") is None


def test_a_capability_minor_that_is_not_ascii_digits_is_skipped(tmp_path: Path) -> None:
    f = tmp_path / "mig-minors"
    f.write_text("gpu0/gi1/access 13\ngpu0/gi2/access ²\ngpu0/gi3/access ١٥\n")
    assert read_minors(f) == {"gpu0/gi1/access": 13}


@pytest.mark.parametrize("usec,interval", [("4000000", 2.0), ("²", None), ("٤٠٠٠٠٠٠", None), ("9" * 5000, None),
                                            ("1", 0.1), ("99999999999999999", 3600.0)],
                         ids=["digits", "superscript", "arabic-indic", "5000-digits", "a microsecond",
                              "past TIMEOUT_MAX"])
def test_a_watchdog_timeout_that_is_not_ascii_digits_turns_the_watchdog_off(
        monkeypatch: pytest.MonkeyPatch, usec: str, interval: float | None) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert Notifier("").watchdog_interval_s == interval
