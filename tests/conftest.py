from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from migd.hardware.nvml.backend import NvmlBackend
from migd.sim.backend import sim_backend
from migd.sim.library import loaded
from migd.sim.state import StateStore
from tests.slurm_node import night_node, node  # noqa: F401  (the Slurm tests' fixtures)

REPO = Path(__file__).resolve().parents[1]
FACTS_DIR = REPO / "tests" / "fixtures" / "reference"  # copies, see SOURCES.md there


@pytest.fixture(autouse=True)
def no_leaked_nvml_session() -> Iterator[None]:
    """A test that leaves NVML initialised holds every simulated GPU (a reset would be refused, an
    Ampere mode change stays pending) for the tests after it: close what you open."""
    yield
    lib = loaded()
    if lib is not None and lib.init_count > 0:
        leaked = lib.init_count
        with lib.store.transaction() as state:
            lib.register_client(state, os.getpid(), -leaked)
        lib.init_count = 0
        pytest.fail(f"the test left {leaked} NVML session(s) initialised (close the backend)")


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    return FACTS_DIR


@pytest.fixture(scope="session")
def facts() -> dict[str, Any]:
    path = FACTS_DIR / "mig-facts.yaml"
    if not path.exists():
        raise FileNotFoundError(path)
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.fixture
def make_backend(tmp_path: Path) -> Iterator[Callable[..., tuple[NvmlBackend, StateStore, Path]]]:
    """Build the production NVML backend over a fresh simulated fleet in tmp_path."""
    made: list[NvmlBackend] = []

    def make(fleet: str = "dgx-a100", mig_enabled: bool = False, name: str = "sim.json") -> tuple[
            NvmlBackend, StateStore, Path]:
        path = tmp_path / name
        backend = sim_backend(path, fleet, mig_enabled)
        made.append(backend)
        return backend, StateStore(path), path

    yield make
    for b in made:
        try:
            b.close()
        except Exception:
            pass
