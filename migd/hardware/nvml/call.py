"""Calling NVML through ``pynvml``: errors become :class:`HardwareError`, calls share a session.

``pynvml`` is used as NVIDIA ships it (package ``nvidia-ml-py``); whatever C library it
loaded — the driver's libnvidia-ml, or the simulator's in tests — is below this line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pynvml

from migd.hardware.nvml.session import SessionLock
from migd.hardware.types import HardwareError

log = logging.getLogger(__name__)

_ERROR_NAMES = {v: k[len("NVML_ERROR_"):] for k, v in vars(pynvml).items()
                if k.startswith("NVML_ERROR_") and isinstance(v, int)}
ALL_ERRORS = tuple(_ERROR_NAMES)  # every NVML error code pynvml knows


NvmlFunction = Callable[..., Any]  # a function of pynvml's, named in messages by its own name


def error_name(code: int | None) -> str:
    return str(_ERROR_NAMES.get(code or 0, f"CODE_{code}"))


class Nvml:
    """One process's NVML session: init/shutdown, and every call made inside the shared session."""

    def __init__(self, on_error: Callable[[str, str], None] | None = None) -> None:
        """``on_error(function, error)``: each NVML error as it happens, by pynvml's function name and
        NVML's error name (``INVALID_ARGUMENT``), so a counter needs nothing of NVML's."""
        self._on_error = on_error
        self.session = SessionLock()

    def __call__(self, fn: NvmlFunction, *args: Any, gpu: int | None = None, absent: tuple[int, ...] = ()) -> Any:
        """``fn(*args)``, a function of pynvml's (never looked up by name); an NVML error becomes a
        HardwareError naming the call and GPU, except the ``absent`` codes, which mean "not there" and
        give None."""
        # Through unlocked(): bench/sampler_probe.py counts calls there.  A thread already inside the
        # session (the sampler holds it for each GPU it reads) enters nothing again.
        if self.session.held():
            return self.unlocked(fn, *args, gpu=gpu, absent=absent)
        with self.session.shared():
            return self.unlocked(fn, *args, gpu=gpu, absent=absent)

    def unlocked(self, fn: NvmlFunction, *args: Any, gpu: int | None = None, absent: tuple[int, ...] = ()) -> Any:
        name = fn.__name__
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            where = f"GPU {gpu}: " if gpu is not None else ""
            code = int(getattr(e, "value", 0) or 0)
            if code in absent:
                return None
            if self._on_error is not None:
                self._on_error(name, error_name(code))
            raise HardwareError(f"{where}{name} failed: NVML_ERROR_{error_name(code)}", code=code, gpu=gpu) from e
        except pynvml.NVMLLibraryMismatchError as e:
            # pynvml raises this (not an NVMLError) when the driver's library lacks the versioned
            # entry point it calls, e.g. nvmlDeviceGetComputeRunningProcesses_v3 before R510.
            code = int(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            where = f"GPU {gpu}: " if gpu is not None else ""
            if self._on_error is not None:
                self._on_error(name, error_name(code))
            raise HardwareError(f"{where}{name}: the NVIDIA driver's NVML library is older than nvidia-ml-py "
                                f"{getattr(pynvml, '__version__', '')} expects (a versioned entry point is "
                                f"missing); upgrade the driver or pin an older nvidia-ml-py", code=code,
                                gpu=gpu) from e

    def init(self) -> None:
        self.unlocked(pynvml.nvmlInit)

    def shutdown(self) -> None:
        self.unlocked(pynvml.nvmlShutdown)
