"""Day one, second pass (issue 39, item 9): what a mig-parted operator still tripped on, each through the
real processes: a hook's missing working directory, the page's eighth memory slice, the catalog warning
said twice per GPU, and the example configuration's pointer to its documentation."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import PROFILES, Migctl


def test_a_missing_hook_working_directory_is_named(tmp_path: Path) -> None:
    """It said only "hook /bin/true could not run: No such file or directory", as if the program were missing."""
    gone = tmp_path / "gone"
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(f"hooks:\n  apply-start:\n    - {{command: [/bin/true], workdir: {gone}}}\n")
    hooks.chmod(0o644)
    m = Migctl(tmp_path, "single-a100")
    r = m.process("apply", "--local", str(PROFILES / "day.yaml"), "--hooks", str(hooks))
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [f"not applied: apply-start: hook /bin/true could not run: its working directory "
                                     f"{gone}: No such file or directory"], r.stderr
    assert m.process("assert", str(PROFILES / "day.yaml")).returncode == 1  # nothing was changed
