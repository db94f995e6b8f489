"""The MIG profile tables of every GPU model NVIDIA's mig-parted ``config-default.yaml`` names.

Each number is transcribed from ``shared/reference/mig-facts.yaml`` (the section is cited per
table; ``tests/test_catalog.py`` checks every observed value against a copy of that file).
Where the facts file has no observation, the value is derived by a rule stated beside it and
the row or model says ``unconfirmed``: ``migctl validate`` prints those notes for any layout
that relies on them, and ``migctl doctor`` compares every row with the live driver table.
"""

from __future__ import annotations

from migd.catalog.gpumodel import (
    ARCH_AMPERE,
    ARCH_BLACKWELL,
    ARCH_HOPPER,
    CI_ENUM_1_SLICE_REV1,
    Family,
    GpuModel,
    Row,
    build_model,
)

_NAMES_ONLY = ("profile names and instance counts from NVIDIA's vGPU tables [S18] and mig-parted [S8]; ids, "
               "memory, SMs, engines and placements copied from {sibling}, never observed on this device")


def _est(name: str, role: str, pid: int, inst: int, mem: int, sm: int, ce: int, dec: int, jpeg: int, ofa: int,
         rule: str) -> Row:
    return Row(name, role, pid, inst, mem, sm, ce, dec, 0, jpeg, ofa, unconfirmed=rule)


def _mib(gb: int) -> int:
    """Memory from a profile name where nothing was observed: GB x 10^9 bytes, down to 128 MiB."""
    return gb * 10**9 // 2**20 // 128 * 128


# facts: gpus.A100-SXM4-40GB (lgip [S2,S13]; memory: first listed value, driver dependent)
A100_40 = [
    Row("1g.5gb", "1g", 19, 7, 4864, 14, 1, 0, 0, 0, 0),
    Row("1g.5gb+me", "1g+me", 20, 1, 4864, 14, 1, 1, 0, 1, 1),
    Row("1g.10gb", "1g.2m", 15, 4, 9856, 14, 1, 1, 0, 0, 0),
    Row("2g.10gb", "2g", 14, 3, 9856, 28, 2, 1, 0, 0, 0),
    Row("3g.20gb", "3g", 9, 2, 19968, 42, 3, 2, 0, 0, 0),
    Row("4g.20gb", "4g", 5, 1, 19968, 56, 4, 2, 0, 0, 0),
    Row("7g.40gb", "7g", 0, 1, 40192, 98, 7, 5, 0, 1, 1),
]
# facts: gpus.A100-SXM4-80GB (lgip driver 550.54.14 [S13]); A100 80GB PCIe is identical.
A100_80 = [
    Row("1g.10gb", "1g", 19, 7, 9728, 14, 1, 0, 0, 0, 0),
    Row("1g.10gb+me", "1g+me", 20, 1, 9728, 14, 1, 1, 0, 1, 1),
    Row("1g.20gb", "1g.2m", 15, 4, 19968, 14, 1, 1, 0, 0, 0),
    Row("2g.20gb", "2g", 14, 3, 19968, 28, 2, 1, 0, 0, 0),
    Row("3g.40gb", "3g", 9, 2, 40192, 42, 3, 2, 0, 0, 0),
    Row("4g.40gb", "4g", 5, 1, 40192, 56, 4, 2, 0, 0, 0),
    Row("7g.80gb", "7g", 0, 1, 80640, 98, 7, 5, 0, 1, 1),
]
# facts: gpus.A30-24GB (lgip/lgipp [S13])
A30 = [
    Row("1g.6gb", "1g", 14, 4, 5952, 14, 1, 1, 0, 0, 0),
    Row("1g.6gb+me", "1g+me", 21, 1, 5952, 14, 1, 1, 0, 1, 1),
    Row("2g.12gb", "2g", 5, 2, 11968, 28, 2, 2, 0, 0, 0),
    Row("2g.12gb+me", "2g+me", 6, 1, 11968, 28, 2, 2, 0, 1, 1),
    Row("4g.24gb", "4g", 0, 1, 24000, 56, 4, 4, 0, 1, 1),
]
# facts: gpus.H100-SXM5-80GB (lgip+lgipp [S13]); the PCIe part uses the same table [S1].
H100_80 = [
    Row("1g.10gb", "1g", 19, 7, 9984, 16, 1, 1, 0, 1, 0),
    Row("1g.10gb+me", "1g+me", 20, 1, 9984, 16, 1, 1, 0, 1, 1),
    Row("1g.20gb", "1g.2m", 15, 4, 20096, 26, 1, 1, 0, 1, 0),
    Row("2g.20gb", "2g", 14, 3, 20096, 32, 2, 2, 0, 2, 0),
    Row("3g.40gb", "3g", 9, 2, 40448, 60, 3, 3, 0, 3, 0),
    Row("4g.40gb", "4g", 5, 1, 40448, 64, 4, 4, 0, 4, 0),
    Row("7g.80gb", "7g", 0, 1, 81152, 132, 8, 7, 0, 7, 1),
]
# facts: gpus.H100-NVL-94GB (lgip + lgipp driver 560.35.03 [S13])
H100_NVL = [
    Row("1g.12gb", "1g", 19, 7, 11008, 16, 1, 1, 0, 1, 0),
    Row("1g.12gb+me", "1g+me", 20, 1, 11008, 16, 1, 1, 0, 1, 1),
    Row("1g.24gb", "1g.2m", 15, 4, 22144, 26, 1, 1, 0, 1, 0),
    Row("2g.24gb", "2g", 14, 3, 22144, 32, 2, 2, 0, 2, 0),
    Row("3g.47gb", "3g", 9, 2, 47488, 60, 3, 3, 0, 3, 0),
    Row("4g.47gb", "4g", 5, 1, 47488, 64, 4, 4, 0, 4, 0),
    Row("7g.94gb", "7g", 0, 1, 95360, 132, 8, 7, 0, 7, 1),
]
# facts: gpus.GH200-96GB (lgip on a Grace Hopper node [S23]); the 96GB set H20/H100-96GB/PG506 share.
H100_96 = [
    Row("1g.12gb", "1g", 19, 7, 11264, 16, 1, 1, 0, 1, 0),
    Row("1g.12gb+me", "1g+me", 20, 1, 11264, 16, 1, 1, 0, 1, 1),
    Row("1g.24gb", "1g.2m", 15, 4, 23552, 26, 1, 1, 0, 1, 0),
    Row("2g.24gb", "2g", 14, 3, 23552, 32, 2, 2, 0, 2, 0),
    Row("3g.48gb", "3g", 9, 2, 47616, 60, 3, 3, 0, 3, 0),
    Row("4g.48gb", "4g", 5, 1, 47616, 64, 4, 4, 0, 4, 0),
    Row("7g.96gb", "7g", 0, 1, 95232, 132, 8, 7, 0, 7, 1),
]
# facts: gpus.H200-141GB; every value as NVML and nvidia-smi answered on a real H200 (driver
# 580.159.04, tests/fixtures/h200-580.159.04-*). mig-parted#120's lgip [S12], another driver, printed
# 256 MB less for the 2-, 4- and 8-memory-slice rows (33024, 71168, 143104): memorySizeMB is the driver's.
H200 = [
    Row("1g.18gb", "1g", 19, 7, 16384, 16, 1, 1, 0, 1, 0),
    Row("1g.18gb+me", "1g+me", 20, 1, 16384, 16, 1, 1, 0, 1, 1),
    Row("1g.35gb", "1g.2m", 15, 4, 33280, 26, 1, 1, 0, 1, 0),
    Row("2g.35gb", "2g", 14, 3, 33280, 32, 2, 2, 0, 2, 0),
    Row("3g.71gb", "3g", 9, 2, 71424, 60, 3, 3, 0, 3, 0),
    Row("4g.71gb", "4g", 5, 1, 71424, 64, 4, 4, 0, 4, 0),
    Row("7g.141gb", "7g", 0, 1, 143360, 132, 8, 7, 0, 7, 1),
]
# facts: gpus.GH200-144G-HBM3e: first four rows real lgip [S22]; the rest named by config-default
# [S8,S17] with H200's SMs/engines (same GH100) and memory = slices/2 x the 2g row's.
_GH = "not observed: memory = memory slices/2 x 2g.36gb, SMs and engines as H200's row"
GH200_144 = [
    Row("1g.18gb", "1g", 19, 7, 17920, 16, 1, 1, 0, 1, 0),
    Row("1g.18gb+me", "1g+me", 20, 1, 17920, 16, 1, 1, 0, 1, 1),
    Row("1g.36gb", "1g.2m", 15, 4, 36096, 26, 1, 1, 0, 1, 0),
    Row("2g.36gb", "2g", 14, 3, 36096, 32, 2, 2, 0, 2, 0),
    _est("3g.72gb", "3g", 9, 2, 72192, 60, 3, 3, 3, 0, _GH),
    _est("4g.72gb", "4g", 5, 1, 72192, 64, 4, 4, 4, 0, _GH),
    _est("7g.144gb", "7g", 0, 1, 144384, 132, 8, 7, 7, 1, _GH),
]
# facts: gpus.B200 (mig-parted#166/#187 lgip [S12]; CE of 3g/4g/7g from the doc table [S1]).
_BW = "not observed: memory = memory slices/2 x the 2g row's, SMs = slices x the 1g row's, CE from the doc table"
B200 = [
    Row("1g.23gb", "1g", 19, 7, 22528, 18, 2, 1, 0, 1, 0),
    Row("1g.23gb+me", "1g+me", 20, 1, 22528, 18, 2, 1, 0, 1, 1),
    Row("1g.45gb", "1g.2m", 15, 4, 45312, 30, 2, 1, 0, 1, 0),
    Row("2g.45gb", "2g", 14, 3, 45312, 36, 4, 2, 0, 2, 0),
    _est("3g.90gb", "3g", 9, 2, 90624, 54, 6, 3, 3, 0, _BW),
    _est("4g.90gb", "4g", 5, 1, 90624, 72, 8, 4, 4, 0, _BW),
    _est("7g.180gb", "7g", 0, 1, 181248, 126, 16, 7, 7, 1, _BW),
]
# facts: gpus.GB200 (lgip of production boards mig-parted#227 [S12]; 3g/4g/7g not observed).
GB200 = [
    Row("1g.23gb", "1g", 19, 7, 22528, 18, 2, 1, 0, 1, 0),
    Row("1g.23gb+me", "1g+me", 20, 1, 22528, 18, 2, 1, 0, 1, 1),
    Row("1g.47gb", "1g.2m", 15, 4, 46592, 32, 2, 1, 0, 1, 0),
    Row("2g.47gb", "2g", 14, 3, 46592, 38, 4, 2, 0, 2, 0),
    _est("3g.93gb", "3g", 9, 2, 93184, 54, 6, 3, 3, 0, _BW),
    _est("4g.93gb", "4g", 5, 1, 93184, 72, 8, 4, 4, 0, _BW),
    _est("7g.186gb", "7g", 0, 1, 186368, 126, 16, 7, 7, 1, _BW),
]


def _gb(name: str) -> int:
    return int(name.split("+")[0].split(".")[1].removesuffix("gb"))


def _blackwell_named(names: tuple[str, ...], note: str) -> list[Row]:
    """B300/GB300: names and counts only [S8,S17]; ids, SMs and engines follow B200's rows."""
    return [Row(n, r.role, r.profile_id, r.instances, _mib(_gb(n)),
                r.sm, r.ce, r.dec, r.enc, r.jpeg, r.ofa, unconfirmed=note) for n, r in zip(names, B200, strict=True)]


B300 = _blackwell_named(("1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"),
                        "only the name and count are known: id, SMs, engines as B200's row, memory from the name")
GB300 = _blackwell_named(("1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"),
                         "only the name and count are known (ids per a DGX Station playbook list [S26]): SMs, "
                         "engines as B200's row, memory from the name")
_GFX = "whether +gfx and plain GIs may share the GPU is not documented (allowed here)"
# facts: gpus.RTX-PRO-6000-Blackwell-Server-Edition (lgip [S19,S20]; lgipp [S19]).
RTX_PRO_6000 = [
    Row("1g.24gb", "1g", 14, 4, 24192, 46, 1, 1, 1, 1, 0),
    Row("1g.24gb+me", "1g+me", 21, 1, 24192, 46, 1, 1, 1, 1, 1),
    Row("1g.24gb+gfx", "1g+gfx", 47, 4, 24192, 46, 1, 1, 1, 1, 0, unconfirmed=_GFX),
    Row("1g.24gb+me.all", "1g+me.all", 65, 1, 24192, 46, 1, 4, 4, 4, 1),
    Row("1g.24gb-me", "1g-me", 67, 4, 24192, 46, 1, 0, 0, 0, 0),
    Row("2g.48gb", "2g", 5, 2, 48512, 94, 2, 2, 2, 2, 0),
    Row("2g.48gb+gfx", "2g+gfx", 35, 2, 48512, 94, 2, 2, 2, 2, 0, unconfirmed=_GFX),
    Row("2g.48gb+me.all", "2g+me.all", 64, 1, 48512, 94, 2, 4, 4, 4, 1),
    Row("2g.48gb-me", "2g-me", 66, 2, 48512, 94, 2, 0, 0, 0, 0),
    Row("4g.96gb", "4g", 0, 1, 97408, 188, 4, 4, 4, 4, 1),
    Row("4g.96gb+gfx", "4g+gfx", 32, 1, 97408, 188, 4, 4, 4, 4, 1, unconfirmed=_GFX),
]

_PLACEMENTS = "placements assumed to be the 8-slice table: no -lgipp output seen for this model"
_CI = ("compute-instance profiles other than the full one: counts and placements from the go-nvml mock "
       "(facts A100-SXM4-40GB compute_instance_profiles)")
A, H, B = ARCH_AMPERE, ARCH_HOPPER, ARCH_BLACKWELL


def _sibling(key: str, name: str, pci: int, arch: int, total: int, sm: int, rows: list[Row], sibling: str,
             identity: str = "", alt: tuple[str, ...] = ()) -> GpuModel:
    return build_model(key, name, pci, arch, total, sm, rows, alt_names=alt, ci_unconfirmed=_CI,
                       unconfirmed=(_NAMES_ONLY.format(sibling=sibling),),
                       identity_unconfirmed=identity or f"total memory and SM count copied from {sibling}")


_MEM = "total memory not observed in an nvidia-smi capture"
# total memory / SM counts: facts gpus.<model>.total_memory_mib / sm_count_full_gpu; device ids and
# names: driver README table [S9] and mig-parted config-default device filters [S8].
ALL: tuple[GpuModel, ...] = (
    # -- Ampere (GA100)
    build_model("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 0x20B010DE, A, 40960, 108, A100_40, ci_unconfirmed=_CI),
    _sibling("A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", 0x20F110DE, A, 40960, 108, A100_40, "A100-SXM4-40GB"),
    _sibling("A100-40GB-0x20B1", "NVIDIA A100 40GB (device 0x20B1)", 0x20B110DE, A, 40960, 108, A100_40,
             "A100-SXM4-40GB", "device 0x20B1 is only named 'A100-40GB, A800-40GB' in mig-parted: NVML name, "
             "architecture and memory unknown"),
    _sibling("A800-40GB-Active", "NVIDIA A800 40GB Active", 0x20F610DE, A, 40960, 108, A100_40, "A100-SXM4-40GB"),
    build_model("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 0x20B210DE, A, 81920, 108, A100_80, ci_unconfirmed=_CI),
    build_model("A100-80GB-PCIe", "NVIDIA A100 80GB PCIe", 0x20B510DE, A, 81920, 108, A100_80, ci_unconfirmed=_CI,
                unconfirmed=("placements not observed on the PCIe card (its lgip matches the SXM4's [S13])",),
                identity_unconfirmed=_MEM),
    _sibling("A800-SXM4-80GB", "NVIDIA A800-SXM4-80GB", 0x20F310DE, A, 81920, 108, A100_80, "A100-SXM4-80GB"),
    _sibling("A800-80GB-PCIe", "NVIDIA A800 80GB PCIe", 0x20F510DE, A, 81920, 108, A100_80, "A100-SXM4-80GB",
             alt=("NVIDIA A800 80GB PCIe LC",)),
    build_model("A30-24GB", "NVIDIA A30", 0x20B710DE, A, 24576, 56, A30, Family.A30, ci_unconfirmed=_CI),
    _sibling("PG506-96GB", "NVIDIA PG506-232", 0x20B610DE, A, 97871, 132, H100_96, "GH200-96GB",
             "mig-parted gives device 0x20B6 the Hopper 96GB profile set; its architecture (GA100 id range), "
             "memory and SM count are unknown"),
    # -- Hopper (GH100)
    build_model("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 0x233010DE, H, 81559, 132, H100_80, ci_unconfirmed=_CI),
    build_model("H100-PCIe-80GB", "NVIDIA H100 PCIe", 0x233110DE, H, 81559, 114, H100_80, ci_unconfirmed=_CI,
                unconfirmed=("SM counts of the PCIe card's MIG profiles not observed: SXM5 values used",),
                identity_unconfirmed=_MEM + " (the SXM5's value used)"),
    _sibling("H800-PCIe-80GB", "NVIDIA H800 PCIe", 0x232210DE, H, 81559, 114, H100_80, "H100-SXM5-80GB"),
    _sibling("H800-SXM5-80GB", "NVIDIA H800", 0x232410DE, H, 81559, 132, H100_80, "H100-SXM5-80GB"),
    build_model("H100-NVL-94GB", "NVIDIA H100 NVL", 0x232110DE, H, 95830, 132, H100_NVL, ci_unconfirmed=_CI),
    _sibling("H800-NVL-94GB", "NVIDIA H800 NVL", 0x233A10DE, H, 95830, 132, H100_NVL, "H100-NVL-94GB"),
    build_model("GH200-96GB", "NVIDIA GH200 480GB", 0x234210DE, H, 97871, 132, H100_96,
                alt_names=("NVIDIA GH200 120GB",), rev2_ci_enum=CI_ENUM_1_SLICE_REV1, ci_unconfirmed=_CI,
                unconfirmed=(_PLACEMENTS, "the lgip capture printed no device id: paired with 0x2342 by product "
                             "[S23]"), identity_unconfirmed=_MEM + " (96GB HBM3 nominal)"),
    _sibling("H20-96GB", "NVIDIA H20", 0x232910DE, H, 97871, 78, H100_96, "GH200-96GB",
             "total memory copied from GH200-96GB; SM count 78 is the product's, not observed by NVML"),
    _sibling("H100-96GB", "NVIDIA H100 96GB (device 0x233D)", 0x233D10DE, H, 97871, 132, H100_96, "GH200-96GB",
             "device 0x233D is only named 'H100-96GB' in mig-parted: NVML name and memory unknown"),
    build_model("H200-141GB", "NVIDIA H200", 0x233510DE, H, 143771, 132, H200, ci_unconfirmed=_CI),
    _sibling("H200-NVL-141GB", "NVIDIA H200 NVL", 0x233B10DE, H, 143771, 132, H200, "H200-141GB"),
    build_model("GH200-144GB", "NVIDIA GH200 144G HBM3e", 0x234810DE, H, 146831, 132, GH200_144,
                ci_unconfirmed=_CI, unconfirmed=(_PLACEMENTS,), identity_unconfirmed=_MEM),
    # -- Blackwell
    build_model("B200", "NVIDIA B200", 0x290110DE, B, 183359, 148, B200, ci_unconfirmed=_CI,
                unconfirmed=(_PLACEMENTS,), identity_unconfirmed="SM count (148) is the product's, not observed"),
    build_model("GB200", "NVIDIA GB200", 0x294110DE, B, 189471, 148, GB200, ci_unconfirmed=_CI,
                unconfirmed=(_PLACEMENTS,), identity_unconfirmed="SM count (148) is the product's, not observed"),
    build_model("B300", "NVIDIA B300 SXM6 AC", 0x318210DE, B, _mib(288), 148, B300, ci_unconfirmed=_CI,
                unconfirmed=(_PLACEMENTS,), identity_unconfirmed="no nvidia-smi capture of a B300 seen: memory "
                "from the nominal 288 GB, SM count a guess; architecture Blackwell Ultra unconfirmed"),
    build_model("GB300", "NVIDIA GB300", 0x31C210DE, B, 284208, 148, GB300, ci_unconfirmed=_CI,
                unconfirmed=(_PLACEMENTS,), identity_unconfirmed="SM count (148) a guess"),
    build_model("RTX-PRO-6000-Blackwell-Server", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 0x2BB510DE, B,
                97887, 188, RTX_PRO_6000, Family.GB202,
                ci_unconfirmed="compute-instance profiles other than the full one not observed (assumed as on A30)",
                identity_unconfirmed="total memory from a third-party capture without a driver version [S19]"),
)
