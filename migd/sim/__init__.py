"""The simulated NVML library, its shared state and a fake nvidia-smi.

:func:`sim_backend` builds the production :class:`~migd.hardware.nvml.NvmlBackend` on top
of the simulated library: only the library underneath (and nvidia-smi's path) differ.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from migd.hardware.nvml import NvmlBackend
from migd.sim.nvml import SimNvml
from migd.sim.state import DEFAULT_FLEET, FLEETS, StateStore, open_store

__all__ = ["FLEETS", "DEFAULT_FLEET", "SimNvml", "StateStore", "open_store", "sim_backend", "smi_argv"]


def smi_argv(state_path: str | os.PathLike[str]) -> list[str]:
    """The fake nvidia-smi, as an argument list bound to one state file."""
    return [sys.executable, "-m", "migd.sim.smi", "--sim-state", str(Path(state_path).resolve())]


def sim_backend(state_path: str | os.PathLike[str], fleet: str = DEFAULT_FLEET, mig_enabled: bool = False,
                on_nvml_error: Callable[[str, int], None] | None = None) -> NvmlBackend:
    store = open_store(state_path, fleet, mig_enabled)
    return NvmlBackend(lib=SimNvml(store), smi_argv=smi_argv(state_path), on_nvml_error=on_nvml_error)
