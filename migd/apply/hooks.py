"""Commands run around a change, like mig-parted's hooks: argument lists, no shell, a timeout."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from migd.errors import ValidationError
from migd.trust import check_path

log = logging.getLogger(__name__)

PHASES = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")


class HookError(Exception):
    pass


@dataclass(frozen=True)
class Hook:
    argv: tuple[str, ...]
    timeout_s: float = 60.0
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # a mig-parted hook's envs (the apply's own variables win)
    strict: bool = False  # StrictModes (root): the program is checked again each time before it runs


@dataclass(frozen=True)
class Outcome:
    code: int | None  # None: killed at its timeout
    tail: str  # the last line of its output, for the message


@dataclass(frozen=True)
class Hooks:
    phases: Mapping[str, Sequence[Hook]] = field(default_factory=dict)

    def run(self, phase: str, env: Mapping[str, str]) -> None:
        """Run a phase's hooks in order; a failing hook (except at apply-exit) stops the apply."""
        for hook in self.phases.get(phase, ()):
            full_env = {**os.environ, **dict(hook.env), **env, "MIGD_HOOK_PHASE": phase}
            log.info("hook %s: %s", phase, " ".join(hook.argv))
            try:
                if hook.strict:  # checked when it runs, not only at load: the file may have changed since
                    check_path(hook.argv[0], "hook program")
                outcome = run_hook(hook, full_env)
            except ValidationError as e:
                self._fail(phase, f"hook {hook.argv[0]} refused: {e.message}")
                continue
            except OSError as e:
                self._fail(phase, f"hook {hook.argv[0]} could not run: {_why_not(hook, e)}")
                continue
            if outcome.code is None:
                self._fail(phase, f"hook {hook.argv[0]} timed out after {hook.timeout_s:g}s (its process group "
                                  "was killed)")
            elif outcome.code != 0:
                self._fail(phase, f"hook {hook.argv[0]} exited {outcome.code}: {outcome.tail or 'no output'}")

    @staticmethod
    def _fail(phase: str, msg: str) -> None:
        if phase == "apply-exit":
            log.warning("%s (ignored at apply-exit)", msg)
            return
        raise HookError(f"{phase}: {msg}")


def _why_not(hook: Hook, e: OSError) -> str:
    """Why the hook's process did not start: its working directory (subprocess names it as the failing
    file when the child's chdir fails) or the program itself."""
    if hook.workdir is not None and e.filename == hook.workdir:
        return f"its working directory {hook.workdir}: {e.strerror or e}"
    return str(e.strerror or e)


OUTPUT_KEPT = 64 * 1024  # bytes of a hook's output kept for its message; the rest is read and dropped
DRAIN_S = 0.2  # after the hook exits, how long output still in the pipe is read


def run_hook(hook: Hook, env: Mapping[str, str]) -> Outcome:
    """Run one hook in a process group of its own, keeping only the tail of its output.

    Three ways a hook used to hurt migd: a hang inside a child command (only the shell was killed,
    the child lived on as root, one more per retry: the whole group is killed now); a helper left in
    the background holding stdout (end-of-file never came, so every apply timed out: the hook's exit
    is what is waited for now); and output without end (migd kept all of it: now the last 64 KiB)."""
    proc = subprocess.Popen(list(hook.argv), env=dict(env), cwd=hook.workdir, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    tail = bytearray()
    deadline = time.monotonic() + hook.timeout_s
    try:
        open_ = True
        while proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill_group(proc)
                return Outcome(None, _last_line(tail))
            if open_ and select.select([fd], [], [], min(left, 0.1))[0]:
                open_ = _read_some(fd, tail)
            elif not open_:
                time.sleep(min(left, 0.02))
        drain = time.monotonic() + DRAIN_S
        while open_ and time.monotonic() < drain and select.select([fd], [], [], 0.02)[0]:
            open_ = _read_some(fd, tail)
        return Outcome(proc.returncode, _last_line(tail))
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            _kill_group(proc)


def _read_some(fd: int, tail: bytearray) -> bool:
    """Read what is there into ``tail`` (trimmed to OUTPUT_KEPT); False at end of file."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return True
    tail += chunk
    del tail[:-OUTPUT_KEPT]
    return bool(chunk)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _last_line(tail: bytearray) -> str:
    lines = tail.decode(errors="replace").strip().splitlines()
    return "".join(c if c.isprintable() else "?" for c in lines[-1][:300]) if lines else ""


def parse_hooks(node: object, strict: bool = True) -> Hooks:
    """``{phase: [{command: [argv...], timeout: 60s, workdir: DIR}]}`` from a located YAML node, or
    mig-parted's form ``{command: PROGRAM, args: [...], envs: {K: V}, workdir: DIR}``
    (api/hooks/v1/hooks.go HookSpec; run with exec.Command, no shell, as here).

    With ``strict`` (like sshd's StrictModes) a hook program that group or others may rewrite
    is refused: it runs as root whenever the GPUs are reconfigured."""
    from migd.yamlsrc import Node, excerpt

    if not isinstance(node, Node):
        raise TypeError(f"parse_hooks takes a located YAML node, not {type(node).__name__}")
    phases: dict[str, list[Hook]] = {}
    for phase, items in node.mapping(allowed=PHASES).items():
        hooks = []
        for item in items.items():
            m = item.mapping(allowed=["command", "args", "envs", "timeout", "workdir"], required=["command"])
            command = m["command"]
            argv = (command.arg(),) if command.is_scalar() else tuple(x.arg() for x in command.items())
            argv += tuple(x.arg() for x in m["args"].items()) if "args" in m else ()
            env = m["envs"].environment() if "envs" in m else ()
            if not argv:
                raise m["command"].error("must list the program and its arguments")
            if not os.path.isabs(argv[0]):
                raise m["command"].error(f"{excerpt(argv[0])} must be an absolute path (hooks run without a shell or "
                                         "PATH)")
            if not os.path.isfile(argv[0]):  # a missing hook created later by someone else would run as root
                raise m["command"].error(f"{excerpt(argv[0])} does not exist (or is not a file)")
            if strict:
                try:
                    check_path(argv[0], "hook program")
                except ValidationError as e:
                    raise m["command"].error(e.message) from None
            timeout = m["timeout"].duration() if "timeout" in m else 60.0
            hooks.append(Hook(argv=argv, timeout_s=timeout, workdir=m["workdir"].arg() if "workdir" in m else None,
                              env=env, strict=strict))
        phases[phase] = hooks
    return Hooks(phases)
