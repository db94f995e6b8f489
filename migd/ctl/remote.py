"""migctl's side of the control socket: the commands the running migd answers (daemon, reload,
resume, clear-fault) and the hand-off of an apply, with what each tells the user."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from migd import paths
from migd.api.commands import (
    ApplyReply,
    ApplyRequest,
    Ask,
    ClearedReply,
    ClearFault,
    Command,
    DaemonReply,
    LayoutReply,
    ManualApply,
    ReloadReply,
    Reply,
    ResumeReply,
    reply_as,
)
from migd.api.daemon import DaemonDoc
from migd.api.status import StatusDoc
from migd.apply.result import GpuStatus, OnBusy, busy_timeout_for
from migd.ctl.client import ControlError, request
from migd.ctl.daemon_table import clock_of
from migd.ctl.text import RESUME_HINT, apply_table, daemon_table
from migd.errors import ValidationError
from migd.exits import Exit
from migd.hardware.types import HardwareError
from migd.paths import listening
from migd.printable import shown
from migd.report import dump
from migd.wire import WireError


def control_socket(args: argparse.Namespace) -> Path:
    return paths.control_socket(args.control_socket, args.sim, args.sim_state, args.state_dir)


def out(args: argparse.Namespace, doc: object, table: str) -> None:
    sys.stdout.write(table if args.output == "table" else dump(doc, args.output))


def apply_via_daemon(args: argparse.Namespace, text: str,
                     refused: Callable[[str], None] | None = None) -> int | None:
    """Hand the apply to a running migd, so the daemon and the CLI never race.  None: no daemon.
    ``refused``: told migd's reason when it refused the apply for busy instances before it began.

    Ctrl-C withdraws the request: migd cancels the apply and puts every GPU it changed back, and
    this waits for its account of that (a second Ctrl-C stops waiting, not migd)."""
    path = "<stdin>" if args.file == "-" else str(Path(args.file).resolve())
    sock = control_socket(args)
    if args.hooks and listening(sock):
        raise ValidationError(args.hooks, None, None, "--hooks", "a running migd runs the hooks of its own "
                              "configuration, not a client's; --force-local applies in this process with these "
                              "hooks (and migd then reconciles to its active profile)")
    withdrawn: list[bool] = []

    def interrupted() -> None:
        withdrawn.append(True)
        print("cancelling: migd stops at the next step and puts every GPU it changed back (Ctrl-C again to stop "
              "waiting for it)", file=sys.stderr)
    req = ApplyRequest.of(path, text, args.config, ManualApply(
        on_busy=OnBusy(args.on_busy), dry_run=args.dry_run, busy_timeout_s=busy_timeout_for(args.on_busy,
                                                                                              args.busy_timeout),
        lock_timeout_s=args.lock_timeout, parallel=not args.sequential, mode_only=args.mode_only),
        withdraw_on_hangup=True)
    try:
        reply = request(sock, req, on_interrupt=interrupted)
    except KeyboardInterrupt:
        print("stopped waiting: migd goes on cancelling the apply; `migctl daemon` shows the outcome",
              file=sys.stderr)
        return 130
    if reply is None:
        return None
    done = reply_as(ApplyReply, reply)
    if done.error is None and done.result is None:
        raise WireError("reply.result", "missing")
    for w in done.warnings:
        print(shown(f"warning: {w}"), file=sys.stderr)
    if not _error(done) and done.result is not None:
        out(args, done.result, apply_table(done.result, by="migd", when=clock_of(done.clock)))
    elif refused is not None and done.exit == Exit.BUSY and done.result is None:
        refused(str(done.error))
    if withdrawn:
        print("interrupted: the apply was cancelled; no GPU was left changed and nothing is held", file=sys.stderr)
        return 130
    held = done.override
    if held and args.output == "table":
        print(shown(f"{held.profile} holds until {held.until or 'the schedule has no further transition'}; "
                    f"{RESUME_HINT}"))
    return done.exit


def refuse_local(args: argparse.Namespace) -> None:
    """``apply --local`` beside a running migd would be undone at its next pass: refused unless forced."""
    sock = control_socket(args)
    if args.dry_run or not listening(sock):
        return
    if not args.force_local:
        raise ValidationError("--local", None, None, "", f"migd is running (its control socket {sock} answers) and "
                              "would put its active profile back at its next pass; apply through it (without "
                              "--local), or --force-local in an emergency")
    print(f"warning: --force-local: migd is running ({sock}); unless it is stopped it reconciles these GPUs back "
          "to its active profile at its next pass (migctl daemon shows it)", file=sys.stderr)


def _error(reply: Reply | ApplyReply) -> bool:
    """Whether migd refused the request; if so its reason is said, once, as migd's."""
    if reply.error is None:
        return False
    print(shown(f"error (from migd): {reply.error}"), file=sys.stderr)
    return True


def daemon_request(args: argparse.Namespace, req: object, timeout_s: float = 30.0) -> dict[str, Any]:
    sock = control_socket(args)
    try:
        reply = request(sock, req, timeout_s=timeout_s)
    except PermissionError:  # (a user who is not root: the request may be one the read-only socket answers)
        sock = paths.status_socket(sock)
        try:
            reply = request(sock, req, timeout_s=timeout_s)
        except PermissionError as e:  # (migd makes it 0666: someone changed it)
            raise ControlError(f"migd's read-only socket {sock}: {e.strerror}, and its control socket is root's; "
                               "migd opens the read-only one to every user when it starts") from None
    if reply is None:
        raise ConnectionError(f"no migd is listening on {sock}")
    return reply


def layout_from_daemon(args: argparse.Namespace) -> StatusDoc | None:
    """``migctl status`` for a user who may not read the GPUs (or the simulator) here: the running
    migd's reading, from its read-only socket; None when no migd answers there."""
    try:
        reply = request(paths.status_socket(control_socket(args)), Ask(Command.LAYOUT), timeout_s=30.0)
    except PermissionError:
        return None
    if reply is None:
        return None
    head = reply_as(Reply, reply)
    if not head.ok:  # (a busy socket: said, never taken for "no migd")
        raise refusal(head, f"migd's read-only socket {paths.status_socket(control_socket(args))}")
    return reply_as(LayoutReply, reply).status


def cmd_daemon(args: argparse.Namespace) -> int:
    """The running daemon's state (migd.daemon/v1), from its control socket."""
    doc = _daemon_doc(args, 30.0)
    out(args, doc, daemon_table(doc))
    return Exit.OK


def cmd_reload(args: argparse.Namespace) -> int:
    """Ask migd to reload its configuration and profiles (like SIGHUP), and say whether it took."""
    sock = control_socket(args)  # root's socket alone: the read-only one's refusal is no rejected configuration
    reply = request(sock, Ask(Command.RELOAD), timeout_s=120.0)
    if reply is None:
        raise ConnectionError(f"no migd is listening on {sock}")
    head = reply_as(Reply, reply)
    if not head.ok:
        print(shown(f"error: reload rejected, migd keeps its running configuration: {head.why}"), file=sys.stderr)
        return head.exit or Exit.INVALID
    print(shown(f"reloaded: {reply_as(ReloadReply, reply).detail or 'configuration accepted'}"))
    return Exit.OK


def cmd_resume(args: argparse.Namespace) -> int:
    """Lift a manual apply's hold: migd returns to the scheduled profile now (planned, minimal).
    Without a running migd the kept override is dropped, so its next start follows the schedule."""
    reply = request(control_socket(args), Ask(Command.RESUME), timeout_s=3600.0)
    if reply is None:
        return _resume_offline(args)
    head = reply_as(Reply, reply)
    if _error(head):
        return head.exit
    done = reply_as(ResumeReply, reply)
    lifted, profile, result = done.lifted, done.profile, done.result
    print(shown(f"lifted the manual apply of {lifted}") if lifted else "no manual apply was held")
    if profile is None:
        print("no schedule entry has fired yet: GPUs are left as they are")
        return Exit.OK
    if result is not None and result.results:
        sys.stdout.write(apply_table(result, by="migd"))
    for r in result.results if result is not None else ():
        if r.status is GpuStatus.BLOCKED:
            print(shown(f"GPU {r.index} waits for busy instances ({r.error}): migd switches it when they end"))
    print(shown(f"back on the schedule: {profile}"))
    return head.exit


def _resume_offline(args: argparse.Namespace) -> int:
    from migd.state.override import OverrideStore
    store = OverrideStore(paths.StateFile.OVERRIDE.at(paths.state_dir(args.state_dir, args.sim, args.sim_state)))
    if not store.path.exists():
        print("migd is not running and no manual apply is kept: its next start follows the schedule")
        return Exit.OK
    store.clear()
    print(f"migd is not running: dropped the kept manual apply ({store.path}); its next start follows the schedule")
    return Exit.OK


def cmd_clear_fault(args: argparse.Namespace) -> int:
    reply = request(control_socket(args), ClearFault(Command.CLEAR_FAULT, str(args.gpu)), timeout_s=10)
    if reply is None:
        print("not applied: migd is not running (fault marks live in the daemon)", file=sys.stderr)
        return Exit.NOT_APPLIED
    head = reply_as(Reply, reply)
    if _error(head):
        return head.exit
    cleared = reply_as(ClearedReply, reply).cleared
    print(shown(f"cleared: {', '.join(cleared) or 'nothing (no fault mark on that GPU)'}"))
    return head.exit


def caps_root(args: argparse.Namespace) -> str:
    """Where the driver's /dev and /proc are, as the running migd's access by owner says ("/" on a
    node; a simulated node's own tree), else "/"."""
    try:
        doc = _daemon_doc(args, 10.0)
    except (OSError, WireError, HardwareError):
        return "/"
    return doc.access.root if doc.access is not None else "/"


def _daemon_doc(args: argparse.Namespace, timeout_s: float) -> DaemonDoc:
    """The running migd's state (``migd.daemon/v1``); a refusal is said as migd's (ConnectionError)."""
    reply = daemon_request(args, Ask(Command.STATUS), timeout_s=timeout_s)
    head = reply_as(Reply, reply)
    if not head.ok:
        raise refusal(head, "migd did not answer with its state")
    return reply_as(DaemonReply, reply).daemon


def refusal(head: Reply, what: str) -> Exception:
    """What migd's refusal is to migctl: a hardware condition as one (exit 4: migd waits for the NVIDIA
    driver), anything else ``what`` it said (exit 1)."""
    if head.exit == Exit.HARDWARE:
        return HardwareError(head.why or what)
    return ControlError(f"{what}: {head.why}")
