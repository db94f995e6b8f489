"""A stand-in for the NVML library, shaped exactly like the ``pynvml`` module.

:class:`SimNvml` has the ``pynvml`` function names and signatures that migd uses, returns
the real ``pynvml`` ctypes structs and raises ``pynvml.NVMLError`` with real codes, so
:class:`migd.hardware.nvml.NvmlBackend` runs unchanged on top of it.  Handles are real
ctypes pointers whose address is a key into this object's handle table (never
dereferenced), exactly as opaque as the driver's.
"""

from __future__ import annotations

from migd.sim._devices import DevicesMixin
from migd.sim._instances import InstancesMixin
from migd.sim._telemetry import TelemetryMixin
from migd.sim.base import free_starts, remaining_capacity

__all__ = ["SimNvml", "free_starts", "remaining_capacity"]


class SimNvml(DevicesMixin, InstancesMixin, TelemetryMixin):
    """The simulated NVML library.  One instance per process, like a loaded libnvidia-ml."""
