"""A fake ``nvidia-smi`` over the simulator's shared state file.

It answers the subset migd, operators and monitoring scripts use, in the real tool's layout: ``-L``,
``-r -i ID``, ``-i ID -mig 0|1``, ``mig -lgi``, ``mig -lci``, ``mig -lgip``, ``mig -lgipp``, and
``--query-gpu=FIELDS --format=csv[,noheader][,nounits]`` (smi_query.py; GPUtil reads GPUs this way).
The state file comes from ``--sim-state PATH`` (first argument) or ``$MIGD_SIM_STATE``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import pynvml

from migd.catalog.models import GiProfile
from migd.sim.gpu import mig_uuid, sim_model
from migd.sim.state import SimGi, SimGpu, SimState, StateStore
from migd.sim.world import SimError, reset_gpu

GIB = 1024.0
T = TypeVar("T")


def list_gpus(state: SimState) -> str:
    lines = []
    for g in state.gpus:
        m = sim_model(g.model)
        lines.append(f"GPU {g.index}: {m.nvml_name} (UUID: {g.uuid})")
        if not g.mig_current:
            continue
        dev = 0
        for gi in g.gis:
            prof = m.profile_by_id(gi.profile_id)
            assert prof is not None
            for ci in gi.cis:
                cp = prof.ci_by_id(ci.profile_id)
                name = cp.name if cp else prof.name
                lines.append(f"  MIG {name:<12}Device {dev:>2}: (UUID: {mig_uuid(g.uuid, gi.serial, ci.serial)})")
                dev += 1
    return "\n".join(lines) + "\n"


def _table(title: str, header: list[str], rows: list[str], width: int) -> str:
    bar = "+" + "-" * width + "+"
    out = [bar, f"| {title:<{width - 1}}|"] + [f"|{h:<{width}}|" for h in header] + ["|" + "=" * width + "|"]
    if not rows:
        out += [f"| {'No GPU instances found':<{width - 1}}|", bar]
    for r in rows:
        out += [f"|{line:<{width}}|" for line in r.split("\n")] + [bar]
    return "\n".join(out) + "\n"


def _gis(gpus: list[SimGpu]) -> Iterator[tuple[SimGpu, SimGi, GiProfile]]:
    for g in gpus:
        for gi in g.gis:
            prof = sim_model(g.model).profile_by_id(gi.profile_id)
            assert prof is not None
            yield g, gi, prof


def list_gis(state: SimState, gpus: list[SimGpu]) -> str:
    rows = []
    for g, gi, prof in _gis(gpus):
        rows.append(f" {g.index:>3}  MIG {prof.name:<13}{gi.profile_id:>4}{gi.id:>9}{gi.start:>11}:{gi.size:<6}")
    return _table("GPU instances:", [" GPU   Name             Profile  Instance   Placement  ",
                                     "                          ID       ID       Start:Size "], rows, 55)


def list_cis(state: SimState, gpus: list[SimGpu]) -> str:
    rows = []
    for g, gi, prof in _gis(gpus):
        for ci in gi.cis:
            cp = prof.ci_by_id(ci.profile_id)
            rows.append(f" {g.index:>3}  {gi.id:>5}       MIG {(cp.name if cp else '?'):<14}{ci.profile_id:>4}"
                        f"{ci.id:>10}{ci.start:>11}:{ci.size:<6}")
    return _table("Compute instances:", [" GPU     GPU       Name             Profile   Instance   Placement  ",
                                         "       Instance                       ID        ID       Start:Size ",
                                         "         ID                                                         "],
                  rows, 68)


def list_gi_profiles(gpus: list[SimGpu]) -> str:
    rows = []
    for g in gpus:
        m = sim_model(g.model)
        for p in m.profiles:
            free = g.remaining_capacity(p)  # a real H100 with MIG off listed 7/7 (tests/fixtures)
            first = (f" {g.index:>3}  MIG {p.name:<14}{p.profile_id:>4}{free:>6}/{p.instance_count:<9}"
                     f"{p.memory_mib / GIB:>6.2f}      No{p.sm:>7}{p.dec:>6}{p.enc:>6}")
            rows.append(f"{first}\n{'':<58}{p.ce:>4}{p.jpeg:>6}{p.ofa:>6}")
    header = [" GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC",
              "                              Free/Total   GiB              CE    JPEG  OFA"]
    return _table("GPU instance profiles:", header, rows, 83)


def list_gi_placements(gpus: list[SimGpu]) -> str:
    lines = []
    for g in gpus:
        for p in sim_model(g.model).profiles:
            starts = ",".join(str(s) for s in p.starts)
            word = "Placements" if len(p.starts) > 1 else "Placement "
            lines.append(f"GPU {g.index:>2} Profile ID {p.profile_id:>2} {word}: {{{starts}}}:{p.memory_slices}")
    return "\n".join(lines) + "\n"


def _select(state: SimState, ident: str | None) -> list[SimGpu]:
    if ident is None:
        return state.gpus
    for g in state.gpus:
        if ident in (str(g.index), g.uuid, g.bus_id, g.bus_id[4:]):
            return [g]
    raise SimError(f"No devices were found matching {ident!r}")


USAGE = """
    nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -i,   --id=                 Target a specific GPU (index, UUID or PCI bus id).
    -r,   --gpu-reset           Trigger a reset of the GPU given with -i.
    -mig  0|1                   Disable or enable MIG mode (of the GPU given with -i, or of every GPU).
    --query-gpu=                Information about GPUs: --query-gpu=FIELD,... --format=csv[,noheader][,nounits].
    mig -lgi | -lci | -lgip | -lgipp
                                List GPU instances, compute instances, GPU instance profiles and their
                                placements (with -i: of one GPU).

    With no option: the GPU, MIG devices and processes tables.
    The simulator's nvidia-smi answers the options above, over the simulated NVML library's state
    (--sim-state PATH first, or MIGD_SIM_STATE); any other option is refused.
"""


def usage(state: SimState) -> str:
    """``-h``: headed as the real tool heads it (its version is the driver's)."""
    return f"NVIDIA System Management Interface -- v{state.driver_version}\n{USAGE}"


def run(argv: Sequence[str], store: StateStore) -> tuple[int, str]:
    """Run one fake nvidia-smi command; returns (exit code, output)."""
    args = list(argv)
    ident = None
    if "-i" in args:
        k = args.index("-i")
        ident = args[k + 1] if k + 1 < len(args) else None
        del args[k:k + 2]
    for a in [a for a in args if a.startswith("--id=")]:
        ident = a.split("=", 1)[1]
        args.remove(a)
    try:
        if args in (["-h"], ["--help"]):
            return 0, usage(store.read())
        if args == []:
            from migd.sim.smi_table import default_table
            return 0, _through_nvml(store, default_table)
        if args in (["-L"], ["--list-gpus"]):
            return 0, list_gpus(store.read())
        query = _option(args, "--query-gpu")
        if query is not None:
            gpus = _select(store.read(), ident)
            return _query(store, query.split(","), (_option(args, "--format") or "").split(","),
                          [g.index for g in gpus])
        if args == ["-r"]:
            if ident is None:
                return 2, "nvidia-smi -r needs -i: migd never resets every GPU at once\n"
            gpu = _select(store.read(), ident)[0]
            reset_gpu(store, gpu.index)
            return 0, f"GPU {gpu.bus_id} was successfully reset.\nAll done.\n"
        if args[:1] == ["-mig"] and len(args) == 2 and args[1] in ("0", "1"):
            return 0, _set_mig_mode(store, _select(store.read(), ident), args[1] == "1")
        if args[:1] == ["mig"] and len(args) == 2:
            state = store.read()
            gpus = _select(state, ident)
            table = {"-lgi": lambda: list_gis(state, gpus), "-lci": lambda: list_cis(state, gpus),
                     "-lgip": lambda: list_gi_profiles(gpus), "-lgipp": lambda: list_gi_placements(gpus)}
            if args[1] in table:
                return 0, table[args[1]]()
    except SimError as e:
        return 255, f"{e}\n"
    except Exception as e:  # an NVML error from the fake library, as nvidia-smi would print it
        return 255, f"Failed: {e}\n"
    return 2, f"fake nvidia-smi: unsupported arguments {' '.join(argv)!r} (nvidia-smi -h lists what it answers)\n"


def _option(args: list[str], name: str) -> str | None:
    """``--name=VALUE`` or ``--name VALUE``, as nvidia-smi takes its long options."""
    for k, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and k + 1 < len(args):
            return args[k + 1]
    return None


def _query(store: StateStore, fields: list[str], formats: list[str], indexes: list[int]) -> tuple[int, str]:
    """``--query-gpu`` through NVML, as the real tool reads it (smi_query.py)."""
    from migd.sim.smi_query import query_gpu
    return _through_nvml(store, lambda: query_gpu([f.strip() for f in fields if f.strip()],
                                                  [f.strip() for f in formats], indexes))


def _through_nvml(store: StateStore, read: Callable[[], T]) -> T:
    """``read`` with the simulated library loaded and initialised, as the real tool runs: an NVML client."""
    from migd.sim.library import load
    load(store)
    pynvml.nvmlInit()
    try:
        return read()
    finally:
        pynvml.nvmlShutdown()


def _set_mig_mode(store: StateStore, gpus: list[SimGpu], enable: bool) -> str:
    """``-mig 0|1`` through NVML, as the real tool does (so it is an NVML client while it runs).
    Messages as the MIG user guide shows them (facts rules.mig_mode [S2,S3])."""
    return _through_nvml(store, lambda: _set_modes(gpus, enable))


def _set_modes(gpus: list[SimGpu], enable: bool) -> str:
    out, word = [], "enable" if enable else "disable"
    for g in gpus:
        status = pynvml.nvmlDeviceSetMigMode(pynvml.nvmlDeviceGetHandleByIndex(g.index), int(enable))
        if status == pynvml.NVML_ERROR_IN_USE:
            out.append(f"Warning: MIG mode is in pending {word} state for GPU {g.bus_id}:In use by another client\n"
                       f"{g.bus_id} is currently being used by one or more other processes (e.g. CUDA "
                       "application or a monitoring application such as another instance of nvidia-smi). "
                       "Please first kill all processes using the device and retry the command or reboot "
                       "the system to make MIG mode effective.")
        elif status == pynvml.NVML_ERROR_RESET_REQUIRED:
            out.append(f"Warning: MIG mode is in pending {word} state for GPU {g.bus_id}:Not Supported\n"
                       f"Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective on GPU "
                       f"{g.bus_id}")
        out.append(f"{word.capitalize()}d MIG Mode for GPU {g.bus_id}")
    return "\n".join(out) + "\nAll done.\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = os.environ.get("MIGD_SIM_STATE")
    if args[:1] == ["--sim-state"] and len(args) >= 2:
        path, args = args[1], args[2:]
    if not path:
        print("fake nvidia-smi: no simulator state (pass --sim-state PATH or set MIGD_SIM_STATE)", file=sys.stderr)
        return 2
    code, out = run(args, StateStore(path))
    (sys.stdout if code == 0 else sys.stderr).write(out)
    return code


if __name__ == "__main__":
    sys.exit(main())
