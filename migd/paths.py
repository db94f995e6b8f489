"""Where migd's files live by default, in one place for migd, migctl and the simulator."""

from __future__ import annotations

import enum
import os
import re
import socket
from pathlib import Path

from migd.errors import ValidationError
from migd.trust import ensure_private_dir

DEFAULT_CONFIG = "/etc/migd/migd.yaml"
DEFAULT_STATE_DIR = "/var/lib/migd"  # journal, apply lock, owner labels, kept manual override
DEFAULT_SOCKET = "/run/migd/control.sock"


class StateFile(enum.Enum):
    """What migd writes in its state dir, by name: every writer takes its name from here, and
    ``migd --fresh`` removes these and nothing else."""

    JOURNAL = "journal.json"  # the apply in progress (recovery)
    OWNERS = "owners.json"  # owner labels of the instances
    OVERRIDE = "override.json"  # a kept manual apply
    APPLY_LOCK = "apply.lock"  # one apply at a time
    SLURM = "slurm.json"  # the Slurm switch in progress
    DEMAND = "demand.json"  # the demand planner's record
    CONTROL_SOCKET = "control.sock"  # a simulated node's control socket

    def at(self, state_dir: Path) -> Path:
        return state_dir / self.value


_TEMP = re.compile(r"^\.(?P<name>[^/]+)\.[A-Za-z0-9_]+\.tmp$")  # statefile's mkstemp: .journal.json.abc123.tmp
_ASIDE = re.compile(r"^(?P<name>[^/]+)\.[a-z]+-[0-9]+$")  # statefile.set_aside: journal.json.discarded-1795...


def migd_wrote(name: str) -> bool:
    """Whether a state dir's entry ``name`` is one of migd's own files, a temp file of its write, or one it set
    aside (kept for the operator)."""
    known = {f.value for f in StateFile}
    m = _TEMP.match(name) or _ASIDE.match(name)
    return name in known or (m is not None and m["name"] in known)


def sim_root() -> Path:
    """Where simulated nodes live by default: a directory of this user's own under $TMPDIR (or /tmp),
    created 0700 and checked on every use (``ensure_private_dir``), never a shared name in a
    world-writable directory where another local user could plant a state dir or a lock symlink."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"migd-sim-{os.geteuid()}"


def sim_paths(fleet: str, sim_state: str | None, state_dir: str | None) -> tuple[Path, Path]:
    """A simulated node's state file and its state dir (beside it, unless given)."""
    if sim_state:
        state = Path(sim_state)
    else:
        ensure_private_dir(sim_root(), "the simulator's directory")
        state = sim_root() / f"{fleet}.json"
    return state, Path(state_dir) if state_dir else state.with_name(state.name + ".d")


def state_dir(explicit: str | None, sim: str | None = None, sim_state: str | None = None) -> Path:
    """The state dir; one that is there but not a directory is refused here, for every command alike (a
    state file's read or write would otherwise fail with ``Not a directory`` and no path)."""
    path = sim_paths(sim, sim_state, explicit)[1] if sim else Path(explicit or DEFAULT_STATE_DIR)
    if os.path.lexists(path) and not path.is_dir():
        raise ValidationError(str(path), None, None, "", "the state dir is not a directory")
    return path


def control_socket(explicit: str | None, sim: str | None = None, sim_state: str | None = None,
                   state_dir_: str | None = None) -> Path:
    """The control socket: given, else in a simulated node's state dir, else the system default."""
    if explicit:
        return Path(explicit)
    if sim:
        return StateFile.CONTROL_SOCKET.at(sim_paths(sim, sim_state, state_dir_)[1])
    return Path(DEFAULT_SOCKET)


def status_socket(control: Path) -> Path:
    """migd's read-only socket, open to every local user: it answers only what shows state (status,
    layout, isolation), never what changes a GPU.  The control socket's directory stays private (0700),
    so this one has a directory of its own beside it, open to look into and writable by root only:
    /run/migd/control.sock -> /run/migd-view/status.sock (the unit's second RuntimeDirectory)."""
    return control.parent.parent / f"{control.parent.name}-view" / "status.sock"


MAX_SOCKET_PATH = 107  # sun_path is 108 bytes, the last its NUL (unix(7); Python refuses a 108-byte path)


def socket_too_long(path: Path) -> str | None:
    """Why ``path`` cannot be bound as a Unix socket, if it is too long for the address; None if it fits.
    (The control socket's stops migd's start; the read-only one's beside it costs that socket only.)"""
    size = len(os.fsencode(path))
    return f"is {size} bytes; a Unix socket's path is at most {MAX_SOCKET_PATH} (unix(7))" \
        if size > MAX_SOCKET_PATH else None


def listening(path: Path) -> bool:
    """Whether a daemon answers on ``path`` (a socket file nobody listens on is stale)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    finally:
        s.close()
    return True
