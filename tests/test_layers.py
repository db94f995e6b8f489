"""The shape of the package, as a reader meets it: layers, no import circle, small modules.

The layers themselves are declared once, in pyproject.toml's [tool.importlinter] (docs/layout.md draws
them); ``lint-imports`` checks every import against them.  These tests run it, and check what it does
not: a circle inside one package, and a module grown past 400 lines."""

from __future__ import annotations

import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 400


@pytest.mark.integration
def test_every_import_keeps_to_the_layers() -> None:
    tool = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(tool).exists():
        pytest.fail("lint-imports is missing: pip install -e '.[test]' installs import-linter")
    r = subprocess.run([tool, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "0 broken" in r.stdout, r.stdout[-3000:] + r.stderr


def test_no_module_imports_itself_round_a_circle() -> None:
    graph = grimp.build_graph("migd")
    circles = sorted({tuple(sorted((m, i))) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)
                      if graph.chain_exists(importer=i, imported=m)})
    assert circles == []


@pytest.mark.parametrize(("module", "line", "said"), [
    ("plan/planner.py", "from migd.daemon import service", "migd.plan.planner -> migd.daemon.service"),
    ("apply/executor.py", "from migd.sim import fleets", "migd.apply.executor -> migd.sim.fleets"),
    ("metrics/sampler.py", "from migd.sim.backend import sim_backend", "migd.metrics.sampler -> migd.sim.backend"),
    ("metrics/sampler.py", "from migd.hardware.nvml import call", "migd.metrics.sampler -> migd.hardware.nvml.call"),
    ("hardware/inventory.py", "from migd.hardware.nvml import backend",
     "migd.hardware.inventory -> migd.hardware.nvml"),
], ids=["layer", "simulator", "simulator-backend", "nvml-adapter", "nvml-inside-hardware"])
@pytest.mark.integration
def test_each_contract_fails_when_broken(tmp_path: Path, module: str, line: str, said: str) -> None:
    """The contracts can fail: a copy of the package with one forbidden import is refused, naming it."""
    shutil.copytree(REPO / "migd", tmp_path / "migd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "migd" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    tool = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    r = subprocess.run([tool, "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and said in r.stdout, r.stdout[-2000:]


def test_the_forbidden_contracts_name_every_module() -> None:
    """A module added later is covered: every top-level module but the simulator is a source of the
    simulator contract, and every module outside the adapter and the simulator one of the adapter's."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11 and newer)
    contracts = {c["name"]: c for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
                 ["contracts"]}
    top = {f"migd.{m.name}" for m in pkgutil.iter_modules([str(REPO / "migd")])} - {"migd.sim"}
    sim = next(c for n, c in contracts.items() if "simulator" in n)
    assert set(sim["source_modules"]) == top
    nvml = next(c for n, c in contracts.items() if "NVML adapter" in n)
    hardware = {f"migd.hardware.{m.name}" for m in pkgutil.iter_modules([str(REPO / "migd" / "hardware")])}
    assert set(nvml["source_modules"]) == (top - {"migd.hardware"}) | (hardware - {"migd.hardware.nvml"})


def test_no_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(REPO)): n for p in (REPO / "migd").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these by job: {long}"


def test_nvml_is_called_through_pynvmls_functions_not_by_name() -> None:
    """``nvml("nvmlDeviceGetName", ...)`` went through getattr: no tool could see the name.  Outside the
    simulator (which implements those names), NVML functions are pynvml's function objects."""
    import re
    by_name = [f"{p.relative_to(REPO)}:{n}" for p in (REPO / "migd").rglob("*.py") if "sim" not in p.parts
               for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"[\"']nvml[A-Z]\w+[\"']", line)]
    assert by_name == []


def test_no_function_is_over_50_lines_but_the_search() -> None:
    """The placement search's walk stays whole until a split is measured no slower (its docstring)."""
    import ast
    long = []
    for p in (REPO / "migd").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None \
                    and node.end_lineno - node.lineno + 1 > 50:
                long.append(f"{p.relative_to(REPO)}:{node.name}")
    assert long == ["migd/plan/placement.py:search"]


def test_every_pynvml_name_the_adapter_uses_exists() -> None:
    """pynvml ships no type hints, so mypy cannot check the function objects the adapter calls; this
    does what it would for the names: each ``pynvml.X`` outside the simulator is a real attribute of the
    installed nvidia-ml-py (a typo fails here, not on the first real GPU)."""
    import re

    import pynvml
    used = {m for p in (REPO / "migd").rglob("*.py") if "sim" not in p.parts
            for m in re.findall(r"\bpynvml\.(\w+)", p.read_text())}
    assert len(used) > 40 and sorted(n for n in used if not hasattr(pynvml, n)) == []


def test_docs_layout_names_every_module_and_only_modules_that_exist() -> None:
    """docs/layout.md matches the code: its layer table names every top-level package and module of
    migd, and every file it names (``daemon/wakeups.py``, ``wire.py``) is there."""
    doc = (REPO / "docs" / "layout.md").read_text()
    table = "\n".join(line for line in doc.splitlines() if line.startswith("|"))
    named = set(re.findall(r"`([a-z_/]+(?:\.py)?)`", table))
    top = {m.name for m in pkgutil.iter_modules([str(REPO / "migd")])}
    unnamed = sorted(m for m in top if m not in named and f"{m}/" not in named)
    assert unnamed == [], f"docs/layout.md's table does not name {unnamed}"
    known = {str(p.relative_to(REPO)) + ("/" if p.is_dir() else "")
             for p in REPO.rglob("*") if ".git" not in p.parts and "node_modules" not in p.parts}
    paths = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py|(?:[a-z_]+/)+)`", doc))
    missing = sorted(p for p in paths if not any(k == p or k.endswith("/" + p) for k in known))
    assert missing == [], f"docs/layout.md names files that are not there: {missing}"


def test_no_two_modules_share_a_name() -> None:
    """A reader who meets ``status.py`` knows which: no two of migd's modules share a file name
    (packages' ``__init__`` and the simulator aside: the simulator mirrors the modules it stands in for,
    ``sim/caps.py`` being the driver ``hardware/caps.py`` reads)."""
    names: dict[str, list[str]] = {}
    for p in (REPO / "migd").rglob("*.py"):
        rel = p.relative_to(REPO / "migd")
        if p.name != "__init__.py" and rel.parts[0] != "sim":
            names.setdefault(p.name, []).append(str(rel))
    shared = {n: sorted(ps) for n, ps in names.items() if len(ps) > 1}
    assert shared == {}
