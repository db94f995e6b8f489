"""Bad input, generated: only validation errors with a location, never a traceback, never a GPU change."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migd.apply.executor import Applier
from migd.config.migdyaml import load_config
from migd.errors import ValidationError
from migd.plan.planner import PlanError
from migd.profiles.loader import load_profile
from migd.profiles.validate import check_profile
from migd.sim.backend import sim_backend
from tests.helpers import PROFILES, REFERENCE

pytestmark = pytest.mark.integration  # hypothesis, seconds each

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True) | st.text(max_size=20)
           | st.sampled_from(["1g", "7g", "3g.40gb", "1c.3g.40gb", "1g.5gb+me", "99g", "all", "enabled", "mon-fri",
                              "25:61", "0x20B010DE", "1:30", "0o17", "∞", "\u202e", "A100*", ""]))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                                   max_size=4), max_leaves=12)

DAY = yaml.safe_load((PROFILES / "day.yaml").read_text())
MIGPARTED = {"version": "v1", "mig-configs": {"c": [{"devices": "all", "mig-enabled": True,
                                                     "mig-devices": {"1g.10gb": 7}}]}}
CONFIG = {"timezone": "Asia/Seoul", "profiles_dir": "profiles",
          "schedule": [{"profile": "day", "at": "08:30", "days": "mon-fri"}]}


def mutate(doc: Any, data: st.DataObject) -> Any:
    """Replace, delete or add one thing somewhere in a valid document."""
    doc = copy.deepcopy(doc)
    node, parent, key = doc, None, None
    for _ in range(data.draw(st.integers(0, 4))):
        if isinstance(node, dict) and node:
            parent, key = node, data.draw(st.sampled_from(sorted(node, key=str)))
        elif isinstance(node, list) and node:
            parent, key = node, data.draw(st.integers(0, len(node) - 1))
        else:
            break
        node = parent[key]
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if parent is None:
        return data.draw(values)
    if action == "replace":
        parent[key] = data.draw(values)
    elif action == "delete":
        del parent[key]
    elif isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=8))] = data.draw(values)
    else:
        parent.append(data.draw(values))
    return doc


def located(e: ValidationError) -> None:
    assert e.file and e.line is not None and e.line >= 1, str(e)
    assert str(e).startswith(e.file)


def check_profile_text(text: str) -> None:
    try:
        p = load_profile("fuzz.yaml", text=text)
        check_profile(p)
    except ValidationError as e:
        located(e)


@SETTINGS
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    check_profile_text(text)


@SETTINGS
@given(st.data())
def test_mutated_profiles(data: st.DataObject) -> None:
    check_profile_text(yaml.safe_dump(mutate(DAY, data), allow_unicode=True))


@SETTINGS
@given(st.data())
def test_mutated_mig_parted_files(data: st.DataObject) -> None:
    text = yaml.safe_dump(mutate(MIGPARTED, data), allow_unicode=True)
    try:
        check_profile(load_profile("fuzz.yaml", config="c", text=text))
    except ValidationError as e:
        located(e)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_daemon_configs(tmp_path_factory: Any, data: st.DataObject) -> None:
    d = tmp_path_factory.mktemp("cfg")
    (d / "profiles").mkdir()
    (d / "profiles" / "day.yaml").write_text((PROFILES / "day.yaml").read_text())
    (d / "migd.yaml").write_text(yaml.safe_dump(mutate(CONFIG, data), allow_unicode=True))
    try:
        load_config(d / "migd.yaml")
    except ValidationError as e:
        assert e.file and (e.line is not None or "profiles" in e.file or "directory" in e.message), str(e)


# NVIDIA's config-default.yaml names 95 GB and 189 GB profiles of a board migd's catalog does not hold
# yet: those three configs cannot be checked offline (each GPU's live table decides at apply time).
UNCHECKABLE = {"all-3g.95gb", "all-4g.95gb", "all-7g.189gb"}


def test_every_reference_mig_parted_config_is_valid() -> None:
    """All 81 configs of NVIDIA's own file load and are valid on some catalog model (or, the three
    above, on none the catalog knows): an error or a newly uncheckable config fails here."""
    path = REFERENCE / "mig-parted-config-default.yaml"
    text = path.read_text()
    configs = list(yaml.safe_load(text)["mig-configs"])
    checked = {cfg: check_profile(load_profile("ref.yaml", config=cfg, text=text)) for cfg in configs}
    assert len(configs) == 81
    assert {cfg for cfg, sections in checked.items() if not any(sections.values())} == UNCHECKABLE


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_bad_input_never_changes_a_gpu(tmp_path_factory: Any, data: st.DataObject) -> None:
    d: Path = tmp_path_factory.mktemp("apply")
    text = yaml.safe_dump(mutate(DAY, data), allow_unicode=True)  # hypothesis may end the example here
    backend = sim_backend(d / "s.json", "mixed")
    applier = Applier(backend, d / "state")
    before = (d / "s.json").read_bytes()
    try:
        profile = load_profile("fuzz.yaml", text=text)
        result = applier.apply(profile)
    except (ValidationError, PlanError):
        assert (d / "s.json").read_bytes() == before
    else:  # input that passed is applied as asked: nothing is left to do
        assert result.ok and not any(p.changes for p in applier.plan(profile)), result
    finally:
        backend.close()
