"""Slurm's own commands (scontrol, squeue, sinfo, sacct) as typed calls: no private protocol.

Every call goes through one ``Runner`` (argv, timeout -> stdout), so tests and the daemon share
the path and a failing command is one SlurmError naming it.  Output formats are the documented
ones: ``scontrol show node -o`` (one line of Key=Value, its free text last), ``squeue --json``
(jobs: jobjson.py) and ``sinfo -h -o`` with explicit fields.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from migd.slurm.jobjson import on_node
from migd.wire import JsonError, loads

Runner = Callable[[Sequence[str], float], str]

_FIELD = re.compile(r" (?=[A-Za-z_][\w:/]*=)")  # keys such as AllocNode:Sid= and CPUs/Task= too
NODE_TEXT = ("Reason", "Comment", "Extra")  # scontrol show node's free-text fields, printed last in this order
NODE_TRAILING = ("InstanceId", "InstanceType", "ReservationName", "ResumeAfterTime")  # printed after them by
# releases after 22.05 (src/api/node_info.c)
# Node states that mean slurmctld does not (yet) accept the node's registration (scontrol man page).
UNREGISTERED = frozenset({"NOT_RESPONDING", "INVALID_REG", "INVALID", "DOWN", "UNKNOWN", "FUTURE", "NO_RESPOND"})


class SlurmError(Exception):
    """A Slurm command failed or answered something migd cannot read."""


def command_runner(env: Mapping[str, str] = MappingProxyType({})) -> Runner:
    """A Runner that adds ``env`` (settings ``env:``) to migd's own environment."""
    full = {**os.environ, **env}
    return lambda argv, timeout_s: run_command(argv, timeout_s, full)


def run_command(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> str:
    try:
        p = subprocess.run(list(argv), capture_output=True, timeout=timeout_s, check=False,
                           env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{' '.join(argv)}: {e}") from None
    out, err = text_of(p.stdout), text_of(p.stderr)
    if p.returncode != 0:
        detail = (err or out).strip().splitlines()
        raise SlurmError(f"{' '.join(argv)} exited {p.returncode}: {detail[-1] if detail else 'no output'}")
    return out


def text_of(raw: bytes) -> str:
    """Slurm's output as text whatever its bytes: an operator's reason or comment may hold Latin-1 (or
    any) bytes that are not UTF-8; each such byte becomes U+FFFD, and nothing Slurm prints stops migd."""
    return raw.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class NodeInfo:
    name: str
    states: frozenset[str]  # e.g. {"IDLE", "DRAIN"} from State=IDLE+DRAIN
    reason: str
    gres: str
    comment: str = ""
    extra: str = ""  # the node's Extra= (Slurm 22.05+): where a demand planner leaves its wanted layout
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return bool(self.states & {"DRAIN", "DRAINED", "DRAINING"})

    @property
    def registered(self) -> bool:
        return not self.states & UNREGISTERED


@dataclass(frozen=True)
class Job:
    id: str
    state: str
    gres: str  # what Slurm allocated the job on this node, e.g. "gpu:1g.10gb:1(IDX:0)" ("": none)

    @property
    def uses_gpus(self) -> bool:
        return "gpu" in self.gres


def fields(line: str) -> dict[str, str]:
    """One ``-o`` line of scontrol as Key -> Value (values may hold spaces: split before each Key=)."""
    return {k: v.strip() for k, v in (f.split("=", 1) for f in _FIELD.split(line.strip()) if "=" in f)}


def node_fields(line: str) -> dict[str, str]:
    """One ``scontrol show node -o`` line as Key -> Value.  Its free text (Reason, whoever's words with
    Slurm's `` [user@time]`` after them; Comment and Extra, "arbitrary" strings to scontrol(1)) comes last,
    in NODE_TEXT's order on Slurm 22.05.8 (recorded; any order is read): the line is cut at the first of
    them and the fields before it read as :func:`fields` reads them; each of the three then runs to the
    next one's key (a reason to its ``] ``, where it has one).  So words in a comment or a reason are never
    a field of the node: migd's own comment after a registration timeout quotes ``Gres=``, and was read as the node's
    GRES (every later switch then timed out)."""
    line = line.strip()
    cut = min((i for key in NODE_TEXT if (i := line.find(f" {key}=")) >= 0), default=len(line))
    out, rest = fields(line[:cut]), line[cut:].strip()
    left = list(NODE_TEXT)
    while (key := next((k for k in left if rest.startswith(f"{k}=")), None)) is not None:
        left.remove(key)
        rest = rest[len(key) + 1:]
        end = _text_end(rest, left)
        out[key], rest = rest[:end].strip(), rest[end:].strip()
    return out


def _text_end(rest: str, left: list[str]) -> int:
    """Where a free-text value ends: at Slurm's ``] `` before a free-text key still to come (a reason's
    ``[user@time]``), else at that key (Extra's last: migd's own form follows an operator's comment that
    quotes one), else at a field later releases print after the free text, else at the line's end."""
    ends = [(j, s) for later in left for s in ("] ", " ")
            if (j := (rest.rfind if later == "Extra" else rest.find)(f"{s}{later}=")) >= 0]
    stamped = [j + 1 for j, s in ends if s == "] "]
    trailing = [j for key in NODE_TRAILING if (j := rest.find(f" {key}=")) >= 0]
    return min(stamped or [j for j, _ in ends] or trailing, default=len(rest))


def node_text(text: str) -> str:
    """Words migd writes into a node's Reason or Comment, with nothing :func:`node_fields` would read as a
    free-text field (`` Extra=`` becomes `` Extra:``)."""
    return re.sub(rf" ({'|'.join(NODE_TEXT)})=", r" \1:", text)


def _value(f: dict[str, str], key: str) -> str:
    v = f.get(key, "(null)")
    return "" if v == "(null)" else v


def node_info(line: str) -> NodeInfo:
    f = node_fields(line)
    return NodeInfo(f.get("NodeName", ""), frozenset(f.get("State", "").split("+")), f.get("Reason", ""),
                    _value(f, "Gres"), _value(f, "Comment"), _value(f, "Extra"),
                    tuple(p for p in _value(f, "Partitions").split(",") if p))


class SlurmCtl:
    """The commands migd needs, for one node."""

    def __init__(self, node: str, run: Runner, timeout_s: float = 30.0) -> None:
        self.node = node
        self._run = run
        self._timeout_s = timeout_s

    def _call(self, *argv: str, timeout_s: float | None = None) -> str:
        return self._run(argv, self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s))

    def ping(self, timeout_s: float | None = None) -> bool:
        """``timeout_s``: shorter than command_timeout for a poll, so a hung slurmctld cannot hold a
        wait (and migd's stop) for a whole command's time."""
        try:
            return " is UP" in self._call("scontrol", "ping", timeout_s=timeout_s)
        except SlurmError:
            return False

    def info(self, timeout_s: float | None = None) -> NodeInfo:
        line = self._call("scontrol", "show", "node", "-o", self.node, timeout_s=timeout_s).strip()
        info = node_info(line)
        if info.name != self.node:
            raise SlurmError(f"scontrol show node {self.node}: no such node ({line[:80]!r})")
        return info

    def nodes(self) -> list[NodeInfo]:
        """Every node Slurm knows, in one call (the demand planner's view of the partition)."""
        return [node_info(line) for line in self._call("scontrol", "show", "node", "-o").splitlines() if line.strip()]

    def all_jobs(self) -> str:
        """``squeue --json``: every job with its per-node GRES, one call (slurm/queue.py reads it)."""
        return self._call("squeue", "--json")

    def json_unavailable(self) -> str | None:
        """Why Slurm's commands cannot write JSON here (None: they can), asked of ``sinfo --json``: the same
        plugins as ``squeue --json`` (serializer/json, openapi), for a reply of the nodes, not the whole
        queue (a fleet's restart is not a thousand reads of it).  A Slurm built without json-c has no
        serializer/json: ``fatal: Unable to find plugin: serializer/json``."""
        try:
            loads(self._call("sinfo", "--json"))
        except SlurmError as e:
            return str(e)
        except JsonError as e:
            return f"sinfo --json: {e}"
        return None

    def accounting(self, *args: str, timeout_s: float | None = None) -> str:
        """``sacct`` with ``args``: slurmdbd's record of ended jobs (the demand planner's run times at start)."""
        return self._call("sacct", *args, timeout_s=timeout_s)

    def set_extra(self, node: str, text: str) -> None:
        self._call("scontrol", "update", f"nodename={node}", f"extra={text}")

    def jobs(self) -> list[Job]:
        """The active jobs on this node with what Slurm allocated them here, however they asked (``--gres``,
        ``--gpus*``), from ``squeue --json`` (read by slurm/jobjson.py, where a job's name or paths are never
        taken for its allocation).  22.05 ignores that command's filters, and its whole queue is about 3 KB
        a job (docs/slurm.md), so it is read only while ``squeue -w`` (filters honoured; job ids alone, no
        user text) lists a job here: a drained node's last passes, and an idle node's, cost a line.  No
        ``-t``: its state names match a job's whole state, so RUNNING misses a running job being signalled
        (RUNNING|SIGNALING, src/squeue/print.c), where squeue's default keeps every running, suspended,
        completing and staging job whatever its flags."""
        if not self._call("squeue", "-h", "-w", self.node, "-o", "%A").strip():
            return []
        try:
            found = on_node(self._call("squeue", "--json"), self.node)
        except ValueError as e:
            raise SlurmError(f"squeue --json: {e}") from None
        return [Job(job, state, gres) for job, state, gres in found]

    def drain(self, reason: str) -> None:
        self._call("scontrol", "update", f"nodename={self.node}", "state=drain", f"reason={node_text(reason)}")

    def set_comment(self, text: str) -> None:
        """The node's Comment (scontrol(1): "Arbitrary descriptive string"): why the last switch failed."""
        self._call("scontrol", "update", f"nodename={self.node}", f"comment={node_text(text)}")

    def requeue(self, job: str) -> None:
        self._call("scontrol", "requeue", job)

    def resume(self) -> None:
        self._call("scontrol", "update", f"nodename={self.node}", "state=resume")

    def reserve(self, name: str, start: datetime, minutes: int) -> None:
        """A MAINT reservation on this node: no job starts there that would run into the window."""
        at = start.astimezone().strftime("%Y-%m-%dT%H:%M:%S")  # scontrol reads local time
        self._call("scontrol", "create", "reservation", f"reservationname={name}", f"nodes={self.node}",
                   f"starttime={at}", f"duration={max(1, minutes)}", "flags=maint,ignore_jobs", "users=root")

    def unreserve(self, name: str) -> None:
        self._call("scontrol", "delete", f"reservationname={name}")

    def reservations(self) -> list[str]:
        out = self._call("scontrol", "show", "reservation", "-o")
        return [m.group(1) for m in re.finditer(r"ReservationName=(\S+)", out)]

    def delete_node(self) -> None:
        self._call("scontrol", "delete", f"nodename={self.node}")

    def partition_states(self, partition: str) -> dict[str, str]:
        """Node -> state word of every node in a partition (fleet waves count the drained ones)."""
        out = self._call("sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T")
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
