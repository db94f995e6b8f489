"""The simulated NVML C library, its shared state and a fake nvidia-smi.

:func:`migd.sim.backend.sim_backend` loads the simulated library underneath the real, unmodified
``pynvml`` (:mod:`migd.sim.library`) and builds the production
:class:`~migd.hardware.nvml.backend.NvmlBackend` on top: only the C library and nvidia-smi's path differ
from a real node.  This package module imports nothing, so naming a fleet (``migd.sim.fleets``)
does not load the simulator.
"""
