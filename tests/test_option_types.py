"""Every option is parsed into its type where it is read: a bad value is one line naming the option,
exit 2, and never a traceback (``migd --metrics-listen nonsense`` and ``migctl apply --busy-timeout 5x``
used to end in ValueError tracebacks, the second after migd had been asked)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import PROFILES

pytestmark = pytest.mark.integration  # every program

BAD = [
    (("migd.daemon.main", "--metrics-listen", "nonsense"), "--metrics-listen"),
    (("migd.daemon.main", "--metrics-listen", "127.0.0.1:99999"), "--metrics-listen"),
    (("migd.daemon.main", "--metrics-listen", ":9835"), "--metrics-listen"),
    (("migd.daemon.main", "--time-scale", "inf"), "--time-scale"),
    (("migd.daemon.main", "--time-scale", "nan"), "--time-scale"),
    (("migd.daemon.main", "--now", "tomorrow"), "--now"),
    # IDNA refuses these hosts at bind: a traceback, exit 1, a restart loop under systemd
    (("migd.daemon.main", "--metrics-listen", "a..b:9835"), "--metrics-listen"),
    (("migd.daemon.main", "--metrics-listen", "a" * 64 + ":9835"), "--metrics-listen"),
    (("migd.daemon.main", "--metrics-listen", "\u200b:9835"), "--metrics-listen"),
    # the clock past year 9999 (at once, or after a profile was applied), or a schedule that never fires
    (("migd.daemon.main", "--now", "9999-12-31T23:59:59"), "--now"),
    (("migd.daemon.main", "--now", "0001-01-01T00:00:00"), "--now"),
    (("migd.daemon.main", "--now", "1969-12-29T00:00:00"), "--now"),
    (("migd.daemon.main", "--time-scale", "1e308"), "--time-scale"),
    (("migd.daemon.main", "--time-scale", "1e11"), "--time-scale"),
    (("migd.daemon.main", "--time-scale", "1e-9"), "--time-scale"),
    (("migd.daemon.main", "--time-scale", "-inf"), "--time-scale"),  # ("expected one argument")
    (("migd.daemon.main", "--time-scale", "1_000"), "--time-scale"),  # (float() takes these)
    (("migd.daemon.main", "--time-scale", "\uff16\uff10"), "--time-scale"),
    (("migd.ctl.migctl", "validate", "--gpus", "9" * 20, str(PROFILES / "day.yaml")), "--gpus"),
    (("migd.ctl.migctl", "apply", "--busy-timeout", "5x", str(PROFILES / "day.yaml")), "--busy-timeout"),
    (("migd.ctl.migctl", "apply", "--lock-timeout", "nan", str(PROFILES / "day.yaml")), "--lock-timeout"),
    (("migd.ctl.migctl", "apply", "--lock-timeout", "-3", str(PROFILES / "day.yaml")), "--lock-timeout"),
    (("migd.ctl.migctl", "apply", "--lock-timeout", "1e9", str(PROFILES / "day.yaml")), "--lock-timeout"),  # (migd
    (("migd.ctl.migctl", "apply", "--busy-timeout", "9000h", str(PROFILES / "day.yaml")), "--busy-timeout"),  # refuses)
    (("migd.ctl.migctl", "export", "--name", "a b"), "--name"),  # (exported, then refused by validate and apply)
    (("migd.ctl.migctl", "export", "--name", ""), "--name"),
    (("migd.ctl.migctl", "export", "--name", "x\x1b[31m"), "--name"),
    (("migd.ctl.migctl", "validate", "--gpus", "0", str(PROFILES / "day.yaml")), "--gpus"),
    (("migd.ctl.migctl", "validate", "--gpus", "eight", str(PROFILES / "day.yaml")), "--gpus"),
]


@pytest.mark.parametrize(("argv", "option"), BAD, ids=[" ".join(a[1:3])[:40] for a, _ in BAD])
def test_a_bad_option_value_is_one_line_and_exit_2(argv: tuple[str, ...], option: str) -> None:
    r = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "MIGD_CONFIG": "/nonexistent"})
    assert r.returncode == 2, r
    assert r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    line, = r.stderr.splitlines()
    value = argv[-2] if argv[-1].endswith(".yaml") else argv[-1]
    quoted = repr(value) if len(value) <= 40 else repr(value)[:30]  # (a long one is shown by its start)
    assert f"error: argument {option}: " in line and quoted in line, line


@pytest.mark.parametrize(("program", "env", "said"), [
    ("migd.ctl.migctl", {"MIGD_SIM": "bogus"}, "migctl: error: $MIGD_SIM: invalid choice: 'bogus' (choose from "),
    ("migd.ctl.migctl", {"MIGD_SIM_STATE": "/tmp/x.json"}, "migctl: error: --sim-state (or $MIGD_SIM_STATE) needs "
     "--sim FLEET"),
    ("migd.daemon.main", {}, "migd: error: --sim-state needs --sim FLEET"),
], ids=["bad MIGD_SIM", "sim state without a fleet (migctl)", "sim state without a fleet (migd)"])
def test_what_argparse_does_not_check_is_one_line_and_exit_2(program: str, env: dict[str, str], said: str) -> None:
    """``$MIGD_SIM`` is a default, never held to the choices: a bad one was a hardware error, exit 4.  A
    simulator state without a fleet was silently not used (no NVIDIA driver found, exit 4)."""
    argv = ["status"] if program.endswith("migctl") else ["--sim-state", "/tmp/x.json", "--check"]
    r = subprocess.run([sys.executable, "-m", program, *argv], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "MIGD_CONFIG": "/nonexistent", **env})
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.startswith(said) and r.stderr.count("\n") == 1, r


@pytest.mark.parametrize("argv", [("lose", "--gpu", "\u0663"), ("xid", "9" * 23, "--gpu", "0")],
                         ids=["arabic-indic GPU index", "Xid of 23 digits"])
def test_migd_sim_takes_ascii_numbers_and_few(argv: tuple[str, ...]) -> None:
    """``int`` took ``٣`` as GPU 3, and an Xid of 23 digits was cut to 64 bits where migd read it."""
    r = subprocess.run([sys.executable, "-m", "migd.sim.cli", argv[0], "--sim-state", "/nonexistent/x.json", *argv[1:]],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (2, ""), r
    assert "must be a whole number of at most 9 digits" in r.stderr and r.stderr.count("\n") == 1, r.stderr
