"""Day one, second pass: what a mig-parted operator still tripped on, each through the
real processes: a hook's missing working directory, the page's eighth memory slice, the catalog warning
said twice per GPU, and the example configuration's pointer to its documentation."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, REPO, Migctl
from tests.test_page import parse

pytestmark = pytest.mark.integration  # real migd daemons, Chromium


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


def _page(m: MigdProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{m.port}/", timeout=10) as r:
        return r.read().decode()


FOUR_G = """apiVersion: migd/v1
kind: Profile
name: four
gpus:
  - select: all
    mig: enabled
    instances:
      - {profile: 4g, owner: training}
"""


def test_the_page_shows_the_eighth_slice_beside_seven_1g_as_unusable(tmp_path: Path) -> None:
    """An A100 has 8 memory slices and 7 compute slices: beside seven 1g.10gb instances the eighth is
    memory no instance can be made on (only 1g.20gb at 6:2, 3g at 4:4 and 7g take it); the page called it
    "free".  Beside one 4g.40gb (0:4) the other four are free indeed: a 3g.40gb fits there."""
    m = MigdProcess(tmp_path, "single-a100")
    m.start(now="2026-11-23T10:00:00")  # Monday morning: day, 7 x 1g.10gb
    try:
        m.wait_ready()
        m.wait_until(lambda: len(parse(_page(m)).gpus.get(0, [])) == 7)
        text = _page(m)
        page = parse(text)
        assert page.free == {} and page.unusable == {0: [7]}, text
        assert re.search(r'class="unusable" data-slice="7"[^>]*title="[^"]*1g\.20gb at 6:2, 3g\.40gb at 4:4, '
                         r'7g\.80gb at 0:8"[^>]*>unusable now<', text), text
        (tmp_path / "four.yaml").write_text(FOUR_G)
        assert m.migctl.process("apply", str(tmp_path / "four.yaml")).returncode == 0  # through migd
        m.wait_until(lambda: parse(_page(m)).gpus.get(0) == [("4g.40gb", "training", 0, 4)])
        page = parse(_page(m))
        assert page.free == {0: 4} and page.unusable == {}
    finally:
        m.close()


def test_a_gpu_not_in_the_catalog_is_said_once_per_gpu(tmp_path: Path) -> None:
    """``migctl doctor`` printed the backend's warning and its own identity finding for each GPU the catalog
    lacks: the same news twice per GPU.  The finding says it now; other commands keep the warning, once."""
    m = Migctl(tmp_path, "unlisted")  # two GPUs of a model the simulated driver knows and the catalog does not
    for args in (("doctor",), ("doctor", "-v")):
        r = m.process(*args)
        assert r.returncode == 1 and "not in migd's catalog" not in r.stderr, r.stderr
        said = [line.split()[:2] for line in r.stdout.splitlines() if "not in migd's catalog" in line]
        assert said == [["GPU", "0"], ["GPU", "1"]], r.stdout
    r = m.process("doctor", "-o", "json")
    assert "not in migd's catalog" not in r.stderr and r.stdout.count("not in migd's catalog") == 2, r.stderr
    r = m.process("status")
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[2].strip() for line in r.stderr.splitlines() if "not in migd's catalog" in line] == \
        ["GPU 0", "GPU 1"], r.stderr


def test_the_example_configuration_points_at_documents_that_exist() -> None:
    """systemd/migd.yaml sent the reader to a README section "Daemon" that never existed."""
    headings = {h.strip() for h in re.findall(r"^#+ (.+)$", (REPO / "README.md").read_text(), flags=re.M)}
    pyproject = (REPO / "pyproject.toml").read_text()
    pointers = 0
    for f in sorted(p for p in (REPO / "systemd").rglob("*") if p.is_file()):
        text = f.read_text()
        for section in re.findall(r'README "([^"]+)"', text):
            assert section in headings, f"{f.name}: README has no section {section!r}"
            pointers += 1
        for doc in re.findall(r"(?<![/\w])docs/[\w.-]+\.md", text):
            assert (REPO / doc).is_file(), f"{f.name}: {doc} does not exist"
            pointers += 1
        for rel in re.findall(r"/opt/migd/share/doc/migd/(\S+?\.md)", text):  # as pyproject's data-files install
            assert (REPO / rel).is_file() and f'"{rel}"' in pyproject, f"{f.name}: {rel} is not installed"
    assert pointers >= 1  # migd.yaml points at its reference
