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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import yaml

from migd import paths
from migd.apply.executor import Applier
from migd.apply.hooks import Hooks, parse_hooks
from migd.apply.journal import left_behind
from migd.apply.planning import touched
from migd.apply.relabel import owners_only
from migd.apply.result import ApplyOptions, BusyError, GpuStatus, OnBusy, busy_timeout_for
from migd.ctl.apply import kept_hold, refused_out
from migd.ctl.isolation import cmd_isolation, isolation_from_daemon
from migd.ctl.parser import parse
from migd.ctl.parser import parser as parser  # (tests/test_help.py reads it here)
from migd.ctl.remote import (
    apply_via_daemon,
    cmd_clear_fault,
    cmd_daemon,
    cmd_reload,
    cmd_resume,
    control_socket,
    layout_from_daemon,
    out,
    refuse_local,
)
from migd.ctl.status_out import status_out
from migd.ctl.text import (
    apply_table,
    assert_table,
    doctor_table,
    plan_table,
    unreadable_lines,
)
from migd.errors import ValidationError
from migd.exits import EXPECTED, Exit, failure, for_result, partly
from migd.hardware.doctor import UNREADABLE_CHECK, Verdict, diagnose
from migd.hardware.inventory import Unreadable
from migd.hardware.ports import GpuBackend
from migd.plan.planner import GpuPlan
from migd.printable import LineFormatter, shown
from migd.profiles.export import export_mig_parted, export_profile
from migd.profiles.loader import load_profile
from migd.profiles.model import Profile, index_ranges
from migd.profiles.validate import check_file
from migd.report import apply_doc, assert_doc, doctor_doc, plan_doc, status_doc
from migd.report import unreadable as report_unreadable
from migd.sim.fleets import FLEETS
from migd.yamlsrc import load, read, read_stream


def open_backend(args: argparse.Namespace) -> tuple[GpuBackend, Path]:
    """The NVML backend over real NVML, or over the simulator with --sim."""
    state_dir = paths.state_dir(args.state_dir, args.sim, args.sim_state)  # (checked before any GPU is read)
    if args.sim:
        from migd.sim.backend import sim_backend
        return sim_backend(paths.sim_paths(args.sim, args.sim_state, args.state_dir)[0], args.sim), state_dir
    from migd.hardware.nvml.backend import NvmlBackend
    return NvmlBackend(), state_dir


def cmd_status(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    applier = Applier(backend, state_dir)
    doc = status_doc(backend, applier.owners.load(), left_behind(applier.journal.path))
    return status_out(args, doc)


def _touched(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> \
        tuple[Profile, list[GpuPlan], list[Unreadable], frozenset[int]]:
    """The profile, its plans, the GPUs it may select that NVML cannot read (lost: left alone), and those
    whose instances stay and whose owners change (by index)."""
    profile = _profile(args)
    applier = Applier(backend, state_dir)
    plans, unreadable = applier.plan_each(profile, args.mode_only, must_select=True)
    return profile, plans, touched(profile, unreadable), owners_only(plans, applier.owners.load())


def cmd_plan(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    profile, plans, unreadable, moved = _touched(args, backend, state_dir)
    doc = plan_doc(profile.name, plans, unreadable, moved)
    out(args, doc, plan_table(doc, args.verbose))
    return partly(Exit.OK, unreadable, bool(plans))


def cmd_assert(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    profile, plans, unreadable, moved = _touched(args, backend, state_dir)
    unmatched: list[int] = []
    if profile.kind == "mig-parted":  # mig-parted asserts the whole node: every GPU must be matched
        planned = {p.gpu.index for p in plans} | {u.index for u in unreadable}  # (cmd/nvidia-mig-parted/
        unmatched = [i for i in range(backend.gpu_count()) if i not in planned]  # assert/config.go CountTrue)
        moved = frozenset()  # (and of the layout alone, as mig-parted asserts: its files name no owners)
    doc = assert_doc(profile.name, plans, unmatched, unreadable, moved)
    out(args, doc, assert_table(doc, args.verbose))
    return partly(Exit.OK, unreadable, bool(plans)) if doc.ok else Exit.NOT_APPLIED


def _hooks(path: str | None) -> Hooks:
    if not path:
        return Hooks()
    strict = os.geteuid() == 0  # StrictModes: root runs only hooks that nobody else can rewrite
    doc = load(path, strict=strict, what="hooks file").mapping(allowed=["version", "hooks"], required=["hooks"])
    if "version" in doc:  # mig-parted's hooks file (api/hooks/v1)
        doc["version"].str(choices=["v1"])
    return parse_hooks(doc["hooks"], strict)


def _text(args: argparse.Namespace, strict: bool = False) -> str:
    """The profile's text, read once by migctl as the user who runs it (the daemon path and a local
    fallback share it): migd, sandboxed (ProtectHome, PrivateTmp), is sent the text and never opens a
    user's path.  StrictModes (``strict``) applies to files: a pipe is the caller's own."""
    if getattr(args, "profile_text", None) is None:
        args.profile_text = read_stream("<stdin>", sys.stdin.buffer) if args.file == "-" else \
            read(args.file, strict, "profile")
    return str(args.profile_text)


def _profile(args: argparse.Namespace, strict: bool = False) -> Profile:
    """FILE, or standard input for ``-``; what is read but worth a look is said on stderr."""
    profile = load_profile("<stdin>" if args.file == "-" else args.file, args.config, text=_text(args, strict))
    for w in profile.warnings:
        print(shown(f"warning: {w}"), file=sys.stderr)
    return profile


@contextlib.contextmanager
def _interruptible(abort: threading.Event) -> Iterator[None]:
    """Ctrl-C or SIGTERM during an apply cancels it: it stops at the next step and puts every GPU back
    as it was; a second Ctrl-C interrupts at once (the journal is kept for `migctl recover`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def first(signum: int, frame: object) -> None:
        print("cancelling: the apply stops at the next step and puts every GPU back as it was (Ctrl-C again to "
              "interrupt at once; `migctl recover` then restores them)", file=sys.stderr)
        abort.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    old = {s: signal.signal(s, first) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def cmd_apply(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    if args.force_local:
        args.local = True
    if not args.local:
        via = apply_via_daemon(args, _text(args, strict=os.geteuid() == 0),
                               refused=lambda why: refused_out(args, backend, state_dir, None, why))
        if via is not None:
            return via
    else:
        refuse_local(args)
    # StrictModes: root applies only files that nobody else can rewrite
    profile = _profile(args, strict=os.geteuid() == 0)
    opts = ApplyOptions(on_busy=OnBusy(args.on_busy), busy_timeout_s=busy_timeout_for(args.on_busy, args.busy_timeout),
                        dry_run=args.dry_run, hooks=_hooks(args.hooks), lock_timeout_s=args.lock_timeout,
                        parallel=not args.sequential, mode_only=args.mode_only)
    abort = threading.Event()
    opts.abort = abort
    try:
        with _interruptible(abort):
            result = Applier(backend, state_dir).apply(profile, opts)
    except BusyError as e:
        refused_out(args, backend, state_dir, profile, failure(e).message)
        raise
    doc = apply_doc(result, args.dry_run)
    out(args, doc, apply_table(doc, verbose=args.verbose))
    if abort.is_set():
        print("interrupted: the apply was cancelled; no GPU was left changed", file=sys.stderr)
        return 130
    kept_hold(args, state_dir, profile, result)
    return for_result(result)


def cmd_recover(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    """One account: which GPUs were put back, which could not be, and whether a journal is left."""
    applier = Applier(backend, state_dir)
    if args.discard:
        return _discard(applier, args.yes)
    results = applier.recover()
    if not results:
        print("no interrupted apply to recover")
        return Exit.OK
    restored = [r.index for r in results if r.status is GpuStatus.ROLLED_BACK]
    if restored:
        print(f"restored GPU {index_ranges(restored)} to the layout before the interrupted apply")
    relabelled = [r.index for r in results if r.status is GpuStatus.APPLIED]
    if relabelled:
        print(f"finished the interrupted owner change of GPU {index_ranges(relabelled)} (its layout never changed)")
    for r in results:
        if r.status not in (GpuStatus.ROLLED_BACK, GpuStatus.APPLIED):
            print(shown(f"GPU {r.index}: NOT restored: {r.error}"), file=sys.stderr)
    if applier.journal.exists():
        print(f"the journal {applier.journal.path} is kept: `migctl recover` tries again; once the GPUs are "
              "checked by hand, `migctl recover --discard` sets it aside", file=sys.stderr)
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
        if not check.configs:
            print(shown(f"{f}: no mig-configs: nothing to check (mig-parted reads it as a spec with nothing to "
                        "apply)"))
        for name, sections in check.configs:
            if isinstance(sections, ValidationError):
                print(f"error: {sections}", file=sys.stderr)
                code = Exit.INVALID
                continue
            valid, invalid = check.models[name]
            print(shown(f"{f}: {name}: ok ({_models(sorted(valid), args.verbose)})") + _not_on(invalid, args.verbose))
        for w in check.warnings:
            print(shown(f"warning: {w}"), file=sys.stderr)
        for key, notes in check.caveats.items():
            caveats.setdefault(key, []).extend(n for n in notes if n not in caveats.get(key, []))
    _note_caveats(caveats, args.verbose)
    return code


_NO_MODEL = "no catalog model offers its profiles: the GPU's own table decides at apply time"


def _not_on(invalid: dict[str, str], verbose: bool) -> str:
    """The catalog models a config is not valid on (a node of one of them refuses it), or nothing."""
    if not invalid:
        return ""
    if not verbose:
        return f"; not valid on {len(invalid)} other catalog models (-v says why)"
    return "".join(f"\n  not valid on {key}: {why}" for key, why in sorted(invalid.items()))
_NAMED = 3  # models named on a config's line without -v


def _models(models: list[str], verbose: bool) -> str:
    """The catalog models a config is valid on: all with -v, else the first few and how many more."""
    if not models:
        return _NO_MODEL
    if verbose or len(models) <= _NAMED + 1:
        return ", ".join(models)
    return f"{', '.join(models[:_NAMED])} and {len(models) - _NAMED} more catalog models; -v lists them"


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


def cmd_export(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    doc, unreadable = export_mig_parted(backend, args.name) if args.format == "mig-parted" else \
        export_profile(backend, Applier(backend, state_dir).owners.load(), args.name)
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.output == "json" else
                     yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))
    for line in unreadable_lines(report_unreadable(unreadable)):
        print(shown(f"warning: not exported: {line}"), file=sys.stderr)
    return partly(Exit.OK, unreadable, True)


def cmd_doctor(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    """Read-only: compare the driver's view of every GPU with the catalog (exit 1 on a difference)."""
    doc = doctor_doc(diagnose(backend))
    out(args, doc, doctor_table(doc, args.verbose))
    lost = [f for f in doc.findings if f.check == UNREADABLE_CHECK]
    if len(lost) < sum(f.verdict in (Verdict.MISMATCH, Verdict.ERROR) for f in doc.findings):
        return Exit.NOT_APPLIED
    return partly(Exit.OK, lost, True)  # the other GPUs were checked


def cmd_what_if(args: argparse.Namespace) -> int:
    """Imported when asked for: the replay model and migd.yaml's loader (APScheduler's cron among it) would
    double what every other migctl command pays to start."""
    from migd.ctl.whatif import cmd_whatif
    return cmd_whatif(args)


NO_GPU: dict[str, Callable[[argparse.Namespace], int]] = {
    "validate": cmd_validate, "daemon": cmd_daemon, "reload": cmd_reload, "resume": cmd_resume,
    "clear-fault": cmd_clear_fault, "what-if": cmd_what_if}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter("migctl: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    try:
        return _run(args)
    except BrokenPipeError:  # our stdout was closed (`migctl ... | head -1`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 128 + signal.SIGPIPE
    except EXPECTED as e:
        f = failure(e)
        print(f, file=sys.stderr)
        return f.code
    except KeyboardInterrupt:
        print("interrupted: if a GPU was being changed, its journal is kept and `migctl recover` restores it",
              file=sys.stderr)
        return 130


ASKS_MIGD = ("reload", "resume", "clear-fault")  # change what migd does: its control socket is root's


def _run(args: argparse.Namespace) -> int:
    if args.command in NO_GPU:
        try:
            return NO_GPU[args.command](args)
        except PermissionError as e:
            if args.command not in ASKS_MIGD or e.filename:
                raise
            print(f"not permitted: `migctl {args.command}` asks migd through its control socket "
                  f"{control_socket(args)}, which only root may use (sudo migctl {args.command})", file=sys.stderr)
            return Exit.NOT_APPLIED
    try:
        return _local(args)
    except PermissionError as e:  # not root: `status` and `isolation` are answered by migd's read-only socket
        if args.command == "isolation" and (code := isolation_from_daemon(args)) is not None:
            return code
        if args.command == "status" and (doc := layout_from_daemon(args)) is not None:
            return status_out(args, doc)
        if args.command not in ("status", "isolation") or args.command == "isolation" and (args.profile or args.probe):
            raise
        sock = paths.status_socket(control_socket(args))  # (said: the user is told migd is not answering)
        print(shown(f"not permitted: {e.filename or e}: {e.strerror}; `migctl {args.command}` reads the GPUs here "
                    f"(their device files), or asks a running migd on its read-only socket {sock}, where none "
                    "answers"), file=sys.stderr)
        return Exit.NOT_APPLIED


def _local(args: argparse.Namespace) -> int:
    backend, state_dir = open_backend(args)
    try:
        handler = {"status": cmd_status, "plan": cmd_plan, "assert": cmd_assert, "apply": cmd_apply,
                   "export": cmd_export, "recover": cmd_recover, "isolation": cmd_isolation,
                   "doctor": cmd_doctor}[args.command]
        return handler(args, backend, state_dir)
    finally:
        backend.close()


if __name__ == "__main__":
    sys.exit(main())
