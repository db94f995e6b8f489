"""The real backend: NVML through ``nvidia-ml-py`` (module ``pynvml``), nvidia-smi for resets.

There is no simulator branch here: tests load a simulated C library underneath pynvml
(:mod:`migd.sim.library`).  GPU reset has no NVML call, so it runs ``nvidia-smi -r -i
<bus id>`` (argument list, no shell, with a timeout) with migd's own NVML session shut
down, as NVIDIA's mig-parted does (a reset is refused while any client holds the GPU).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import pynvml

from migd.catalog.livetable import live_model
from migd.catalog.models import CI_ENUM_COUNT, GI_ENUM_COUNT, GpuModel, Placement, model_for
from migd.hardware.nvml import view as nvml_view
from migd.hardware.nvml.call import ALL_ERRORS, Nvml, NvmlFunction, error_name
from migd.hardware.nvml.profiletables import ProfileTables
from migd.hardware.nvml.telemetry import EventWatch, gpm_sample
from migd.hardware.nvml.view import NvmlView
from migd.hardware.ports import GpuView
from migd.hardware.types import (
    GPU_WIDE,
    ComputeInstance,
    GpmMetrics,
    GpuEvent,
    GpuInfo,
    GpuInstance,
    HardwareError,
    MigDevice,
    ProcessInfo,
)

log = logging.getLogger(__name__)

# What NVML answers for a profile index this GPU (or MIG mode) does not have (nvml.h).
_NO_SUCH_PROFILE = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)
# What a handle or id answers once its instance was destroyed by someone else (nvml.h).
_VANISHED = (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_FOUND)
_LISTING_PATIENCE_S = 5.0
T = TypeVar("T")

__all__ = ["NvmlBackend", "error_name"]


class NvmlBackend:
    """:class:`migd.hardware.ports.GpuBackend` over NVML."""

    def __init__(self, smi_argv: Sequence[str] = ("nvidia-smi",), smi_timeout_s: float = 300.0,
                 on_nvml_error: Callable[[str, str], None] | None = None) -> None:
        self._smi_argv = list(smi_argv)
        self._smi_timeout_s = smi_timeout_s
        self.nvml = Nvml(on_nvml_error)
        try:
            self.nvml.init()
        except HardwareError as e:
            if e.code != pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise
            # nvml.h: NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library couldn't be found or loaded"
            raise HardwareError("no NVIDIA driver found: NVML (libnvidia-ml.so.1) cannot be loaded; install the "
                                "driver, or try migd on a simulated node: migctl --sim dgx-a100 status",
                                e.code) from None
        self._open = True
        self._events = EventWatch(self.nvml)
        self._live: dict[str, GpuModel] = {}  # uuid -> table read from a GPU the catalog lacks
        self._tables = ProfileTables()  # GI/CI profile infos per GPU and MIG mode

    def _dev(self, index: int) -> Any:
        # Handles are fetched per call: a reset or mode change may replace them (nvml.h SetMigMode).
        return self.nvml(pynvml.nvmlDeviceGetHandleByIndex, index, gpu=index)

    @staticmethod
    def _str(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    def close(self) -> None:
        """Free the event set and shut NVML down; a second close does nothing (NVML is refcounted
        per process: shutting down twice would release another user's session)."""
        with self.nvml.session.exclusive():
            if self._open:
                self._open = False
                self._events.release()
                self.nvml.shutdown()

    # -- GPUs -------------------------------------------------------------------------------------
    def driver_version(self) -> str:
        return self._str(self.nvml(pynvml.nvmlSystemGetDriverVersion))

    def nvml_version(self) -> str:
        return self._str(self.nvml(pynvml.nvmlSystemGetNVMLVersion))

    def gpu_count(self) -> int:
        return int(self.nvml(pynvml.nvmlDeviceGetCount))

    def list_gpus(self) -> list[GpuInfo]:
        return [self.gpu(i) for i in range(self.gpu_count())]

    def gpu(self, index: int) -> GpuInfo:
        dev = self._dev(index)
        name = self._str(self.nvml(pynvml.nvmlDeviceGetName, dev, gpu=index))
        pci = self.nvml(pynvml.nvmlDeviceGetPciInfo, dev, gpu=index)
        modes = self.nvml(pynvml.nvmlDeviceGetMigMode, dev, gpu=index, absent=(pynvml.NVML_ERROR_NOT_SUPPORTED,))
        current, pending = modes if modes is not None else (0, 0)
        info = GpuInfo(
            index=index,
            uuid=self._str(self.nvml(pynvml.nvmlDeviceGetUUID, dev, gpu=index)),
            name=name,
            pci_bus_id=self._str(pci.busId),
            pci_device_id=int(pci.pciDeviceId),
            architecture=int(self.nvml(pynvml.nvmlDeviceGetArchitecture, dev, gpu=index)),
            memory_total_bytes=int(self.nvml(pynvml.nvmlDeviceGetMemoryInfo, dev, gpu=index).total),
            mig_current=bool(current),
            mig_pending=bool(pending),
            model=model_for(name=name, pci_device_id=int(pci.pciDeviceId)),
            pci_subsystem_id=int(pci.pciSubSystemId),
        )
        if info.model is None and modes is not None:
            info = dataclasses.replace(info, model=self._live_model(info))
        return info

    def _live_model(self, g: GpuInfo) -> GpuModel | None:
        """The driver's own table for a MIG-capable GPU the catalog lacks, read once per GPU."""
        if g.uuid not in self._live:
            model = live_model(g.name, g.pci_device_id, g.architecture, g.memory_total_bytes >> 20,
                               self.gi_profile_table(g.index), lambda pid: self.possible_placements(g.index, pid))
            if model is None:
                return None  # no table yet (MIG off on some drivers): asked again next time
            log.warning("GPU %d: %s (PCI 0x%08X) is not in migd's catalog; planning on the table its driver "
                        "reports", g.index, g.name, g.pci_device_id)
            self._live[g.uuid] = model
        return self._live[g.uuid]

    def minor_number(self, index: int) -> int:
        return int(self.nvml(pynvml.nvmlDeviceGetMinorNumber, self._dev(index), gpu=index))

    def set_mig_mode(self, index: int, enabled: bool) -> bool:
        """nvml.h: the call may reset the GPU itself; ``activationStatus`` says IN_USE when the GPU
        is not idle and RESET_REQUIRED where reset is not exposed (pass-through VMs).  Both leave
        the mode pending: False here, and the caller resets the GPU once it is free."""
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        dev = self._dev(index)
        self._tables.forget(index)
        status = self.nvml(pynvml.nvmlDeviceSetMigMode, dev, mode, gpu=index)
        current, _ = self.nvml(pynvml.nvmlDeviceGetMigMode, self._dev(index), gpu=index)
        if bool(current) == enabled:
            return True
        if status in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_RESET_REQUIRED, pynvml.NVML_ERROR_IN_USE):
            log.info("GPU %d: MIG mode %s pending (activation: NVML_ERROR_%s)", index,
                     "enable" if enabled else "disable", error_name(status))
            return False
        raise HardwareError(f"GPU {index}: MIG mode activation failed: NVML_ERROR_{error_name(status)}",
                            code=status, gpu=index)

    def reset_gpu(self, index: int) -> None:
        bus_id = self.gpu(index).pci_bus_id
        argv = [*self._smi_argv, "-r", "-i", bus_id]
        with self.nvml.session.exclusive():
            # No NVML client may hold the GPU during a reset: release events and NVML itself first.
            self._events.release()
            self._tables.forget()
            self.nvml.shutdown()
            try:
                log.info("resetting GPU %d (%s): %s", index, bus_id, " ".join(argv))
                self._run_smi(index, argv)
            finally:
                self.nvml.init()

    def _run_smi(self, index: int, argv: list[str]) -> None:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self._smi_timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HardwareError(f"GPU {index}: reset via nvidia-smi failed: {e}", gpu=index) from e
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise HardwareError(f"GPU {index}: nvidia-smi -r exited {proc.returncode}: "
                                f"{detail[-1] if detail else 'no output'}", gpu=index)

    # -- instances --------------------------------------------------------------------------------
    def gi_profiles(self, index: int) -> list[Any]:
        """The GPU's live GI profile table (nvmlGpuInstanceProfileInfo_t); a real H100 answers it with
        MIG off too (tests/fixtures), other drivers may answer NOT_SUPPORTED: then the list is empty."""
        return [info for _, info in self.gi_profile_table(index)]

    def gi_profile_table(self, index: int) -> list[tuple[int, Any]]:
        """(NVML_GPU_INSTANCE_PROFILE_* enum, info) for every profile the GPU offers (read once per
        MIG mode: profiletables.py)."""
        dev = self._dev(index)

        def read() -> list[tuple[int, Any]]:
            infos = ((e, self.nvml(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, e, gpu=index,
                                   absent=_NO_SUCH_PROFILE)) for e in range(GI_ENUM_COUNT))
            return [(e, i) for e, i in infos if i is not None]
        return self._tables.gi(index, self._mode(dev, index), read)

    def _mode(self, dev: Any, index: int) -> tuple[bool, bool]:
        modes = self.nvml(pynvml.nvmlDeviceGetMigMode, dev, gpu=index, absent=(pynvml.NVML_ERROR_NOT_SUPPORTED,))
        return (bool(modes[0]), bool(modes[1])) if modes is not None else (False, False)

    def possible_placements(self, index: int, profile_id: int) -> list[Placement]:
        """nvml.h: every placement of a profile "regardless of whether MIG is enabled"."""
        dev = self._dev(index)
        count = ctypes.c_uint(0)
        placements = pynvml.nvmlDeviceGetGpuInstancePossiblePlacements
        self.nvml(placements, dev, profile_id, None, ctypes.byref(count), gpu=index)
        buf = (pynvml.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
        self.nvml(placements, dev, profile_id, buf, ctypes.byref(count), gpu=index)
        return [Placement(int(buf[i].start), int(buf[i].size)) for i in range(count.value)]

    def _handles(self, fn: NvmlFunction, parent: Any, info: Any, ptype: Any, index: int) -> list[Any]:
        """The instances of one profile through NVML's caller-allocated handle array.  ``*count``
        carries the array's capacity in, as NVIDIA's go-nvml does (device.go GetGpuInstances)."""
        capacity = max(1, int(info.instanceCount))
        refs = (ptype * capacity)()
        count = ctypes.c_uint(capacity)
        self.nvml(fn, parent, info.id, refs, ctypes.byref(count), gpu=index)
        return [refs[i] for i in range(count.value)]

    def _settled(self, read: Callable[[int], T], index: int) -> T:
        """A listing read while another process may change the layout: a handle that turned invalid
        (nvml.h: destroyed instances' handles become invalid; NOT_FOUND for a vanished id) means the
        layout moved underneath, so the listing starts again, backing off, for a few seconds."""
        deadline = time.monotonic() + _LISTING_PATIENCE_S
        pause = 0.02
        while True:
            try:
                return read(index)
            except HardwareError as e:
                if e.code not in _VANISHED:
                    raise
                if time.monotonic() + pause > deadline:
                    raise HardwareError(f"{e} (the GPU's instances kept changing for {_LISTING_PATIENCE_S:g}s "
                                        "while they were read: is an apply running?)", code=e.code, gpu=index) from e
                log.debug("GPU %d: the layout changed while it was read (%s); reading again", index, e)
                time.sleep(pause)
                pause = min(0.25, pause * 2)

    def list_gpu_instances(self, index: int) -> list[GpuInstance]:
        return self._settled(self._list_gpu_instances, index)

    def _list_gpu_instances(self, index: int) -> list[GpuInstance]:
        dev = self._dev(index)
        mode = self._mode(dev, index)
        out = []
        for info in self.gi_profiles(index):
            for gi in self._handles(pynvml.nvmlDeviceGetGpuInstances, dev, info, pynvml.c_nvmlGpuInstance_t, index):
                gi_info = self.nvml(pynvml.nvmlGpuInstanceGetInfo, gi, gpu=index)
                cis = self._compute_instances(gi, index, self._tables.ci(
                    index, mode, int(gi_info.profileId), functools.partial(self._ci_profiles, gi, index)))
                out.append(GpuInstance(id=int(gi_info.id), profile_id=int(gi_info.profileId),
                                       placement=Placement(int(gi_info.placement.start), int(gi_info.placement.size)),
                                       compute_instances=tuple(cis)))
        return sorted(out, key=lambda g: (g.placement.start, g.id))

    def _ci_profiles(self, gi: Any, index: int) -> list[Any]:
        shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        infos = (self.nvml(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, e, shared, gpu=index,
                           absent=_NO_SUCH_PROFILE) for e in range(CI_ENUM_COUNT))
        return [i for i in infos if i is not None]

    def _compute_instances(self, gi: Any, index: int, profiles: list[Any]) -> list[ComputeInstance]:
        out = []
        for info in profiles:
            for ref in self._handles(pynvml.nvmlGpuInstanceGetComputeInstances, gi, info,
                                     pynvml.c_nvmlComputeInstance_t, index):
                ci = self.nvml(pynvml.nvmlComputeInstanceGetInfo, ref, gpu=index)
                out.append(ComputeInstance(id=int(ci.id), profile_id=int(ci.profileId),
                                           placement=Placement(int(ci.placement.start), int(ci.placement.size))))
        return sorted(out, key=lambda c: c.id)

    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> int:
        # nvml.h: `const nvmlGpuInstancePlacement_t *placement`; pynvml forwards the argument as
        # given and sets no argtypes, so it must be a pointer here, never the struct by value.
        pl = pynvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
        gi = self.nvml(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, self._dev(index), profile_id, ctypes.byref(pl),
                       gpu=index)
        return int(self.nvml(pynvml.nvmlGpuInstanceGetInfo, gi, gpu=index).id)

    def _gi(self, index: int, gi_id: int) -> Any:
        return self.nvml(pynvml.nvmlDeviceGetGpuInstanceById, self._dev(index), gi_id, gpu=index)

    def create_compute_instance(self, index: int, gi_id: int, ci_profile_id: int,
                                placement: Placement | None = None) -> int:
        gi = self._gi(index, gi_id)
        if placement is None:
            ci = self.nvml(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_profile_id, gpu=index)
        else:  # nvml.h: `const nvmlComputeInstancePlacement_t *placement`, by reference as above
            pl = pynvml.c_nvmlComputeInstancePlacement_t(placement.start, placement.size)
            create = pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement
            ci = self.nvml(create, gi, ci_profile_id, ctypes.byref(pl), gpu=index)
        return int(self.nvml(pynvml.nvmlComputeInstanceGetInfo, ci, gpu=index).id)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        ci = self.nvml(pynvml.nvmlGpuInstanceGetComputeInstanceById, self._gi(index, gi_id), ci_id, gpu=index)
        self.nvml(pynvml.nvmlComputeInstanceDestroy, ci, gpu=index)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self.nvml(pynvml.nvmlGpuInstanceDestroy, self._gi(index, gi_id), gpu=index)

    # -- MIG devices, processes, memory -----------------------------------------------------------
    def _mig_handles(self, index: int) -> list[tuple[Any, int, int]]:
        """(MIG device handle, GI id, CI id) for every MIG device of the GPU."""
        dev = self._dev(index)
        out = []
        for i in range(int(self.nvml(pynvml.nvmlDeviceGetMaxMigDeviceCount, dev, gpu=index))):
            mig = self.nvml(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, dev, i, gpu=index,
                            absent=(pynvml.NVML_ERROR_NOT_FOUND,))
            if mig is not None:
                out.append((mig, int(self.nvml(pynvml.nvmlDeviceGetGpuInstanceId, mig, gpu=index)),
                            int(self.nvml(pynvml.nvmlDeviceGetComputeInstanceId, mig, gpu=index))))
        return out

    def list_mig_devices(self, index: int) -> list[MigDevice]:
        return self._settled(self._list_mig_devices, index)

    def _list_mig_devices(self, index: int) -> list[MigDevice]:
        return nvml_view.read_devices(self.nvml, index, nvml_view.view_devices(self.nvml, index,
                                                                               self._mig_handles(index)))

    def probe_mig_devices(self, index: int) -> dict[tuple[int, int], str | None]:
        out: dict[tuple[int, int], str | None] = {}
        for mig, gi_id, ci_id in self._mig_handles(index):
            try:
                self.nvml(pynvml.nvmlDeviceGetMemoryInfo, mig, gpu=index)
                self.nvml(pynvml.nvmlDeviceGetComputeRunningProcesses, mig, gpu=index)
                out[(gi_id, ci_id)] = None
            except HardwareError as e:
                out[(gi_id, ci_id)] = f"NVML_ERROR_{error_name(e.code)}"
        return out

    def gpu_processes(self, index: int) -> list[ProcessInfo]:
        return self._processes(self._dev(index), index)

    def _processes(self, dev: Any, index: int) -> list[ProcessInfo]:
        procs = self.nvml(pynvml.nvmlDeviceGetComputeRunningProcesses, dev, gpu=index)
        return [ProcessInfo(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory,
                            gi_id=None if p.gpuInstanceId == GPU_WIDE else int(p.gpuInstanceId),
                            ci_id=None if p.computeInstanceId == GPU_WIDE else int(p.computeInstanceId))
                for p in procs]

    # -- GPM and events ---------------------------------------------------------------------------
    def gpm_supported(self, index: int) -> bool:
        support = self.nvml(pynvml.nvmlGpmQueryDeviceSupport, self._dev(index), gpu=index,
                            absent=ALL_ERRORS)
        return bool(support is not None and support.isSupportedDevice)

    def gpm_sample(self, index: int, gi_ids: list[int], interval_s: float = 0.1) -> dict[int, GpmMetrics]:
        return gpm_sample(self.nvml, self._dev(index), index, gi_ids, interval_s)

    # -- the sampler's cached view (nvml_view.py) ---------------------------------------------------
    def open_view(self, index: int) -> GpuView:
        info = self.gpu(index)
        dev = self._dev(index)
        if not info.mig_current:
            return NvmlView(index, info, dev)
        instances = tuple(self.list_gpu_instances(index))
        gpm = bool(instances) and info.model is not None and info.model.is_hopper_or_newer \
            and self.gpm_supported(index)
        return nvml_view.open_view(self.nvml, info, dev, instances, self._mig_handles(index), gpm)

    # (each view it is handed is one open_view made: an NvmlView behind the port's GpuView)
    def close_view(self, view: GpuView) -> None:
        nvml_view.close_view(self.nvml, cast(NvmlView, view))

    def view_mode(self, view: GpuView) -> tuple[bool, bool]:
        return nvml_view.view_mode(self.nvml, cast(NvmlView, view))

    def view_devices(self, view: GpuView) -> list[MigDevice]:
        return nvml_view.read_view_devices(self.nvml, cast(NvmlView, view))

    def view_processes(self, view: GpuView) -> list[ProcessInfo]:
        return self._processes(cast(NvmlView, view).handle, view.index)

    def view_activity(self, view: GpuView, interval_s: float) -> dict[int, GpmMetrics]:
        return nvml_view.read_activity(self.nvml, cast(NvmlView, view), interval_s)

    def watch_events(self) -> None:
        self._events.arm()

    def wait_event(self, timeout_ms: int) -> GpuEvent | None:
        return self._events.wait(timeout_ms)

    def probe_events(self) -> dict[int, str]:
        return self._events.probe()

    @property
    def unwatched_gpus(self) -> dict[int, str]:
        """GPUs whose events could not be registered, and why (monitoring goes on for the rest)."""
        return self._events.unwatched
