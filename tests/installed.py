"""Whether the migd the tests' processes import is this checkout's.

The tests start migd, migctl and migd-sim as a user does, through the console scripts pip installed;
those import whichever migd is installed for the interpreter, not the checkout pytest runs in.  Had
another copy been installed (another clone, a checkout since removed), every process-level test would
run that copy, and fail in ways that name nothing of the cause, or pass on code that is not this.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

PROBE = "import importlib.util as u; s = u.find_spec('migd'); print(s.origin if s and s.origin else '')"


def elsewhere(repo: Path, python: str, env: Mapping[str, str]) -> str | None:
    """One line saying why the tests cannot run as they are, or None where ``python`` imports
    ``repo``'s migd."""
    done = subprocess.run([python, "-c", PROBE], cwd="/", env=dict(env), capture_output=True, text=True,
                          timeout=60)
    origin = done.stdout.strip()
    fix = f"run pip install -e '.[test]' in {repo}"
    if done.returncode != 0 or not origin:
        return f"migd is not installed for {python}, and the tests run its console scripts: {fix}"
    found = Path(origin).resolve().parent
    if found != (repo / "migd").resolve():
        return (f"the migd installed for {python} is {found}, not this checkout's ({repo / 'migd'}), and the "
                f"tests run its console scripts, so they would test that copy: {fix}")
    return None
