"""Read profile files: migd's own format and NVIDIA mig-parted's config format."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from migd.catalog.models import MODELS
from migd.errors import ValidationError
from migd.profiles.model import GpuSection, InstanceSpec, Loc, PciId, Profile, Selector
from migd.yamlsrc import Node, excerpt, load, read

API_VERSION = "migd/v1"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NAME_RULE = "letters, digits, '.', '_', '-'; max 63"  # a profile's name and an owner label


def is_name(text: str) -> bool:
    """Whether ``text`` is a profile name or owner label (whole: ``$`` also matched before a final newline)."""
    return _NAME.fullmatch(text) is not None
_PROFILE = re.compile(r"^(?:[0-9]{1,2}c\.)?[0-9]{1,2}g(?:\.[0-9]{1,6}gb)?(?:[+-][a-z.]+)?$", re.ASCII)
_CI = re.compile(r"^[0-9]{1,2}c(?:\.[0-9]{1,2}g(?:\.[0-9]{1,6}gb)?(?:[+-][a-z.]+)?)?$", re.ASCII)
# No GPU in the catalog holds more instances of one profile (NVML's instanceCount: 7 x 1g on A100/H100);
# anything larger is a typo, and each GPU's own table gives the real limit at plan time.
MAX_COUNT = max(gi.instance_count for m in MODELS.values() for gi in m.profiles)


def _loc(n: Node) -> Loc:
    return Loc(n.file, n.line, n.column, n.field)


def load_profile(path: str | Path, config: str | None = None, text: str | None = None,
                 strict: bool = False) -> Profile:
    """Load either format; ``config`` picks the mig-configs entry of a mig-parted file.

    ``strict``: refuse a file that group or others may write (see ``yamlsrc.load``).
    """
    text = read(path, strict, "profile") if text is None else text
    root = load(path, text)
    top = profile_top(root)
    if "mig-configs" in top or ("version" in top and "apiVersion" not in top):
        profile = _load_mig_parted(root, config)
    elif config is not None:
        raise root.error("--config applies to mig-parted files only; this is a migd profile")
    else:
        profile = _load_migd(root)
    return replace(profile, text=text)


def profile_top(root: Node) -> dict[str, Node]:
    """The top-level keys of a profile or mig-parted file; a file with none of their keys is refused
    without quoting any of it: it may be any file root can read (a private key, a shadow file)."""
    top = root.mapping() if root.is_mapping() else {}
    if not top.keys() & {"apiVersion", "kind", "version", "mig-configs"}:
        raise root.error("not a migd profile (apiVersion: migd/v1, kind: Profile) or a mig-parted config "
                         "(version: v1, mig-configs: ...)")
    return top


def _load_migd(root: Node) -> Profile:
    top = root.mapping(allowed=["apiVersion", "kind", "name", "description", "gpus"],
                       required=["apiVersion", "kind", "name", "gpus"])
    top["apiVersion"].str(choices=[API_VERSION])
    top["kind"].str(choices=["Profile"])
    name = top["name"].str()
    if not is_name(name):
        raise top["name"].error(f"{excerpt(name)} is not a valid name ({NAME_RULE})")
    description = top["description"].str() if "description" in top else ""
    sections = [_migd_section(n) for n in top["gpus"].items()]
    if not sections:
        raise top["gpus"].error("must list at least one GPU selection")
    return Profile(name=name, description=description, sections=tuple(sections), source=root.file)


def _selector(n: Node) -> Selector:
    if n.is_scalar():
        n.str(choices=["all"])
        return Selector(all=True)
    m = n.mapping(allowed=["index", "uuid", "model", "pci_device_id"])
    if not m:
        raise n.error("must name at least one of index, uuid, model, pci_device_id")

    def many(node: Node) -> list[Node]:
        """A value or a list of them, never none: an empty list or text selects no GPU (a typo that
        validate called ok and plan refused)."""
        out = list(node.items()) if node.is_sequence() else [node]
        if not out:
            raise node.error("lists nothing: it would select no GPU")
        return out

    def text(node: Node) -> str:
        value = node.str()
        if not value.strip():
            raise node.error("must not be empty: it would select no GPU")
        return value

    indexes = tuple(x.int(minimum=0, maximum=63) for x in many(m["index"])) if "index" in m else None
    uuids = tuple(text(x) for x in many(m["uuid"])) if "uuid" in m else None
    models = tuple(text(x) for x in many(m["model"])) if "model" in m else None
    pci = tuple(_pci_id(x) for x in many(m["pci_device_id"])) if "pci_device_id" in m else None
    return Selector(indexes=indexes, uuids=uuids, models=models, pci=pci)


def _pci_id(n: Node) -> PciId:
    """mig-parted's NewDeviceIDFromString (pkg/types/device.go): one or two ``:``-separated 32-bit
    numbers, each read as Go's strconv.ParseUint(s, 0, 32) reads it (0x hex, 0o/0 octal, decimal)."""
    raw = str(n.node.value if n.is_scalar() else "")
    parts = raw.split(":")
    try:
        if len(parts) > 2 or not n.is_scalar():
            raise ValueError
        ids = [_go_uint32(p) for p in parts]
    except ValueError:
        raise n.error(f"{excerpt(raw)} is not a PCI device id like 0x20B010DE or 0x233010DE:0x16C010DE") from None
    return PciId(ids[0], ids[1] if len(ids) == 2 else None)


def _go_uint32(text: str) -> int:
    t = text.strip().lower()
    if not t.isascii():  # (Python's int reads other scripts' digits, Go's ParseUint does not)
        raise ValueError(text)
    if t.startswith(("0x", "0o", "0b")):
        value = int(t, 0)
    elif t.startswith("0") and len(t) > 1:
        value = int(t, 8)  # Go's base 0: a leading 0 is octal
    else:
        value = int(t, 10)
    if not 0 <= value < 1 << 32:
        raise ValueError(text)
    return value


def _migd_section(n: Node) -> GpuSection:
    m = n.mapping(allowed=["select", "mig", "instances"], required=["select"])
    mig = True
    if "mig" in m:
        mig = m["mig"].str(choices=["enabled", "disabled"]) == "enabled"
    instances: list[InstanceSpec] = []
    if "instances" in m:
        if not mig:
            raise m["instances"].error("instances require mig: enabled")
        instances = [_instance(x) for x in m["instances"].items()]
    return GpuSection(selector=_selector(m["select"]), mig=mig, instances=tuple(instances), loc=_loc(n))


def _instance(n: Node) -> InstanceSpec:
    m = n.mapping(allowed=["profile", "count", "owner", "compute"], required=["profile"])
    profile = m["profile"].str()
    if not _PROFILE.match(profile):
        raise m["profile"].error(f"{excerpt(profile)} is not a MIG profile name (e.g. 1g, 3g.40gb, 1g.10gb+me, "
                                 "1c.3g.40gb)")
    count = m["count"].int(minimum=1, maximum=MAX_COUNT) if "count" in m else 1
    owner = m["owner"].str() if "owner" in m else None
    if owner is not None and not is_name(owner):
        raise m["owner"].error(f"{excerpt(owner)} is not a valid owner label ({NAME_RULE})")
    compute = None
    if "compute" in m:
        items = list(m["compute"].items())
        if not items:
            raise m["compute"].error("must list at least one compute instance")
        compute = tuple(x.str() for x in items)
        for x, c in zip(items, compute, strict=True):
            if not _CI.match(c):
                raise x.error(f"{excerpt(c)} is not a compute-instance profile (e.g. 1c, 2c, 1c.3g.40gb)")
    return InstanceSpec(profile=profile, count=count, owner=owner, compute=compute, loc=_loc(m["profile"]))


# -- mig-parted ---------------------------------------------------------------------------------
def mig_parted_configs(path: str | Path, text: str | None = None) -> list[str]:
    """The config names of a mig-parted file, read as its api/spec/v1 Spec is: ``version: v1`` required,
    ``mig-configs`` may be absent (a spec with nothing to apply) but not empty (spec_test.go)."""
    root = load(path, text)
    profile_top(root)
    top = root.mapping(allowed=["version", "mig-configs"], required=["version"])
    top["version"].str(choices=["v1"])
    if "mig-configs" not in top:
        return []
    configs = top["mig-configs"].named()  # (any YAML key to mig-parted; printed by migd: nothing unprintable)
    if not configs:
        raise top["mig-configs"].error("must name at least one config")
    return list(configs)


def mig_parted_profiles(path: str | Path, strict: bool = False,
                        text: str | None = None) -> dict[str, Profile | ValidationError]:
    """Every config of a mig-parted file as a profile, or why it is none: the file read and parsed once
    (a file of 2,500 configs read again for each took minutes, past the unit's watchdog at start);
    ``text``: its contents, already read."""
    text = read(path, strict, "profile") if text is None else text
    root = load(path, text)
    profile_top(root)
    top = root.mapping(allowed=["version", "mig-configs"], required=["version", "mig-configs"])
    top["version"].str(choices=["v1"])
    configs = top["mig-configs"].named()
    if not configs:
        raise top["mig-configs"].error("must name at least one config")
    out: dict[str, Profile | ValidationError] = {}
    for name in configs:
        try:
            out[name] = replace(_mig_parted_profile(root, configs, name), text=text)
        except ValidationError as e:
            out[name] = e
    return out


def _load_mig_parted(root: Node, config: str | None) -> Profile:
    top = root.mapping(allowed=["version", "mig-configs"], required=["version", "mig-configs"])
    top["version"].str(choices=["v1"])
    configs = top["mig-configs"].named()
    if config is None:
        raise root.error("this is a mig-parted file: choose a config with --config NAME", sorted(configs))
    if config not in configs:
        raise top["mig-configs"].error(f"no config named {excerpt(config)}", sorted(configs))
    return _mig_parted_profile(root, configs, config)


def _mig_parted_profile(root: Node, configs: dict[str, Node], config: str) -> Profile:
    warnings: list[str] = []
    sections = [_mig_parted_section(n, warnings) for n in configs[config].items()]
    if not sections:
        raise configs[config].error("lists no devices")
    return Profile(name=config, description=f"mig-parted config {config!r} from {Path(root.file).name}",
                   sections=tuple(sections), source=root.file, kind="mig-parted", warnings=tuple(warnings))


def _mig_devices(m: dict[str, Node], mig: bool) -> list[InstanceSpec]:
    """mig-parted's rules (api/spec/v1/spec.go MigConfigSpec.UnmarshalJSON, pkg/types/mig_config.go
    AssertValidFormat): mig-enabled true needs mig-devices (``{}`` for none, explicitly); mig-enabled
    false takes none or ``{}``; a non-empty map whose counts are all 0 is refused, never read as "wipe"."""
    null = "mig-devices" in m and m["mig-devices"].is_scalar() and m["mig-devices"].node.tag.endswith(":null")
    if "mig-devices" not in m or null:  # (a YAML null is Go's nil map: "missing" to mig-parted)
        if mig:
            raise m["mig-enabled"].error("mig-enabled: true needs mig-devices (write mig-devices: {} to enable MIG "
                                         "with no instances)")
        return []
    node = m["mig-devices"]
    devices = node.mapping()
    if devices and not mig:
        raise node.error("MIG devices included when mig-enabled is false")
    instances = []
    for name, v in devices.items():
        if not _PROFILE.match(name):
            raise v.error(f"{excerpt(name)} is not a MIG profile name")
        instances.append(InstanceSpec(profile=name, count=v.int(minimum=0, maximum=MAX_COUNT), owner=None,
                                      compute=None, loc=_loc(v)))
    if devices and all(i.count == 0 for i in instances):
        raise node.error("all counts for all MIG profiles are 0 (write mig-devices: {} if no instances is meant)")
    return instances


def _device_filter(f: Node, warnings: list[str]) -> tuple[PciId, ...] | None:
    """mig-parted's ``MatchesDeviceFilter`` (api/spec/v1/helpers.go): ``""`` or ``[]`` filters nothing (all
    devices); an entry that is not a PCI device id (a model name, ``0x233010DE:0x16C010DE:extra``)
    parses to no device and matches nothing, so the entry is skipped, not refused: a warning names it."""
    entries = list(f.items()) if f.is_sequence() else [f]
    ids: list[PciId] = []
    for x in entries:
        if not x.is_scalar():  # (read as no filter, a mapping here applied the config to every GPU, silently)
            raise x.error("must be a string or a list of strings, as mig-parted reads it")
        raw = x.str() if x.is_scalar() and x.node.value != "" else ""
        if raw == "" and not f.is_sequence():
            return None
        try:
            ids.append(_pci_id(x))
        except ValidationError as e:
            warnings.append(f"{e.file}:{e.line}:{e.column}: {e.field}: {e.message}: as in mig-parted, this filter "
                            "matches no GPU")
    return tuple(ids) if entries else None


def _mig_parted_section(n: Node, warnings: list[str]) -> GpuSection:
    m = n.mapping(allowed=["devices", "device-filter", "mig-enabled", "mig-devices"],
                  required=["devices", "mig-enabled"])
    dev = m["devices"]
    indexes = None
    if dev.is_scalar():
        dev.str(choices=["all"])
    else:
        indexes = tuple(x.int(minimum=0, maximum=63) for x in dev.items())
    pci = None
    if "device-filter" in m:
        pci = _device_filter(m["device-filter"], warnings)
    mig = m["mig-enabled"].bool()
    instances = _mig_devices(m, mig)
    selector = Selector(all=indexes is None and pci is None, indexes=indexes, pci=pci)
    return GpuSection(selector=selector, mig=mig, instances=tuple(i for i in instances if i.count > 0),
                      loc=_loc(n), mig_parted=True)
