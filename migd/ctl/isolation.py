"""``migctl isolation``: the fault-isolation audit read here (root), or the running migd's last one
(anyone, through its read-only socket), with migd's fault marks; exit 1 on an error finding or mark."""

from __future__ import annotations

import argparse
from pathlib import Path

from migd.api.checks import DaemonMarks, IsolationDoc
from migd.api.commands import Ask, Command, IsolationReply, Reply, reply_as
from migd.apply.executor import Applier
from migd.ctl.client import request
from migd.ctl.remote import control_socket, daemon_request, out, refusal
from migd.ctl.text import isolation_table
from migd.errors import ValidationError
from migd.exits import Exit, partly
from migd.hardware.ports import GpuBackend
from migd.isolation.audit import Severity, audit
from migd.isolation.probe import run_probe
from migd.profiles.loader import load_profile
from migd.report import unreadable as report_unreadable
from migd.wire import from_json


def cmd_isolation(args: argparse.Namespace, backend: GpuBackend, state_dir: Path) -> int:
    if args.config and not args.profile:
        raise ValidationError("--config", None, None, "", "names a config of the file --profile gives: give --profile")
    profile = load_profile(args.profile, config=args.config) if args.profile else None
    plans = {p.gpu.index: p for p in Applier(backend, state_dir).plan(profile)} if profile else None
    findings, unreadable = audit(backend, plans, f"profile {profile.name}" if profile else "the active profile")
    daemon = request(control_socket(args), Ask(Command.ISOLATION), timeout_s=10)
    doc = IsolationDoc(tuple(findings), report_unreadable(unreadable),
                       None if daemon is None else from_json(DaemonMarks, daemon, "daemon"),
                       run_probe(backend) if args.probe else None)
    return _isolation_out(args, doc)


def _isolation_out(args: argparse.Namespace, doc: IsolationDoc) -> int:
    """``migctl isolation``'s table and exit code, from its document (read here, or by migd)."""
    out(args, doc, isolation_table(doc, args.verbose))
    daemon = doc.daemon
    faults = bool(daemon and (daemon.unhealthy or daemon.breaches))
    bad = any(f.severity is Severity.ERROR for f in doc.findings) or faults
    return Exit.NOT_APPLIED if bad else partly(Exit.OK, doc.unreadable, True)


def isolation_from_daemon(args: argparse.Namespace) -> int | None:
    """``migctl isolation`` for a user who may not read the GPUs: the running migd's last audit (of
    the active profile) and its fault marks, from its read-only socket; None when it cannot answer
    (no migd there, or ``--profile``/``--probe``, which need the GPUs read here)."""
    if args.profile or args.probe:
        return None
    try:
        reply = daemon_request(args, Ask(Command.ISOLATION), timeout_s=10)
    except (PermissionError, ConnectionError):
        return None
    head = reply_as(Reply, reply)
    if not head.ok:  # (a busy socket: said, never taken for "no migd")
        raise refusal(head, "migd's control socket")
    found = reply_as(IsolationReply, reply).audit
    doc = IsolationDoc(found.findings, (), DaemonMarks(found.unhealthy, found.breaches, found.faults, found.clock))
    return _isolation_out(args, doc)
