"""migctl's side of the control socket: the commands the running migd answers (daemon, reload,
resume, clear-fault) and the hand-off of an apply, with what each tells the user."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from migd import paths
from migd.api.control import ApplyRequest, ManualApply, listening, request
from migd.api.daemon import DaemonDoc, SimClock
from migd.api.override import HeldView
from migd.api.plan import ApplyDoc
from migd.api.status import StatusDoc
from migd.api.wire import WireError, from_json
from migd.apply.result import GpuStatus, OnBusy, busy_timeout_for
from migd.errors import ValidationError
from migd.exits import Exit
from migd.report import dump
from migd.report_daemon import clock_of
from migd.report_text import RESUME_HINT, apply_table, daemon_table


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
    req = ApplyRequest(path, text, args.config, ManualApply(
        on_busy=OnBusy(args.on_busy), dry_run=args.dry_run, busy_timeout_s=busy_timeout_for(args.on_busy,
                                                                                              args.busy_timeout),
        lock_timeout_s=args.lock_timeout, parallel=not args.sequential, mode_only=args.mode_only),
        withdraw_on_hangup=True).to_json()
    try:
        reply = request(sock, req, on_interrupt=interrupted)
    except KeyboardInterrupt:
        print("stopped waiting: migd goes on cancelling the apply; `migctl daemon` shows the outcome",
              file=sys.stderr)
        return 130
    if reply is None:
        return None
    for w in reply.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    if not _error(reply):
        result = from_json(ApplyDoc, reply["result"], "result")
        clock = from_json(SimClock, reply["clock"], "clock") if reply.get("clock") else None
        out(args, result, apply_table(result, by="migd", when=clock_of(clock)))
    elif refused is not None and reply.get("exit") == Exit.BUSY and "result" not in reply:
        refused(str(reply["error"]))
    if withdrawn:
        print("interrupted: the apply was cancelled; no GPU was left changed and nothing is held", file=sys.stderr)
        return 130
    held = None if reply.get("override") is None else from_json(HeldView, reply["override"], "override")
    if held and args.output == "table":
        print(f"{held.profile} holds until {held.until or 'the schedule has no further transition'}; "
              f"{RESUME_HINT}")
    return int(reply.get("exit", 1))


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


def _error(reply: dict[str, Any]) -> bool:
    """Whether migd refused the request; if so its reason is said, once, as migd's."""
    if "error" not in reply:
        return False
    print(f"error (from migd): {reply['error']}", file=sys.stderr)
    return True


def daemon_request(args: argparse.Namespace, req: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    sock = control_socket(args)
    try:
        reply = request(sock, req, timeout_s=timeout_s)
    except PermissionError:  # (a user who is not root: the request may be one the read-only socket answers)
        sock = paths.status_socket(sock)
        reply = request(sock, req, timeout_s=timeout_s)
    if reply is None:
        raise ConnectionError(f"no migd is listening on {sock}")
    return reply


def layout_from_daemon(args: argparse.Namespace) -> StatusDoc | None:
    """``migctl status`` for a user who may not read the GPUs (or the simulator) here: the running
    migd's reading, from its read-only socket; None when no migd answers there."""
    try:
        reply = request(paths.status_socket(control_socket(args)), {"cmd": "layout"}, timeout_s=30.0)
    except PermissionError:
        return None
    if reply is None or not reply.get("ok"):
        return None
    return from_json(StatusDoc, reply["status"], "status")


def cmd_daemon(args: argparse.Namespace) -> int:
    """The running daemon's state (migd.daemon/v1), from its control socket."""
    doc = from_json(DaemonDoc, daemon_request(args, {"cmd": "status"})["daemon"], "daemon")
    out(args, doc, daemon_table(doc))
    return Exit.OK


def cmd_reload(args: argparse.Namespace) -> int:
    """Ask migd to reload its configuration and profiles (like SIGHUP), and say whether it took."""
    reply = daemon_request(args, {"cmd": "reload"}, timeout_s=120.0)
    if not reply.get("ok"):
        print(f"error: reload rejected, migd keeps its running configuration: {reply.get('error')}", file=sys.stderr)
        return int(reply.get("exit", Exit.INVALID))
    print(f"reloaded: {reply.get('detail') or 'configuration accepted'}")
    return Exit.OK


def cmd_resume(args: argparse.Namespace) -> int:
    """Lift a manual apply's hold: migd returns to the scheduled profile now (planned, minimal).
    Without a running migd the kept override is dropped, so its next start follows the schedule."""
    reply = request(control_socket(args), {"cmd": "resume"}, timeout_s=3600.0)
    if reply is None:
        return _resume_offline(args)
    if _error(reply):
        return int(reply["exit"])
    lifted, profile = reply.get("lifted"), reply.get("profile")
    result = None if reply.get("result") is None else from_json(ApplyDoc, reply["result"], "result")
    print(f"lifted the manual apply of {lifted}" if lifted else "no manual apply was held")
    if profile is None:
        print("no schedule entry has fired yet: GPUs are left as they are")
        return Exit.OK
    if result is not None and result.results:
        sys.stdout.write(apply_table(result, by="migd"))
    for r in result.results if result is not None else ():
        if r.status is GpuStatus.BLOCKED:
            print(f"GPU {r.index} waits for busy instances ({r.error}): migd switches it when they end")
    print(f"back on the schedule: {profile}")
    return int(reply["exit"])


def _resume_offline(args: argparse.Namespace) -> int:
    from migd.api.override import OverrideStore
    store = OverrideStore(paths.state_dir(args.state_dir, args.sim, args.sim_state) / "override.json")
    if not store.path.exists():
        print("migd is not running and no manual apply is kept: its next start follows the schedule")
        return Exit.OK
    store.clear()
    print(f"migd is not running: dropped the kept manual apply ({store.path}); its next start follows the schedule")
    return Exit.OK


def cmd_clear_fault(args: argparse.Namespace) -> int:
    reply = request(control_socket(args), {"cmd": "clear-fault", "gpu": args.gpu}, timeout_s=10)
    if reply is None:
        print("not applied: migd is not running (fault marks live in the daemon)", file=sys.stderr)
        return Exit.NOT_APPLIED
    if _error(reply):
        return int(reply["exit"])
    print(f"cleared: {', '.join(reply['cleared']) or 'nothing (no fault mark on that GPU)'}")
    return int(reply["exit"])


def caps_root(args: argparse.Namespace) -> str:
    """Where the driver's /dev and /proc are, as the running migd's access by owner says ("/" on a
    node; a simulated node's own tree), else "/"."""
    try:
        doc = from_json(DaemonDoc, daemon_request(args, {"cmd": "status"}, timeout_s=10).get("daemon"), "daemon")
    except (OSError, WireError):
        return "/"
    return doc.access.root if doc.access is not None else "/"
