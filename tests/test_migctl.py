"""migctl against simulated fleets: round trips, exit codes, busy instances, hooks, lock, minimal plans."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from migd.apply.journal import Journal
from migd.apply.lock import ApplyLock
from migd.sim import world
from migd.sim.state import CATALOG_FLEETS, StateStore
from tests.helpers import MIGCTL, PROFILES, REFERENCE, Migctl

EXAMPLES = ["day", "night", "night-two", "balanced"]


@pytest.mark.parametrize("fleet", CATALOG_FLEETS)
@pytest.mark.integration
def test_example_profiles_round_trip(tmp_path: Path, fleet: str) -> None:
    m = Migctl(tmp_path, fleet)
    for name in EXAMPLES:
        prof = str(PROFILES / f"{name}.yaml")
        r = m("apply", prof)
        assert r.code == 0, r.err
        assert m("assert", prof).code == 0
        plan = m("plan", prof, "-o", "json").json()
        assert plan["schema"] == "migd.plan/v1" and not any(g["changes"] for g in plan["gpus"])
    assert m("assert", str(PROFILES / "day.yaml")).code == 1
    exported = tmp_path / "exported.yaml"
    r = m("export")
    assert r.code == 0
    exported.write_text(r.out)
    assert m("validate", str(exported)).code == 0
    assert m("assert", str(exported)).code == 0  # the export describes exactly what is there
    before = m.layout()
    assert m("apply", str(exported)).code == 0
    assert m.layout() == before


def test_status_json_shape(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-h100")
    m("apply", str(PROFILES / "balanced.yaml"))
    doc = m("status", "-o", "json").json()
    assert doc["schema"] == "migd.status/v1"
    (gpu,) = doc["gpus"]
    assert set(gpu) == {"index", "uuid", "name", "model", "pci_bus_id", "mig", "instances"}
    owners = sorted((i["profile"], i["owner"]) for i in gpu["instances"])
    assert owners == [("1g.10gb", "notebooks"), ("1g.10gb", "notebooks"), ("2g.20gb", "inference"),
                      ("3g.40gb", "inference")]
    ci = gpu["instances"][0]["compute_instances"][0]
    assert ci["mig_uuid"].startswith("MIG-") and ci["memory_total_bytes"] > 0 and ci["processes"] == []
    assert "GI" in m("status", "-v").out
    assert m("status", "-o", "yaml").out.startswith("schema: migd.status/v1")


def test_minimal_disruption_day_to_balanced(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    m("apply", str(PROFILES / "day.yaml"))
    (gpu,) = m("plan", str(PROFILES / "balanced.yaml"), "-o", "json").json()["gpus"]
    kinds = [o["kind"] for o in gpu["operations"]]
    # keep two 1g, destroy five (CI + GI each), create 3g and 2g with a CI each
    assert gpu["kept"] == 2
    assert kinds.count("destroy_ci") == 5 and kinds.count("destroy_gi") == 5
    assert kinds.count("create_gi") == 2 and kinds.count("create_ci") == 2
    assert kinds.index("create_gi") > max(i for i, k in enumerate(kinds) if k.startswith("destroy"))
    r = m("apply", str(PROFILES / "balanced.yaml"), "-o", "json")
    assert r.code == 0 and r.json()["results"][0]["operations"] == 14


def test_only_changed_gpus_are_touched_and_only_mode_changes_reset(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "dgx-a100")
    prof = tmp_path / "one.yaml"
    prof.write_text("apiVersion: migd/v1\nkind: Profile\nname: one\ngpus:\n  - select: {index: [2]}\n"
                    "    instances: [{profile: 7g}]\n")
    r = m("apply", str(prof), "-o", "json")
    assert r.code == 0
    doc = r.json()
    assert [g["index"] for g in doc["gpus"]] == [2]
    assert [o["kind"] for o in doc["gpus"][0]["operations"]] == ["set_mig", "reset", "create_gi", "create_ci"]
    status = m("status", "-o", "json").json()
    assert [g["mig"]["current"] for g in status["gpus"]] == [False, False, True, False, False, False, False, False]
    # already in MIG mode: a layout change needs no mode change and no reset
    prof.write_text(prof.read_text().replace("7g", "3g"))
    kinds = [o["kind"] for o in m("plan", str(prof), "-o", "json").json()["gpus"][0]["operations"]]
    assert "reset" not in kinds and "set_mig" not in kinds


def test_invalid_input_changes_nothing(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    m("apply", str(PROFILES / "day.yaml"))
    before = m.state.read_bytes()
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: migd/v1\nkind: Profile\nname: bad\ngpus:\n  - select: all\n"
                   "    instances: [{profile: 3g, count: 2}, {profile: 1g}]\n")
    r = m("apply", str(bad))
    assert r.code == 2
    assert "bad.yaml" in r.err and "needs 9 memory slices" in r.err
    bad.write_text("apiVersion: migd/v1\nkind: Profile\nname: bad\ngpus:\n  - select: all\n    instancez: []\n")
    r = m("apply", str(bad))
    assert r.code == 2 and "bad.yaml:6:5: gpus[0].instancez: unknown key" in r.err
    assert m.state.read_bytes() == before


def _busy(m: Migctl, real_pid: int | None = None) -> tuple[StateStore, int]:
    m("apply", str(PROFILES / "day.yaml"))
    store = StateStore(m.state)
    gi = store.read().gpus[0].gis[0].id
    return store, world.start_process(store, 0, gi, 0, pid=real_pid)


@pytest.mark.integration
def test_busy_instance_blocks_apply_by_default(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "dgx-h100")
    store, pid = _busy(m)
    before = m.layout()
    r = m("apply", str(PROFILES / "night.yaml"))
    assert r.code == 3
    assert f"pids {pid}" in r.err and "--on-busy" in r.err
    assert m.layout() == before  # no GPU changed, not even the idle ones
    r = m("apply", str(PROFILES / "night.yaml"), "--on-busy", "wait", "--busy-timeout", "1s")
    assert r.code == 3 and "still busy after 1s" in r.err
    # a profile that keeps the busy instance applies without touching it
    keep = tmp_path / "keep.yaml"
    keep.write_text("apiVersion: migd/v1\nkind: Profile\nname: keep\ngpus:\n  - select: all\n"
                    "    instances: [{profile: 1g, count: 3}, {profile: 3g}]\n")
    assert m("apply", str(keep)).code == 0
    assert any(p.pid == pid for p in store.read().gpus[0].processes)


@pytest.mark.integration
def test_on_busy_wait_proceeds_when_work_ends(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    store, pid = _busy(m)
    threading.Timer(1.0, world.stop_process, (store, pid)).start()
    t0 = time.monotonic()
    r = m("apply", str(PROFILES / "night.yaml"), "--on-busy", "wait", "--busy-timeout", "30s")
    assert r.code == 0, r.err
    assert time.monotonic() - t0 >= 1.0


@pytest.mark.integration
def test_on_busy_force_stops_the_processes(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    proc = subprocess.Popen(["sleep", "300"])
    try:
        _busy(m, real_pid=proc.pid)
        r = m("apply", str(PROFILES / "night.yaml"), "--on-busy", "force")
        assert r.code == 0, r.err
        assert proc.wait(timeout=10) == -15  # SIGTERM, not silently SIGKILL
    finally:
        proc.kill()
    assert m.layout() == [[("7g.80gb", 0, ["7g.80gb"])]]


def test_hardware_error_exit_code(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    m("apply", str(PROFILES / "day.yaml"))
    world.set_lost(StateStore(m.state), 0)
    r = m("apply", str(PROFILES / "night.yaml"))  # its only GPU is lost: nothing to serve
    assert r.code == 4 and "GPU 0: LOST" in r.out and "GPU_IS_LOST" in r.out


def test_lock_prevents_two_applies(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    with ApplyLock(m.state_dir / "apply.lock"):
        r = m("apply", str(PROFILES / "day.yaml"))
    assert r.code == 1 and "another apply is in progress" in r.err
    assert m("apply", str(PROFILES / "day.yaml")).code == 0


@pytest.mark.integration
def test_hooks_run_without_shell_and_can_refuse(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    log = tmp_path / "hooks.log"
    script = tmp_path / "hook.py"
    script.write_text(f"import os, sys\nopen({str(log)!r}, 'a').write(os.environ['MIGD_HOOK_PHASE'] + ' ' + "
                      "os.environ['MIGD_PROFILE'] + ' ' + ' '.join(sys.argv[1:]) + '\\n')\n")
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text("hooks:\n" + "".join(
        f"  {ph}:\n    - command: [{sys.executable}, {script}, '$HOME;', '*']\n"
        for ph in ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")))
    assert m("apply", str(PROFILES / "day.yaml"), "--hooks", str(hooks)).code == 0
    lines = log.read_text().splitlines()
    assert lines == [f"{ph} day $HOME; *" for ph in ("apply-start", "pre-apply-mode", "pre-apply-config",
                                                       "apply-exit")]
    before = m.layout()
    hooks.write_text(f"hooks:\n  pre-apply-config:\n    - command: [{sys.executable}, -c, 'raise SystemExit(3)']\n"
                     "      timeout: 5s\n")
    r = m("apply", str(PROFILES / "night.yaml"), "--hooks", str(hooks))
    assert r.code == 1 and "pre-apply-config" in r.err and "exited 3" in r.err
    assert m.layout() == before
    assert not (m.state_dir / "journal.json").exists()


@pytest.mark.parametrize("transition", [("day", "night"), ("night", "day"), ("balanced", "day")])
@pytest.mark.integration
def test_rollback_after_nvml_failure_at_every_step(tmp_path: Path, transition: tuple[str, str]) -> None:
    old, new = transition
    m = Migctl(tmp_path, "single-h100")
    m("apply", str(PROFILES / f"{old}.yaml"))
    before = m.layout()
    steps = len(m("plan", str(PROFILES / f"{new}.yaml"), "-o", "json").json()["gpus"][0]["operations"])
    assert steps > 2
    store = StateStore(m.state)
    for k in range(1, steps + 1):
        world.fail_call(store, "*mutation*", 999, nth=k)  # NVML_ERROR_UNKNOWN on the k-th mutation
        r = m("apply", str(PROFILES / f"{new}.yaml"), "-o", "json")
        assert r.code == 1, (k, r.err)
        (res,) = r.json()["results"]
        assert res["status"] == "rolled_back" and "NVML_ERROR_UNKNOWN" in res["error"]
        assert m.layout() == before, k
        assert not (m.state_dir / "journal.json").exists()
        assert m("assert", str(PROFILES / f"{old}.yaml")).code == 0
    assert m("apply", str(PROFILES / f"{new}.yaml")).code == 0


def test_failed_rollback_is_reported_and_recovered(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    m("apply", str(PROFILES / "day.yaml"))
    before = m.layout()
    store = StateStore(m.state)
    world.fail_call(store, "*mutation*", 999, nth=3)   # the apply fails ...
    world.fail_call(store, "*mutation*", 999, nth=4)   # ... and so does the rollback's second step
    r = m("apply", str(PROFILES / "night.yaml"))
    assert r.code == 4 and "ROLLBACK FAILED" in r.out
    journal = json.loads((m.state_dir / "journal.json").read_text())
    assert list(journal["gpus"].values())[0]["status"] == "failed"
    r = m("recover")
    assert r.code == 0 and r.out == "restored GPU 0 to the layout before the interrupted apply\n"
    assert m.layout() == before


def test_state_files_carry_their_schema(tmp_path: Path) -> None:
    """Like mig-parted's api/checkpoint/v1: a journal from a newer migd is refused by name, never
    half-read; an owners file written before versions existed still reads."""
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0

    def owners_shown() -> list[str | None]:
        return [i["owner"] for g in m("status", "-o", "json").json()["gpus"] for i in g["instances"]]
    shown = owners_shown()
    owners = json.loads((m.state_dir / "owners.json").read_text())
    assert owners["schema"] == "migd.owners/v1" and any(shown)
    (m.state_dir / "owners.json").write_text(json.dumps(owners["gpus"]))  # the unversioned layout
    assert owners_shown() == shown
    Journal(m.state_dir / "probe.json").begin("day", {})
    assert json.loads((m.state_dir / "probe.json").read_text())["schema"] == "migd.journal/v1"
    (m.state_dir / "journal.json").write_text(json.dumps({"schema": "migd.journal/v2", "gpus": {}}))
    r = m("recover")
    assert r.code == 2 and "journal.json: schema: expected 'migd.journal/v1', not 'migd.journal/v2'" in r.err, r.err


@pytest.mark.integration
def test_crash_mid_apply_is_recovered(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    m("apply", str(PROFILES / "day.yaml"))
    before = m.layout()
    world.crash_after_mutations(StateStore(m.state), 5)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.run([*MIGCTL, "--sim", "single-a100", "--sim-state", str(m.state),
                        "--state-dir", str(m.state_dir), "apply", str(PROFILES / "night.yaml")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == -9
    assert m.layout() != before  # half-way
    assert (m.state_dir / "journal.json").exists()
    r = m("recover")
    assert r.code == 0 and r.out == "restored GPU 0 to the layout before the interrupted apply\n"
    assert m.layout() == before
    assert m("recover").out.startswith("no interrupted apply")


@pytest.mark.parametrize("fleet", CATALOG_FLEETS)
@pytest.mark.integration
def test_mig_parted_all_balanced_applies_on_every_fleet(tmp_path: Path, fleet: str) -> None:
    path = REFERENCE / "mig-parted-config-default.yaml"
    m = Migctl(tmp_path, fleet)
    r = m("apply", str(path), "--config", "all-balanced")
    assert r.code == 0, r.err
    assert m("assert", str(path), "--config", "all-balanced").code == 0
    counts = {tuple(sorted(p for p, _, _ in g)) for g in m.layout()}
    assert all(len(c) in (3, 4) for c in counts)  # 2x1g + 2g (+ 3g on 7-slice boards)
    r = m("apply", str(path), "--config", "all-disabled")
    assert r.code == 0 and all(not g["mig"]["current"] for g in m("status", "-o", "json").json()["gpus"])


@pytest.mark.integration
def test_cli_entry_point_and_validate_exit_codes(tmp_path: Path) -> None:
    ok = subprocess.run(["migctl", "validate", str(PROFILES / "day.yaml")], capture_output=True, text=True)
    assert ok.returncode == 0 and "ok" in ok.stdout
    bad = tmp_path / "b.yaml"
    bad.write_text("apiVersion: migd/v2\nkind: Profile\nname: x\ngpus: []\n")
    r = subprocess.run(["migctl", "validate", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "b.yaml:1:13: apiVersion: 'migd/v2' is not allowed" in r.stderr
    assert stat.S_ISREG(os.stat(bad).st_mode)


@pytest.mark.integration
def test_hooks_apply_locally_beside_a_stale_control_socket(tmp_path: Path) -> None:
    """--hooks is refused only when a migd answers; a socket file left by a dead daemon is no daemon."""
    import socket
    m = Migctl(tmp_path, "single-a100")
    m("status")
    m.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(m.state_dir / "world.sock"))
    stale.close()  # the file stays, nobody listens
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text("hooks:\n  apply-start:\n    - {command: [/bin/true], timeout: 10s}\n")
    os.chmod(hooks, 0o644)
    r = m("apply", str(PROFILES / "day.yaml"), "--hooks", str(hooks))
    assert r.code == 0, r.err


def test_assert_on_a_mig_parted_file_covers_the_whole_node(tmp_path: Path) -> None:
    """mig-parted's assert fails unless every GPU is matched (assert/config.go: CountTrue(matched) !=
    len(deviceIDs)); a migd profile leaves unselected GPUs alone, so its assert looks at its own."""
    m = Migctl(tmp_path, "dgx-a100")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: v1\nmig-configs:\n  first:\n    - devices: [0]\n      mig-enabled: false\n")
    mine = tmp_path / "p.yaml"
    mine.write_text("apiVersion: migd/v1\nkind: Profile\nname: first\ngpus:\n  - select: {index: 0}\n"
                    "    mig: disabled\n")
    r = m("assert", str(cfg), "--config", "first")
    assert r.code == 1 and "GPU 7: matched by no entry of first" in r.out, r.out
    assert m("assert", str(mine)).code == 0


@pytest.mark.integration
def test_a_profile_from_standard_input(tmp_path: Path) -> None:
    """``-`` reads the profile from stdin (as mig-parted's ``-f -``); errors name <stdin> and the line."""
    m = Migctl(tmp_path, "single-a100")
    argv = [*MIGCTL, "--sim", "single-a100", "--sim-state", str(m.state), "--state-dir",
            str(m.state_dir)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.run([*argv, "apply", "-"], input=(PROFILES / "day.yaml").read_text(), capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 0 and "day: applied" in p.stdout, p.stderr
    p = subprocess.run([*argv, "plan", "-"], input="gpus: [\n", capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: <stdin>:") and "Traceback" not in p.stderr
    assert m("assert", str(PROFILES / "day.yaml")).code == 0


def test_mode_only_changes_the_mig_mode_and_nothing_else(tmp_path: Path) -> None:
    """mig-parted's --mode-only: apply and assert look at the MIG mode alone."""
    m = Migctl(tmp_path, "dgx-a100")
    assert m("assert", str(PROFILES / "night.yaml"), "--mode-only").code == 1  # MIG is off
    r = m("apply", str(PROFILES / "night.yaml"), "--mode-only")
    assert r.code == 0, r.err
    assert all(g == [] for g in m.layout())  # MIG on, no instance created
    assert m("assert", str(PROFILES / "night.yaml"), "--mode-only").code == 0
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    before = m.layout()
    plan = m("plan", str(PROFILES / "night.yaml"), "--mode-only", "-o", "json").json()
    assert not any(g["changes"] for g in plan["gpus"])  # instances of another profile are kept
    assert m("apply", str(PROFILES / "night.yaml"), "--mode-only").code == 0 and m.layout() == before
    assert m("assert", str(PROFILES / "night.yaml"), "--mode-only").code == 0
    assert m("assert", str(PROFILES / "night.yaml")).code == 1


def test_export_as_a_mig_parted_config_round_trips(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "mixed")
    assert m("apply", str(PROFILES / "balanced.yaml")).code == 0
    r = m("export", "--format", "mig-parted", "--name", "now")
    assert r.code == 0, r.err
    doc = yaml.safe_load(r.out)
    assert doc["version"] == "v1" and set(doc["mig-configs"]) == {"now"}
    cfg = tmp_path / "now.yaml"
    cfg.write_text(r.out)
    assert m("assert", str(cfg), "--config", "now").code == 0  # the whole node, as mig-parted asserts
    assert m("apply", str(PROFILES / "night.yaml")).code == 0
    assert m("assert", str(cfg), "--config", "now").code == 1
    assert m("apply", str(cfg), "--config", "now").code == 0 and m("assert", str(cfg), "--config", "now").code == 0


@pytest.mark.integration
def test_mig_parted_hooks_files_are_accepted(tmp_path: Path) -> None:
    """mig-parted's hooks format (deployments/systemd/hooks-default.yaml; api/hooks/v1/hooks.go):
    version v1, a command string, args, envs and workdir; MIG_PARTED_SELECTED_CONFIG is set as
    mig-parted sets it for its hooks.sh."""
    m = Migctl(tmp_path, "single-a100")
    log = tmp_path / "hooks.log"
    hooks = tmp_path / "hooks-default.yaml"
    hooks.write_text(
        "version: v1\nhooks:\n" + "".join(
            f"    {ph}:\n    - workdir: \"{tmp_path}\"\n      command: \"/bin/sh\"\n"
            f"      args: [\"-c\", \"echo {ph} $MIG_PARTED_SELECTED_CONFIG $MY_VAR $(pwd) >> {log}\"]\n"
            "      envs: {MY_VAR: from-envs}\n"
            for ph in ("apply-start", "apply-exit")))
    assert m("apply", str(PROFILES / "day.yaml"), "--hooks", str(hooks)).code == 0
    assert log.read_text().splitlines() == [f"{ph} day from-envs {tmp_path}" for ph in ("apply-start", "apply-exit")]


def test_an_owner_only_change_says_what_it_changes(tmp_path: Path) -> None:
    """mig-parted's all-1g.10gb, then day (the same instances, owned by notebooks): assert says day is not
    applied, and the plan, the dry run and the apply each say the owners change and nothing else does, in
    the count and on the GPU's line alike; the apply after it finds nothing to do."""
    m = Migctl(tmp_path, "dgx-h100")
    assert m("apply", "-f", str(REFERENCE / "mig-parted-config-default.yaml"), "-c", "all-1g.10gb").code == 0
    line = "GPU 0-7 (H100-SXM5-80GB): 7x1g.10gb: an owner change to notebooks (instances kept, no MIG operation)\n"
    plan = m("plan", str(PROFILES / "day.yaml"))
    assert plan.out == "day: 8 GPU(s) to change, 0 already as asked, 0 operation(s)\n" + line, plan.out
    assert [g["owners_only"] for g in m("plan", str(PROFILES / "day.yaml"), "-o", "json").json()["gpus"]] == [True] * 8
    asserted = m("assert", str(PROFILES / "day.yaml"))  # (fails exactly when an apply would change something)
    assert asserted.code == 1 and asserted.out == ("day: NOT applied (8 of 8 GPU(s) differ)\nGPU 0-7: not as in day "
                                                   "(its instances are, their owners are not; no MIG operation "
                                                   "needed)\n"), asserted.out
    assert [g.get("owners_only") for g in m("assert", str(PROFILES / "day.yaml"), "-o", "json").json()["gpus"]] == \
        [True] * 8
    dry = m("apply", "--dry-run", str(PROFILES / "day.yaml"))
    assert dry.out.endswith("8 GPU(s) to change, 0 already as asked, 0 operation(s)\n" + line), dry.out
    done = m("apply", str(PROFILES / "day.yaml"))
    assert done.code == 0 and "; 8 GPU(s) changed, 0 already as asked\n" + line in done.out, done.out
    again = m("apply", str(PROFILES / "day.yaml"), "-o", "json")
    assert all("owners_only" not in g for g in again.json()["gpus"]), again.out
    assert m("apply", str(PROFILES / "day.yaml")).out.endswith("7x1g.10gb: already applied\n")
    assert m("assert", str(PROFILES / "day.yaml")).code == 0
    parted = m("assert", "-f", str(REFERENCE / "mig-parted-config-default.yaml"), "-c", "all-1g.10gb")
    assert parted.code == 0, parted.out  # a mig-parted file names no owners: its layout is asserted, as mig-parted does


def test_an_owner_change_held_back_by_a_busy_instance_is_marked_as_one(tmp_path: Path) -> None:
    """day, then the same instances for training while a process runs on GPU 0: the refusal's JSON marks
    every GPU as an owner change (not as already as asked); with the other GPUs let go ahead (partial,
    as the daemon applies), GPU 0 is blocked and the others' owners change, each said on its line."""
    from migd.apply.executor import Applier
    from migd.apply.result import ApplyOptions, GpuStatus
    from migd.ctl.text import apply_table
    from migd.profiles.loader import load_profile
    from migd.report import apply_doc
    from migd.sim.backend import sim_backend

    m = Migctl(tmp_path, "dgx-h100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    training = tmp_path / "dayt.yaml"
    training.write_text((PROFILES / "day.yaml").read_text().replace("owner: notebooks", "owner: training")
                        .replace("name: day", "name: dayt"))
    store = StateStore(m.state)
    world.start_process(store, 0, store.read().gpus[0].gis[0].id, 0)
    refused = m("apply", str(training), "-o", "json")
    doc = refused.json()
    assert refused.code == 3 and "its owners change" in doc["error"], refused.out
    assert [g.get("owners_only") for g in doc["gpus"]] == [True] * 8 and doc["results"] == []
    backend = sim_backend(m.state, "dgx-h100")
    try:
        result = Applier(backend, m.state_dir).apply(load_profile(training), ApplyOptions(partial=True))
    finally:
        backend.close()
    assert [r.status for r in result.results] == [GpuStatus.BLOCKED] + [GpuStatus.APPLIED] * 7
    table = apply_table(apply_doc(result, False))
    assert "; 7 GPU(s) changed, 0 already as asked\nGPU 0 blocked: GPU 0: its owners change" in table, table
    assert table.endswith("GPU 0-7 (H100-SXM5-80GB): 7x1g.10gb: an owner change to training (instances kept, no MIG "
                          "operation)\n"), table


def test_an_owner_change_a_wait_replans_away_still_has_its_result(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """While an owner change waits for a busy instance, another hand changes the GPU and the wait's replan
    drops it: the apply still accounts for it (blocked, saying why), never a GPU without a result."""
    from migd.apply.executor import Applier
    from migd.apply.result import ApplyOptions, GpuStatus, OnBusy
    from migd.profiles.loader import load_profile
    from migd.sim.backend import sim_backend

    m = Migctl(tmp_path, "single-h100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    training = tmp_path / "dayt.yaml"
    training.write_text((PROFILES / "day.yaml").read_text().replace("owner: notebooks", "owner: training"))
    store = StateStore(m.state)
    world.start_process(store, 0, store.read().gpus[0].gis[0].id, 0)
    monkeypatch.setattr(Applier, "_replan", lambda self, profile, opts, plans: [])
    backend = sim_backend(m.state, "single-h100")
    try:
        result = Applier(backend, m.state_dir).apply(load_profile(training), ApplyOptions(
            on_busy=OnBusy.WAIT, busy_timeout_s=30, poll_s=0.01, partial=True))
    finally:
        backend.close()
    assert [(r.index, r.status) for r in result.results] == [(0, GpuStatus.BLOCKED)], result.results
    assert "changed while its owner change waited" in (result.results[0].error or "")
