"""migctl's command line: every command, its options, and the options all of them take."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from migd import __version__, cliargs, paths
from migd.apply.result import OnBusy
from migd.catalog.models import MODELS
from migd.cliargs import Parser
from migd.profiles.loader import NAME_RULE, is_name
from migd.profiles.validate import MAX_NODE_GPUS
from migd.sim.fleets import FLEETS
from migd.yamlsrc import excerpt


def _globals(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The options every command takes, before or after its name.  On the subcommands they default to
    SUPPRESS, so one given before the command is not overwritten by the subcommand's default."""
    def d(value: object) -> object:
        return value if defaults else argparse.SUPPRESS
    p.add_argument("--sim", metavar="FLEET", default=d(os.environ.get("MIGD_SIM")), choices=sorted(FLEETS),
                   help=f"run against the simulator: {', '.join(sorted(FLEETS))}")
    p.add_argument("--sim-state", metavar="PATH", default=d(os.environ.get("MIGD_SIM_STATE")),
                   help="simulator state file (shared with migd and the fake nvidia-smi)")
    p.add_argument("--state-dir", metavar="DIR", default=d(os.environ.get("MIGD_STATE_DIR")),
                   help=f"journal, lock, owner labels, kept manual apply (default {paths.DEFAULT_STATE_DIR})")
    p.add_argument("--control-socket", metavar="PATH", default=d(os.environ.get("MIGD_CONTROL_SOCKET")),
                   help=f"migd's control socket (default {paths.DEFAULT_SOCKET})")
    p.add_argument("-v", "--verbose", action="store_true", default=d(False),
                   help="every GPU, operation and check in tables, and each step logged (INFO) to stderr")


Command = Callable[[str, str], argparse.ArgumentParser]  # adds one subcommand (name, help)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="migctl", description="Manage NVIDIA MIG partitions.")
    p.add_argument("--version", action="version", version=f"migctl {__version__}")
    _globals(p, defaults=True)
    common = Parser(add_help=False)
    _globals(common, defaults=False)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    def cmd(name: str, hlp: str) -> argparse.ArgumentParser:
        sp: argparse.ArgumentParser = sub.add_parser(name, help=hlp, parents=[common])
        return sp

    st = cmd("status", "GPUs, MIG mode, instances, owners, MIG UUIDs, processes")
    st.add_argument("--mine", action="store_true", help="only the MIG devices you may use, each with the "
                    "CUDA_VISIBLE_DEVICES line that selects it")
    _fmt(st)
    _profile_commands(cmd)
    _node_commands(cmd)
    return p


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """migctl's command line, read: a profile command's file is FILE or -f/--config-file, given once."""
    args = parser().parse_args(argv)
    _check_sim(args)
    if args.command in PROFILE_COMMANDS:
        given = [f for f in (args.file, args.config_file) if f is not None]
        sub = Parser(prog=f"migctl {args.command}")
        if not given:
            sub.error("the following arguments are required: FILE (or -f/--config-file FILE)")
        if len(given) > 1:
            sub.error(f"the file is given twice ({given[0]} and -f {given[1]}): give FILE or -f/--config-file, "
                      "not both")
        args.file = given[0]
    return args


def _profile_name(text: str) -> str:
    """A name migctl validate and apply then take (an empty, spaced or escape-holding one was exported)."""
    if not is_name(text):
        raise ValueError(f"{excerpt(text)} is not a profile name ({NAME_RULE})")
    return text


def _check_sim(args: argparse.Namespace) -> None:
    """What argparse does not check: ``$MIGD_SIM`` is a default, which it never holds to ``choices`` (a bad
    one was a hardware error, exit 4), and ``--sim-state`` without a fleet was silently not used."""
    usage = Parser(prog="migctl")
    if args.sim is not None and args.sim not in FLEETS:
        usage.error(f"$MIGD_SIM: invalid choice: {args.sim!r} (choose from {', '.join(sorted(FLEETS))})")
    if args.sim_state and args.sim is None:
        usage.error("--sim-state (or $MIGD_SIM_STATE) needs --sim FLEET (or $MIGD_SIM): the simulator runs only "
                    "with a fleet")


def _fmt(sp: argparse.ArgumentParser, choices: Sequence[str] = ("table", "json", "yaml")) -> None:
    sp.add_argument("-o", "--output", choices=choices, default=choices[0],
                    help=f"output format (default {choices[0]}; json/yaml follow the documented schema)")


PROFILE_COMMANDS = ("plan", "assert", "apply")


def _profile_commands(cmd: Command) -> None:
    """plan, assert and apply: each takes a profile file, as FILE or as mig-parted's -f/--config-file."""
    for name, hlp in (("plan", "show the operations an apply would run"), ("assert", "exit 0 if applied"),
                      ("apply", "apply a profile")):
        sp = cmd(name, hlp)
        sp.add_argument("file", nargs="?", help="a migd profile or a mig-parted config file (- reads standard "
                        "input); or -f FILE")
        sp.add_argument("-f", "--config-file", metavar="FILE", help="the same, as mig-parted's -f/--config-file")
        sp.add_argument("--config", "-c", "--selected-config", metavar="NAME",
                        help="config name in a mig-parted file (mig-parted's -c/--selected-config)")
        sp.add_argument("--mode-only", "-m", action="store_true",
                        help="only the MIG mode (enabled/disabled), as mig-parted's -m/--mode-only; instances stay")
        _fmt(sp)
        if name == "apply":
            _apply_options(sp)


def _apply_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--dry-run", action="store_true", help="plan and show what would change; change nothing")
    sp.add_argument("--on-busy", choices=[b.value for b in OnBusy], default=OnBusy.REFUSE.value,
                    help="instances with running processes that would be destroyed: refuse (default), "
                    "wait for them to end, or force (SIGTERM, then SIGKILL)")
    sp.add_argument("--busy-timeout", type=cliargs.duration, default=None,
                    help="how long busy instances are waited for before wait refuses or force stops them "
                    "(default 5m with wait, 0 with force)")
    sp.add_argument("--hooks", "-k", "--hooks-file", metavar="FILE",
                    help="YAML file with a hooks: mapping (phases as in mig-parted; its -k/--hooks-file)")
    sp.add_argument("--lock-timeout", type=cliargs.seconds, default=0.0, help="seconds to wait for another apply")
    sp.add_argument("--sequential", action="store_true", help="change GPUs one at a time")
    sp.add_argument("--local", action="store_true",
                    help="apply in this process (refused while migd runs: it would undo it; a dry run is fine)")
    sp.add_argument("--force-local", action="store_true",
                    help="apply in this process even though migd runs (emergencies: migd reconciles to its active "
                    "profile at its next pass)")


def _node_commands(cmd: Command) -> None:
    """The commands about the node, migd and files, in the order --help lists them."""
    sp = cmd("recover", "restore GPUs left half-way by an interrupted apply")
    sp.add_argument("--discard", action="store_true",
                    help="set aside a journal that cannot be used (damaged, or naming a GPU that is gone)")
    sp.add_argument("--yes", action="store_true", help="with --discard: do not ask")
    sp = cmd("isolation", "fault-isolation audit (and the daemon's fault marks and breaches)")
    sp.add_argument("--profile", help="also report instances missing from / not in this profile")
    sp.add_argument("--config", "-c", "--selected-config", metavar="NAME",
                    help="with --profile: the config of a mig-parted file (mig-parted's -c/--selected-config)")
    sp.add_argument("--probe", action="store_true", help="run a tiny CUDA workload in each instance")
    _fmt(sp)
    sp = cmd("clear-fault", "clear a GPU-wide fault mark so the GPU may be reconfigured")
    sp.add_argument("gpu", help="GPU index or UUID")
    sp = cmd("validate", "check profile files offline")
    sp.add_argument("files", nargs="+", help="profile or mig-parted files")
    sp.add_argument("--gpus", type=cliargs.count, metavar="N", help="the node has N GPUs: an index selector "
                    "beyond N-1 is an error (default: the --sim fleet's size; otherwise indexes no server has are "
                    "warned about)")
    _fmt(cmd("daemon", "the running migd: active profile and why, next transition, blocked reason, last apply"))
    cmd("reload", "make the running migd reload its configuration and profiles")
    cmd("resume", "lift a manual apply's hold: back to the scheduled profile now")
    _fmt(cmd("doctor", "read-only check of driver, GPUs, profile tables, events and GPM against the catalog "
                       "(changes nothing)"))
    sp = cmd("export", "print the current state as a migd profile")
    sp.add_argument("--name", default="exported", type=cliargs.typed(_profile_name),
                    help=f"name of the exported profile ({NAME_RULE}; default exported)")
    sp.add_argument("--format", choices=["migd", "mig-parted"], default="migd",
                    help="a migd profile (default; keeps placements and owners) or a mig-parted config")
    _fmt(sp, ("yaml", "json"))
    _what_if_options(cmd("what-if", "replay the cluster's job history (sacct --parsable2) against migd's demand "
                         "mode, the schedule and the best fixed mix; --suggest writes that mix for migd"))


WHAT_IF_MODEL = "H100-SXM5-80GB"  # a node's GPUs in a what-if, unless --gpu says


def _what_if_nodes(text: str) -> int:
    """--nodes: no more than a what-if replays (its bound read here, when given: only the what-if pays for
    importing the what-if)."""
    from migd.whatif.jobs import MAX_NODES
    return cliargs.count_upto(MAX_NODES, "the most nodes a what-if replays")(text)


def _what_if_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--sacct", metavar="FILE", required=True, help="sacct --parsable2 output (- reads standard "
                    "input); its first line names the fields: docs/demand.md gives the command")
    sp.add_argument("--config", metavar="FILE", default="/etc/migd/migd.yaml",
                    help="the migd.yaml whose profiles, schedule and slurm.demand.candidates are weighed "
                    "(default /etc/migd/migd.yaml)")
    sp.add_argument("--nodes", type=_what_if_nodes, metavar="N",
                    help="nodes replayed, at most 4096 (default: as many as sacct's NodeList names)")
    sp.add_argument("--gpu", default=WHAT_IF_MODEL, choices=sorted(MODELS), metavar="MODEL",
                    help=f"each node's GPU model, a catalog key (default {WHAT_IF_MODEL})")
    sp.add_argument("--gpus", type=cliargs.count_upto(MAX_NODE_GPUS, "no server carries more MIG GPUs"),
                    default=8, metavar="N", help=f"GPUs per node, at most {MAX_NODE_GPUS} (default 8)")
    sp.add_argument("--partition", help="replay only this partition's jobs (default: every job)")
    sp.add_argument("--search", type=cliargs.count, default=40, metavar="N",
                    help="replays the search for the best fixed mix may make (default 40)")
    sp.add_argument("--suggest", metavar="DIR", type=Path, help="write the best fixed mix as migd profiles and a "
                    "migd.yaml whose schedule holds it (DIR/profiles/whatif-1.yaml, DIR/migd.whatif-1.yaml), and "
                    "as mig-parted configs (DIR/mig-parted.yaml)")
    sp.add_argument("--slurm-backfill", action="store_true", help="replay with Slurm's backfill reservations "
                    "(every pending job reserves a node, as sched/backfill does; slower), migd deciding as its "
                    "planner does on Slurm; default: first come per MIG type")
    sp.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
