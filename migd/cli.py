"""``migctl``: apply, plan, check and inspect MIG layouts by hand (exit codes: ``migd.exits``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from migd import __version__, paths
from migd.apply.executor import Applier
from migd.apply.hooks import Hooks, parse_hooks
from migd.apply.result import ApplyOptions, GpuStatus, OnBusy
from migd.cliargs import Parser
from migd.doctor import diagnose
from migd.exits import EXPECTED, Exit, failure, for_result
from migd.hardware.backend import GpuBackend
from migd.profiles.export import export_mig_parted, export_profile
from migd.profiles.loader import load_profile
from migd.profiles.model import Profile
from migd.profiles.validate import check_file
from migd.report import (
    apply_doc,
    apply_table,
    daemon_table,
    doctor_doc,
    doctor_table,
    dump,
    plan_doc,
    plan_table,
    status_doc,
    status_table,
)
from migd.sim.fleets import FLEETS
from migd.yamlsrc import ValidationError, load, parse_duration


def control_socket(args: argparse.Namespace) -> Path:
    return paths.control_socket(args.control_socket, args.sim, args.sim_state, args.state_dir)


def open_backend(args: argparse.Namespace) -> tuple[GpuBackend, Path]:
    """The NVML backend over real NVML, or over the simulator with --sim."""
    if args.sim:
        from migd.sim import sim_backend
        state, state_dir = paths.sim_paths(args.sim, args.sim_state, args.state_dir)
        return sim_backend(state, args.sim), state_dir
    from migd.hardware.nvml import NvmlBackend
    return NvmlBackend(), paths.state_dir(args.state_dir)


def _out(args: argparse.Namespace, doc: dict[str, Any], table: str) -> None:
    sys.stdout.write(table if args.output == "table" else dump(doc, args.output))


def cmd_status(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    doc = status_doc(backend, Applier(backend, state_dir).owners.load())
    _out(args, doc, status_table(doc))
    return Exit.OK


def cmd_plan(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    profile = _profile(args)
    doc = plan_doc(profile.name, Applier(backend, state_dir).plan(profile, args.mode_only))
    _out(args, doc, plan_table(doc))
    return Exit.OK


def cmd_assert(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    profile = _profile(args)
    plans = Applier(backend, state_dir).plan(profile, args.mode_only)
    pending = [p for p in plans if p.changes]
    for p in pending:
        print(f"GPU {p.gpu.index}: not as in {profile.name} ({len(p.ops)} operation(s) needed)", file=sys.stderr)
    unmatched: list[int] = []
    if profile.kind == "mig-parted":  # mig-parted asserts the whole node: every GPU must be matched
        planned = {p.gpu.index for p in plans}  # (cmd/nvidia-mig-parted/assert/config.go, CountTrue(matched))
        unmatched = [i for i in range(backend.gpu_count()) if i not in planned]
        for i in unmatched:
            print(f"GPU {i}: matched by no entry of {profile.name} (a mig-parted assert covers every GPU)",
                  file=sys.stderr)
    if not pending and not unmatched:
        print(f"{profile.name}: applied on {len(plans)} GPU(s)")
    return Exit.NOT_APPLIED if pending or unmatched else Exit.OK


def _hooks(path: str | None) -> Hooks:
    if not path:
        return Hooks()
    strict = os.geteuid() == 0  # StrictModes: root runs only hooks that nobody else can rewrite
    doc = load(path, strict=strict, what="hooks file").mapping(allowed=["version", "hooks"], required=["hooks"])
    if "version" in doc:  # mig-parted's hooks file (api/hooks/v1)
        doc["version"].str(choices=["v1"])
    return parse_hooks(doc["hooks"], strict)


def _stdin(args: argparse.Namespace) -> str | None:
    """The profile's text when FILE is ``-`` (read once: the daemon path and a local fallback share it)."""
    if args.file != "-":
        return None
    if getattr(args, "stdin_text", None) is None:
        args.stdin_text = sys.stdin.read()
    return str(args.stdin_text)


def _profile(args: argparse.Namespace, strict: bool = False) -> Profile:
    """FILE, or standard input for ``-`` (StrictModes applies to files: a pipe is the caller's own)."""
    text = _stdin(args)
    return load_profile("<stdin>" if text is not None else args.file, args.config, text=text, strict=strict)


def apply_via_daemon(args: argparse.Namespace) -> int | None:
    """Hand the apply to a running migd, so the daemon and the CLI never race.  None: no daemon."""
    from migd.daemon.control import listening, request
    path = "<stdin>" if args.file == "-" else str(Path(args.file).resolve())
    sock = control_socket(args)
    if args.hooks and listening(sock):
        raise ValidationError(args.hooks, None, None, "--hooks", "a running migd runs the hooks of its own "
                              "configuration, not a client's; add --local to apply in this process with these hooks")
    reply = request(sock, {"cmd": "apply", "file": path, "text": _stdin(args), "config": args.config,
                           "on_busy": args.on_busy,
                           "dry_run": args.dry_run, "busy_timeout_s": parse_duration(args.busy_timeout),
                           "lock_timeout_s": args.lock_timeout, "parallel": not args.sequential,
                           "mode_only": args.mode_only})
    if reply is None:
        return None
    if "result" in reply:
        _out(args, reply["result"], apply_table(reply["result"], by="migd"))
    else:
        print(f"error (from migd): {reply.get('error')}", file=sys.stderr)
    return int(reply.get("exit", 1))


@contextlib.contextmanager
def _interruptible(cancel: threading.Event) -> Iterator[None]:
    """Ctrl-C or SIGTERM during an apply stops at the next step and rolls back the GPU being changed,
    as migd does on SIGTERM; a second Ctrl-C interrupts at once (the journal is kept for recover)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def first(signum: int, frame: object) -> None:
        print("stopping: the GPU step in progress is rolled back (Ctrl-C again to interrupt at once)",
              file=sys.stderr)
        cancel.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    old = {s: signal.signal(s, first) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def cmd_apply(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    if not args.local:
        via = apply_via_daemon(args)
        if via is not None:
            return via
    # StrictModes: root applies only files that nobody else can rewrite
    profile = _profile(args, strict=os.geteuid() == 0)
    opts = ApplyOptions(on_busy=OnBusy(args.on_busy), busy_timeout_s=parse_duration(args.busy_timeout),
                        dry_run=args.dry_run, hooks=_hooks(args.hooks), lock_timeout_s=args.lock_timeout,
                        parallel=not args.sequential, mode_only=args.mode_only)
    opts.cancel = threading.Event()
    with _interruptible(opts.cancel):
        result = Applier(backend, state_dir).apply(profile, opts)
    doc = apply_doc(result, args.dry_run)
    _out(args, doc, apply_table(doc))
    return for_result(result)


def cmd_recover(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    applier = Applier(backend, state_dir)
    if args.discard:
        return _discard(applier, args.yes)
    results = applier.recover()
    if not results:
        print("no interrupted apply to recover")
    for r in results:
        print(f"GPU {r.index}: {r.status.replace('_', ' ')}" + (f": {r.error}" if r.status == "failed" else ""))
    return Exit.HARDWARE if any(r.status is GpuStatus.FAILED for r in results) else Exit.OK


def _discard(applier: Applier, yes: bool) -> int:
    """Set a journal aside that cannot be used (damaged, or naming a GPU that is gone) once an
    operator has checked the GPUs: asked for on a terminal, or --yes."""
    path = applier.journal.path
    if not applier.journal.exists():
        print("no journal to discard")
        return Exit.OK
    if not yes:
        if not sys.stdin.isatty():
            print(f"not discarded: add --yes to set {path} aside (check the GPUs with `migctl status` first)",
                  file=sys.stderr)
            return Exit.NOT_APPLIED
        answer = input(f"set {path} aside? The layouts it records will not be restored [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return Exit.NOT_APPLIED
    with applier.lock():
        kept = applier.journal.discard()
    print(f"journal set aside as {kept}")
    return Exit.OK


def cmd_isolation(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    from migd.daemon.control import request
    from migd.isolation.audit import Severity, audit
    from migd.isolation.probe import run_probe
    plans = {p.gpu.index: p for p in Applier(backend, state_dir).plan(load_profile(args.profile))} \
        if args.profile else None
    findings = audit(backend, plans)
    daemon = request(control_socket(args), {"cmd": "isolation"}, timeout_s=10)
    doc: dict[str, Any] = {"schema": "migd.isolation/v1", "findings": [f.to_json() for f in findings],
                           "daemon": None if daemon is None else {k: daemon[k] for k in ("unhealthy", "breaches")}}
    if args.probe:
        doc["probe"] = run_probe(backend)
    lines = [f"{f.severity.upper():7} {f.check:10} {f.message}" for f in findings] or ["audit: no findings"]
    if daemon is not None:
        lines += [f"UNHEALTHY {u}: {r}" for u, r in daemon["unhealthy"].items()]
        lines += [f"BREACH  {b}" for b in daemon["breaches"]]
    if args.probe:
        lines.append(f"probe: {doc['probe']['status']}: {doc['probe']['detail']}")
    _out(args, doc, "\n".join(lines) + "\n")
    faults = bool(daemon and (daemon["unhealthy"] or daemon["breaches"]))
    bad = any(f.severity is Severity.ERROR for f in findings) or faults
    return Exit.NOT_APPLIED if bad else Exit.OK


def cmd_clear_fault(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    from migd.daemon.control import request
    reply = request(control_socket(args), {"cmd": "clear-fault", "gpu": args.gpu}, timeout_s=10)
    if reply is None:
        print("not applied: migd is not running (fault marks live in the daemon)", file=sys.stderr)
        return Exit.NOT_APPLIED
    print(f"cleared: {', '.join(reply['cleared']) or 'nothing (no fault mark on that GPU)'}")
    return int(reply["exit"])


def cmd_validate(args: argparse.Namespace) -> int:
    """Every config of every file is checked, each error reported (not only the first)."""
    code = Exit.OK
    gpus = args.gpus if args.gpus is not None else (len(FLEETS[args.sim]) if args.sim in FLEETS else None)
    caveats: dict[str, list[str]] = {}
    for f in args.files:
        try:
            check = check_file(f, gpus)
        except ValidationError as e:
            print(f"error: {e}", file=sys.stderr)
            code = Exit.INVALID
            continue
        for name, sections in check.configs:
            if isinstance(sections, ValidationError):
                print(f"error: {sections}", file=sys.stderr)
                code = Exit.INVALID
                continue
            models = sorted({m for ms in sections.values() for m in ms})
            print(f"{f}: {name}: ok ({', '.join(models) or _NO_MODEL})")
        for w in check.warnings:
            print(f"warning: {w}", file=sys.stderr)
        for key, notes in check.caveats.items():
            caveats.setdefault(key, []).extend(n for n in notes if n not in caveats.get(key, []))
    _note_caveats(caveats, args.verbose)
    return code


_NO_MODEL = "no catalog model offers its profiles: the GPU's own table decides at apply time"


def _note_caveats(caveats: dict[str, list[str]], verbose: bool) -> None:
    """Unconfirmed catalog facts stay visible: one note for all files, or one line per model with -v."""
    if not caveats:
        return
    if not verbose:
        print(f"note: on {len(caveats)} model(s) these layouts rely on unconfirmed catalog facts; the GPU's live "
              "table decides at apply time (-v lists them)", file=sys.stderr)
        return
    for key, notes in sorted(caveats.items()):
        print(f"note: on {key} these layouts rely on unconfirmed catalog facts (the GPU's live table decides): "
              f"{'; '.join(notes)}", file=sys.stderr)


def _daemon_request(args: argparse.Namespace, req: dict[str, Any]) -> dict[str, Any]:
    from migd.daemon.control import request
    sock = control_socket(args)
    reply = request(sock, req, timeout_s=30.0)
    if reply is None:
        raise ConnectionError(f"no migd is listening on {sock}")
    return reply


def cmd_daemon(args: argparse.Namespace) -> int:
    """The running daemon's state (migd.daemon/v1), from its control socket."""
    doc = _daemon_request(args, {"cmd": "status"})["daemon"]
    _out(args, doc, daemon_table(doc))
    return Exit.OK


def cmd_reload(args: argparse.Namespace) -> int:
    """Ask migd to reload its configuration and profiles (like SIGHUP)."""
    reply = _daemon_request(args, {"cmd": "reload"})
    print("migd is reloading its configuration; `migctl daemon` shows whether it was accepted")
    return Exit.OK if reply.get("ok") else Exit.NOT_APPLIED


def cmd_export(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    doc = export_mig_parted(backend, args.name) if args.format == "mig-parted" else \
        export_profile(backend, Applier(backend, state_dir).owners.load(), args.name)
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.output == "json" else
                     yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))
    return Exit.OK


def cmd_doctor(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    """Read-only: compare the driver's view of every GPU with the catalog (exit 1 on a difference)."""
    doc = doctor_doc(diagnose(backend))
    _out(args, doc, doctor_table(doc))
    return Exit.OK if doc["ok"] else Exit.NOT_APPLIED


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="migctl", description="Manage NVIDIA MIG partitions.")
    p.add_argument("--version", action="version", version=f"migctl {__version__}")
    p.add_argument("--sim", metavar="FLEET", default=os.environ.get("MIGD_SIM"),
                   help="run against the simulator (dgx-a100, dgx-a100-40gb, dgx-h100, hgx-h200, mixed, ...)")
    p.add_argument("--sim-state", metavar="PATH", default=os.environ.get("MIGD_SIM_STATE"),
                   help="simulator state file (shared with migd and the fake nvidia-smi)")
    p.add_argument("--state-dir", metavar="DIR", default=os.environ.get("MIGD_STATE_DIR"),
                   help=f"journal, lock and owner labels (default {paths.DEFAULT_STATE_DIR})")
    p.add_argument("--control-socket", metavar="PATH", default=os.environ.get("MIGD_CONTROL_SOCKET"),
                   help=f"migd's control socket (default {paths.DEFAULT_SOCKET})")
    p.add_argument("-v", "--verbose", action="store_true", help="log each step (INFO) to stderr")
    sub = p.add_subparsers(dest="command", required=True)

    def fmt(sp: argparse.ArgumentParser, choices: Sequence[str] = ("table", "json", "yaml")) -> None:
        sp.add_argument("-o", "--output", choices=choices, default=choices[0],
                        help=f"output format (default {choices[0]}; json/yaml follow the documented schema)")

    sp = sub.add_parser("status", help="GPUs, MIG mode, instances, owners, MIG UUIDs, processes")
    fmt(sp)
    for name, hlp in (("plan", "show the operations an apply would run"), ("assert", "exit 0 if applied"),
                      ("apply", "apply a profile")):
        sp = sub.add_parser(name, help=hlp)
        sp.add_argument("file", help="a migd profile or a mig-parted config file (- reads standard input)")
        sp.add_argument("--config", help="config name in a mig-parted file")
        sp.add_argument("--mode-only", action="store_true",
                        help="only the MIG mode (enabled/disabled), as mig-parted's --mode-only; instances stay")
        fmt(sp)
        if name == "apply":
            sp.add_argument("--dry-run", action="store_true", help="plan and show what would change; change nothing")
            sp.add_argument("--on-busy", choices=list(OnBusy), default=OnBusy.REFUSE.value,
                            help="instances with running processes that would be destroyed: refuse (default), "
                            "wait for them to end, or force (SIGTERM, then SIGKILL)")
            sp.add_argument("--busy-timeout", default="5m", help="with --on-busy wait (default 5m)")
            sp.add_argument("--hooks", help="YAML file with a hooks: mapping (phases as in mig-parted)")
            sp.add_argument("--lock-timeout", type=float, default=0.0, help="seconds to wait for another apply")
            sp.add_argument("--sequential", action="store_true", help="change GPUs one at a time")
            sp.add_argument("--local", action="store_true",
                            help="apply in this process even if migd is running (it still takes the lock)")
    sp = sub.add_parser("recover", help="restore GPUs left half-way by an interrupted apply")
    sp.add_argument("--discard", action="store_true",
                    help="set aside a journal that cannot be used (damaged, or naming a GPU that is gone)")
    sp.add_argument("--yes", action="store_true", help="with --discard: do not ask")
    sp = sub.add_parser("isolation", help="fault-isolation audit (and the daemon's fault marks and breaches)")
    sp.add_argument("--profile", help="also report instances missing from / not in this profile")
    sp.add_argument("--probe", action="store_true", help="run a tiny CUDA workload in each instance")
    fmt(sp)
    sp = sub.add_parser("clear-fault", help="clear a GPU-wide fault mark so the GPU may be reconfigured")
    sp.add_argument("gpu", help="GPU index or UUID")
    sp = sub.add_parser("validate", help="check profile files offline")
    sp.add_argument("files", nargs="+", help="profile or mig-parted files")
    sp.add_argument("--gpus", type=int, metavar="N", help="the node has N GPUs: an index selector beyond N-1 is an "
                    "error (default: the --sim fleet's size; otherwise indexes no board has are warned about)")
    sp.add_argument("-v", "--verbose", action="store_true",
                    help="name, per GPU model, the unconfirmed catalog facts a valid layout relies on")
    sp = sub.add_parser("daemon", help="the running migd: active profile and why, next transition, blocked "
                        "reason, last apply")
    fmt(sp)
    sub.add_parser("reload", help="make the running migd reload its configuration and profiles")
    sp = sub.add_parser("doctor", help="read-only check of driver, GPUs, profile tables, events and GPM "
                        "against the catalog (changes nothing)")
    fmt(sp)
    sp = sub.add_parser("export", help="print the current state as a migd profile")
    sp.add_argument("--name", default="exported", help="name of the exported profile (default exported)")
    sp.add_argument("--format", choices=["migd", "mig-parted"], default="migd",
                    help="a migd profile (default; keeps placements and owners) or a mig-parted config")
    fmt(sp, ("yaml", "json"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="migctl: %(levelname)s: %(message)s")
    try:
        if args.command in ("validate", "daemon", "reload"):  # no GPU needed
            return {"validate": cmd_validate, "daemon": cmd_daemon, "reload": cmd_reload}[args.command](args)
        backend, state_dir = open_backend(args)
        try:
            handler = {"status": cmd_status, "plan": cmd_plan, "assert": cmd_assert, "apply": cmd_apply,
                       "export": cmd_export, "recover": cmd_recover, "isolation": cmd_isolation,
                       "clear-fault": cmd_clear_fault, "doctor": cmd_doctor}[args.command]
            return handler(args, backend, state_dir)
        finally:
            backend.close()
    except EXPECTED as e:
        f = failure(e)
        print(f, file=sys.stderr)
        return f.code
    except KeyboardInterrupt:
        print("interrupted: if a GPU was being changed, its journal is kept and `migctl recover` restores it",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
