from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from migd.hardware.nvml import NvmlBackend
from migd.sim import sim_backend
from migd.sim.state import StateStore

REPO = Path(__file__).resolve().parents[1]
FACTS_DIR = REPO.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def facts() -> dict[str, Any]:
    path = FACTS_DIR / "mig-facts.yaml"
    if not path.exists():
        pytest.skip(f"facts file {path} not present (CI clones shared/ beside the repo)")
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
