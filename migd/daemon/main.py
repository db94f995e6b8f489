"""``migd``: the daemon's entry point (arguments, logging, signals, systemd)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from migd import __version__, cliargs, paths
from migd.api.checks import DaemonAudit
from migd.api.status import StatusDoc
from migd.apply.journal import left_behind
from migd.apply.statefile import read_json
from migd.cliargs import Parser
from migd.config.migdyaml import Config, load_config, unmapped_owners
from migd.daemon import loop
from migd.daemon.driverwait import open_nvml
from migd.daemon.early import Early
from migd.daemon.sdnotify import Notifier
from migd.daemon.server import AlreadyRunning, Handlers, claim
from migd.daemon.service import Clock, Daemon
from migd.daemon.signals import SignalRelay
from migd.daemon.sockets import Sockets
from migd.daemon.watchdog import Watchdog
from migd.errors import ValidationError
from migd.exits import EXPECTED, Exit, failure
from migd.hardware.inventory import survey
from migd.hardware.ports import GpuBackend
from migd.hardware.types import HardwareError
from migd.isolation.events import EventCounters
from migd.isolation.watch import FaultWatch
from migd.metrics.sampler import NvmlErrorCounter, Sampler
from migd.paths import DEFAULT_CONFIG, DEFAULT_SOCKET, StateFile, migd_wrote, socket_too_long
from migd.plan.planner import build_tables
from migd.printable import LineFormatter, clipped
from migd.report import journal_doc
from migd.sim.fleets import FLEETS
from migd.trust import ensure_private_dir

if TYPE_CHECKING:
    from migd.metrics.aserver import MetricsServer

log = logging.getLogger("migd")
LAYOUT_WAIT_S = 5.0  # a read-only `layout` right after an apply waits this long at most for its reading


class JournalFormatter(LineFormatter):
    """``<N>`` syslog priority prefixes, which journald turns into priorities (SyslogLevelPrefix), on one
    line per record whatever it holds (``LineFormatter``)."""

    LEVELS = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}

    def format(self, record: logging.LogRecord) -> str:
        return f"<{self.LEVELS.get(record.levelno, 6)}>{super().format(record)}"


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(LineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="migd", description="MIG partition daemon: schedules, reconcile, metrics.")
    p.add_argument("--version", action="version", version=f"migd {__version__}")
    p.add_argument("--config", default=os.environ.get("MIGD_CONFIG", DEFAULT_CONFIG),
                   help=f"daemon configuration (default {DEFAULT_CONFIG})")
    p.add_argument("--sim", metavar="FLEET", choices=sorted(FLEETS),
                   help=f"run against the simulator: {', '.join(sorted(FLEETS))}")
    p.add_argument("--sim-state", metavar="PATH", help="simulator state file")
    p.add_argument("--fresh", action="store_true", help="with --sim: start the simulated node and migd's state "
                   "(kept manual apply, journal, owners) anew, as for a first demo")
    p.add_argument("--state-dir", help="journal, lock, owners (default /var/lib/migd)")
    p.add_argument("--control-socket", help=f"control socket path (default {DEFAULT_SOCKET})")
    p.add_argument("--metrics-listen", type=cliargs.host_port,
                   help="HOST:PORT for /metrics and /healthz (overrides the config)")
    p.add_argument("--now", type=cliargs.iso_time, help="pretend the clock starts at this ISO time (demo, tests)")
    p.add_argument("--time-scale", type=cliargs.scale, default=1.0,
                   help=f"run the clock this many times faster ({cliargs.MIN_SCALE:g} to {cliargs.MAX_SCALE:g})")
    p.add_argument("--check", action="store_true", help="validate the configuration and exit")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="least severe messages logged (default info)")
    return p


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """migd's command line, with what argparse cannot check alone (one line, exit 2)."""
    p = parser()
    args = p.parse_args(argv)
    if args.sim_state and not args.sim:
        p.error("--sim-state needs --sim FLEET: the simulator runs only with a fleet")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    setup_logging(args.log_level)
    if args.check:
        return _check(args)
    early = Early(args.config)  # (one relay from here to the end: never the default SIGHUP, which ends migd)
    relay = SignalRelay((signal.SIGHUP, signal.SIGTERM, signal.SIGINT), early.signal)
    try:
        try:
            early.started = cfg = load_config(args.config)
        except (ValidationError, OSError) as e:
            log.critical("invalid configuration, not starting: %s", e)
            return Exit.INVALID
        return _start(args, cfg, early)
    finally:
        relay.close()


def _check(args: argparse.Namespace) -> int:
    """``--check``: the configuration read as migd would start on it, said on stdout or stderr alone."""
    try:
        cfg = load_config(args.config)
    except (ValidationError, OSError) as e:  # a checker prints the error alone, as a compiler would
        print(f"{args.config}: {e}" if isinstance(e, OSError) and not e.filename else str(e), file=sys.stderr)
        return Exit.INVALID
    for w in unmapped_owners(cfg):  # what start-up warns about, said before it starts
        print(f"{args.config}: warning: {w}", file=sys.stderr)
    print(f"{args.config}: ok ({len(cfg.profiles)} profile(s), {len(cfg.schedule.entries)} transition(s))")
    return Exit.OK


def _claimed(args: argparse.Namespace, cfg: Config) -> tuple[Path | None, Path, Path]:
    """The simulator's state (if any), the state dir and the control socket, checked and claimed."""
    state, state_dir, socket_path = _paths(args, cfg)
    if args.fresh:
        _start_fresh(args, state, state_dir, socket_path)
    ensure_private_dir(state_dir, "state dir")
    ensure_private_dir(socket_path.parent, "control socket's directory")
    if (why := socket_too_long(socket_path)) is not None:  # (--control-socket, or beside a --sim-state)
        raise ValidationError(str(socket_path), None, None, "", why)
    claim(socket_path)
    return state, state_dir, socket_path


def _start(args: argparse.Namespace, cfg: Config, early: Early) -> int:
    errors = NvmlErrorCounter()
    try:
        state, state_dir, socket_path = _claimed(args, cfg)
        sockets = Sockets(socket_path)
        backend = _open(args, cfg, partial(_backend, args, state, errors), early, sockets)
    except (AlreadyRunning, ValidationError) as e:
        log.critical("not starting: %s", e)
        return Exit.INVALID
    except OSError as e:
        log.critical("not starting: %s: %s", e.filename or "", e.strerror or e)
        return Exit.INVALID
    if backend is None:  # stopped (SIGTERM) while waiting for the NVIDIA driver
        return Exit.OK
    return _run(args, cfg, backend, (state, state_dir), sockets, early, errors)


def _run(args: argparse.Namespace, cfg: Config, backend: GpuBackend, where: tuple[Path | None, Path],
         sockets: Sockets, early: Early, errors: NvmlErrorCounter) -> int:
    """The daemon on an opened backend (``where``: the simulator's state, if any, and the state dir), until
    it stops; what start-up could not survive is one line, never a traceback in the journal."""
    state, state_dir = where
    try:
        daemon = Daemon(cfg, backend, state_dir, _clock(args, cfg), Notifier(),
                        reload_config=lambda: load_config(args.config))
        return _serve(args, cfg, backend, state, daemon, (sockets, early), errors)
    except EXPECTED as e:
        f = failure(e)
        log.critical("stopping: %s", f)
        return f.code
    except AlreadyRunning as e:  # (its socket taken in a moment migd did not hold it: one line too)
        log.critical("stopping: %s", e)
        return Exit.INVALID
    finally:
        sockets.close()
        backend.close()


def _open(args: argparse.Namespace, cfg: Config, open_backend: Callable[[], GpuBackend], early: Early,
          sockets: Sockets) -> GpuBackend | None:
    """NVML, waiting for the driver while it cannot be opened (driverwait.py); None: SIGTERM came first."""
    return open_nvml(open_backend, Notifier(), early.stop, args.metrics_listen or cfg.metrics_listen, args.time_scale,
                     lambda said: sockets.waiting(said, early.reload))


def _start_fresh(args: argparse.Namespace, state: Path | None, state_dir: Path, socket_path: Path) -> None:
    """``--fresh``: forget the simulated node and migd's state, so the demo starts as on a new node (never
    on real GPUs, and never under a migd that still runs there)."""
    if state is None:
        raise ValidationError("--fresh", None, None, "", "only with --sim: on real GPUs the state dir holds the "
                              "journal that recovers an interrupted apply")
    _refuse_foreign(state, state_dir)
    claim(socket_path)
    with contextlib.suppress(FileNotFoundError):
        state.unlink()
    for f in StateFile:  # (what it set aside stays, for the operator)
        with contextlib.suppress(FileNotFoundError):
            f.at(state_dir).unlink()


def _refuse_foreign(state: Path, state_dir: Path) -> None:
    """``--fresh`` removes migd's own files and nothing else: a state dir holding anything else, or a state
    file that is not a simulator's, is refused as it is given (a mistyped ``--state-dir /tmp`` removed
    every file in /tmp, and ``--sim-state`` of a configuration file replaced it)."""
    if state_dir.is_dir():
        sim = {state.name, f"{state.name}.lock"} if state.parent == state_dir else set()  # (its own, beside)
        other = sorted(e.name for e in os.scandir(state_dir) if not migd_wrote(e.name) and e.name not in sim)
        if other:
            raise ValidationError(str(state_dir), None, None, "", f"--fresh removes only migd's own state, and this "
                                  f"directory holds {len(other)} other entr{'y' if len(other) == 1 else 'ies'} "
                                  f"({clipped(', '.join(other[:3]))}): name a state dir of migd's alone")
    try:
        doc = read_json(state)
    except FileNotFoundError:
        return
    except ValidationError as e:
        raise ValidationError(str(state), None, None, "", f"--fresh replaces only a simulator's state: "
                              f"{e.message}") from None
    if not (isinstance(doc, dict) and "fleet" in doc and "serial" in doc):
        raise ValidationError(str(state), None, None, "", "--fresh replaces only a simulator's state, and this file "
                              "is not one (no fleet and serial): name the simulator's own file")


def _clock(args: argparse.Namespace, cfg: Config) -> Clock:
    start = args.now if args.now is None or args.now.tzinfo else args.now.replace(tzinfo=cfg.timezone)
    return Clock(start, args.time_scale)


def _serve(args: argparse.Namespace, cfg: Config, backend: GpuBackend, sim_state: Path | None, daemon: Daemon,
           asked: tuple[Sockets, Early], errors: NvmlErrorCounter) -> int:
    """Metrics, fault watch and control socket around the daemon's loop, until it stops; ``asked``: the
    sockets and signals, kept since start-up, that the daemon now takes over."""
    sockets, early = asked
    events = EventCounters()
    listen = args.metrics_listen or cfg.metrics_listen
    sampler = _sampler(cfg, backend, daemon)
    try:
        metrics = _metrics(listen, sampler, daemon, errors, events) if listen else None
    except OSError as e:
        log.critical("cannot serve metrics on %s: %s; not starting", listen, e.strerror or e)
        return Exit.INVALID
    sampler.start()  # once the address is bound: a refused one leaves no thread sampling as migd exits

    def config_changed() -> None:
        daemon.drift_suspected()
        sampler.invalidate()
    watch = FaultWatch(backend, daemon.hw_lock, events, daemon.status.unhealthy, on_config_change=config_changed)
    handlers = _handlers(daemon, watch, sampler)
    sockets.answer(handlers)
    early.hand_over(partial(_on_signal, daemon))  # (after the sockets: a reload they kept is handed on)
    watch.start()
    watchdog = Watchdog(daemon.notifier, daemon.heartbeat)
    watchdog.start()
    _prepare(args, cfg, backend, daemon, sockets.path, sim_state)
    try:
        loop.run(daemon)
    finally:
        watchdog.stop()
        watch.stop()
        sockets.close()
        if metrics is not None:
            metrics.stop()
        sampler.stop()
    log.info("migd stopped")
    return Exit.OK


def _sampler(cfg: Config, backend: GpuBackend, daemon: Daemon) -> Sampler:
    """The one reader of NVML for everyone who only looks: /metrics, the page and the read-only
    socket's `layout`, each answered from its last snapshot; read afresh after every apply."""
    sampler = Sampler(backend, daemon.hw_lock, daemon.applier.owners.load, cfg.sample_interval_s)
    sampler.sample_once()
    daemon.on_apply.append(sampler.invalidate)
    return sampler


def _metrics(listen: str, sampler: Sampler, daemon: Daemon, errors: NvmlErrorCounter,
             events: EventCounters) -> MetricsServer:
    """/metrics and the page, fed by every apply (OSError: the address cannot be bound)."""
    from migd.metrics.http import Sources, start_metrics
    server, collector = start_metrics(listen, Sources(
        lambda: daemon.status, lambda: daemon.audit_findings, errors, events), sampler)
    daemon.on_apply.append(collector.observe_apply)
    host, port = server.server_address[:2]
    log.info("serving /metrics, /healthz and the page on %s", f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return server


def _handlers(daemon: Daemon, watch: FaultWatch, sampler: Sampler) -> Handlers:
    """What the control socket answers (all of it) and the read-only socket (control.READ_ONLY): nothing
    the read-only socket answers calls NVML (any local user may ask, as often as they like)."""
    def layout() -> StatusDoc:  # `migctl status` for a user who cannot read the GPUs (or the sim) itself
        snap = sampler.current(LAYOUT_WAIT_S)
        if snap is None:
            raise HardwareError("migd has not read the GPUs yet")
        return snap.status(journal_doc(left_behind(daemon.applier.journal.path)))
    return Handlers(
        status=daemon.status.view, reload=daemon.reload_now, apply=daemon.manual_apply,
        isolation=lambda: DaemonAudit(daemon.status.unhealthy_reasons(), tuple(watch.breaches),
                                      tuple(daemon.audit_findings), daemon.status.faults(), daemon.status.clock),
        clear_fault=daemon.clear_fault, resume=daemon.resume, layout=layout)


def _on_signal(daemon: Daemon, signum: int) -> None:
    if signum == signal.SIGHUP:
        daemon.events.request_reload()
    else:
        log.info("received %s: finishing the current step, then exiting", signal.Signals(signum).name)
        daemon.events.terminate()


def _prepare(args: argparse.Namespace, cfg: Config, backend: GpuBackend, daemon: Daemon, socket_path: Path,
             sim_state: Path | None) -> None:
    """Say what migd starts on (a lost GPU among them), and build what the first plan needs."""
    inventory = survey(backend)
    log.info("migd starting: %d GPU(s), %d profiles, timezone %s, control socket %s", inventory.count,
             len(cfg.profiles), cfg.timezone.key, socket_path)
    for u in inventory.unreadable:  # the others are served; this one is reported in status and metrics
        log.error("%s", u.describe())
    if sim_state is not None:
        log.info("simulated node %s: state %s, migd's state dir %s (--fresh starts both anew)", args.sim, sim_state,
                 daemon.applier.state_dir)
    daemon.progress.node = {g.index: g.uuid for g in inventory.gpus}  # each shown, selected or not
    for model in {g.model for g in inventory.gpus if g.model is not None}:  # before the first plan needs them
        build_tables(model)
    # What start-up built (catalog, profiles, pynvml, the simulated library) lives as long as migd:
    # moved out of the cyclic collector's reach, a full collection scans only what the daemon
    # allocates as it runs, and a scrape does not wait for one.
    gc.collect()
    gc.freeze()


def _paths(args: argparse.Namespace, cfg: Config) -> tuple[Path | None, Path, Path]:
    """Simulator state (None on real GPUs), state dir and control socket."""
    sdir = args.state_dir or cfg.state_dir
    sock = paths.control_socket(args.control_socket or cfg.control_socket, args.sim, args.sim_state, sdir)
    state = paths.sim_paths(args.sim, args.sim_state, sdir)[0] if args.sim else None
    return state, paths.state_dir(sdir, args.sim, args.sim_state), sock


def _backend(args: argparse.Namespace, state: Path | None, errors: NvmlErrorCounter) -> GpuBackend:
    if state is not None:
        from migd.sim.backend import sim_backend
        return sim_backend(state, args.sim, on_nvml_error=errors)
    from migd.hardware.nvml.backend import NvmlBackend
    return NvmlBackend(on_nvml_error=errors)


if __name__ == "__main__":
    sys.exit(main())
