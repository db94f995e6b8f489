"""The setuid boundary of the simulated nvidia-modprobe: who may have it make device files, and with
which ids.

Why a module of its own: the real nvidia-modprobe is setuid root: run by anyone (libcuda forks and execs
it), it has root's power to make nodes and checks the /proc file with the caller's real ids.  A Python
program cannot be setuid, so this module stands for the bit; the rules it runs are
``migd.sim.modprobe_rules``'s, and the boot of a node (``migd.sim.caps.enable``) starts its server.

:func:`request` runs nvidia-modprobe in-process for a caller whose effective uid is 0; an ordinary
user's call goes to the node's helper (:func:`start_helper`, started by ``migd.sim.caps.enable`` as
root: a process listening on ``run/nvidia-sim/modprobe.sock``), which learns the caller from the socket
(``SO_PEERCRED``) and runs nvidia-modprobe in a child that has the caller's real uid, gids, groups and
umask and effective uid 0: the state a setuid-root binary starts in.  Without a helper (a node where
nvidia-modprobe is not installed setuid) an ordinary user's request does nothing.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from migd.sim.caps_tree import RUN
from migd.sim.modprobe_rules import run

SOCKET = RUN + "/modprobe.sock"
MAX_REQUEST = 64 * 1024


def valid_args(args: object) -> list[str] | None:
    """A request's arguments, if they are only ``-c N`` and ``-f PATH`` pairs."""
    if not isinstance(args, list) or len(args) % 2 or len(args) > 512:
        return None
    out = []
    for opt, value in zip(args[::2], args[1::2], strict=True):
        if not isinstance(value, str) or "\0" in value or not (opt == "-f" or (opt == "-c" and value.isdigit())):
            return None
        out += [opt, value]
    return out


def request(root: Path, args: Sequence[str]) -> int | None:
    """Run nvidia-modprobe ARGS as this process would, the binary being setuid root: its exit status,
    or None when it cannot be run (an ordinary user, and no helper on this node)."""
    if os.geteuid() == 0:
        return run(root, args)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(root / SOCKET))
            s.sendall(json.dumps(list(args)).encode() + b"\n")
            return int(_recv_line(s))
    except (OSError, ValueError):
        return None


def _recv_line(s: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk or len(data) > MAX_REQUEST:
            raise ValueError("no complete line")
        data += chunk
    return data.decode()


# -- the helper: root's server, standing for the setuid bit ------------------------------------
_HELPERS: list[subprocess.Popen[bytes]] = []


def start_helper(root: Path) -> None:
    """Start the node's helper (as root): it serves :func:`request` until ``root``'s socket is gone or
    replaced, or the process that started it has exited."""
    for old in list(_HELPERS):
        if old.poll() is not None:
            _HELPERS.remove(old)
    path = root / SOCKET
    path.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        os.chmod(path, 0o666)  # anyone may ask, as anyone may run a setuid binary
        listener.listen(16)
        fd = listener.fileno()
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
                "from migd.sim.modprobe_helper import serve; serve(Path(sys.argv[2]), int(sys.argv[3]))")
        # -I: no PYTHON* variables, no user site, no current directory: it runs as root
        _HELPERS.append(subprocess.Popen(
            [sys.executable, "-I", "-c", code, str(Path(__file__).resolve().parents[2]),
             str(root), str(fd)],
            pass_fds=(fd,), stdin=subprocess.DEVNULL, start_new_session=True))


def serve(root: Path, fd: int) -> None:
    path = root / SOCKET
    parent = os.getppid()
    listener = socket.socket(fileno=fd)
    listener.settimeout(0.5)
    try:
        inode = os.stat(path).st_ino
    except OSError:
        return
    while os.getppid() == parent:
        try:
            if os.stat(path).st_ino != inode:
                return
        except OSError:
            return
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            try:
                _serve_one(root, conn)
            except (OSError, ValueError):
                pass


def _serve_one(root: Path, conn: socket.socket) -> None:
    conn.settimeout(10)
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    args = valid_args(json.loads(_recv_line(conn)))
    code = 1
    if args is not None:
        child = os.fork()  # (this helper has one thread: forking is safe)
        if child == 0:
            status = 1
            try:
                become_caller(pid)
                status = run(root, args)
            finally:
                os._exit(status)
        code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    conn.sendall(f"{code}\n".encode())


def become_caller(pid: int) -> None:
    """This (root) process takes the ids a setuid-root binary exec'd by ``pid`` starts with: ``pid``'s
    real uid and gid, effective gid, groups and umask, effective (and saved) uid 0."""
    fields: dict[str, list[str]] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    ruid = int(fields["Uid"][0])
    rgid, egid = int(fields["Gid"][0]), int(fields["Gid"][1])
    os.setgroups([int(g) for g in fields.get("Groups", [])])
    os.setresgid(rgid, egid, egid)
    os.setresuid(ruid, 0, 0)
    os.umask(int(fields["Umask"][0], 8) if "Umask" in fields else 0o022)
