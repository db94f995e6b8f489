"""The production backend over a simulated node.

:func:`sim_backend` loads the simulated library underneath the real, unmodified ``pynvml``
(:mod:`migd.sim.library`) and builds the production
:class:`~migd.hardware.nvml.backend.NvmlBackend` on top: only the C library and nvidia-smi's path
differ from a real node.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from migd.hardware.nvml.backend import NvmlBackend
from migd.hardware.types import HardwareError
from migd.sim.state import DEFAULT_FLEET, open_store


def smi_argv(state_path: str | os.PathLike[str]) -> list[str]:
    """The fake nvidia-smi, as an argument list bound to one state file."""
    return [sys.executable, "-m", "migd.sim.smi", "--sim-state", str(Path(state_path).resolve())]


def load_library(state_path: str | os.PathLike[str], fleet: str = DEFAULT_FLEET, mig_enabled: bool = False) -> None:
    """Make the simulated node at ``state_path`` what this process's pynvml loads."""
    from migd.sim.library import load
    load(open_store(state_path, fleet, mig_enabled))


def sim_backend(state_path: str | os.PathLike[str], fleet: str = DEFAULT_FLEET, mig_enabled: bool = False,
                on_nvml_error: Callable[[str, str], None] | None = None) -> NvmlBackend:
    """The production backend over the simulated node; a state file that cannot be read is what a
    broken libnvidia-ml is on a real node: NVML cannot be opened (HardwareError)."""
    try:
        load_library(state_path, fleet, mig_enabled)
    except PermissionError as e:  # as a device node the user may not open: not permitted, not a fault
        raise PermissionError(e.errno, e.strerror, str(state_path)) from None
    except (OSError, ValueError) as e:
        raise HardwareError(f"simulator state {state_path} cannot be read: {e}") from None
    except (KeyError, TypeError, AttributeError):  # (JSON of another shape: Python's own words named no field)
        raise HardwareError(f"simulator state {state_path} cannot be read: its JSON is not a simulated node's "
                            "(a new node is made at a path of its own)") from None
    return NvmlBackend(smi_argv=smi_argv(state_path), on_nvml_error=on_nvml_error)
