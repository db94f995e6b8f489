"""Commands run around a change, like mig-parted's hooks: argument lists, no shell, a timeout."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Hooks:
    phases: Mapping[str, Sequence[Hook]] = field(default_factory=dict)

    def run(self, phase: str, env: Mapping[str, str]) -> None:
        """Run a phase's hooks in order; a failing hook (except at apply-exit) stops the apply."""
        for hook in self.phases.get(phase, ()):
            full_env = {**os.environ, **dict(hook.env), **env, "MIGD_HOOK_PHASE": phase}
            log.info("hook %s: %s", phase, " ".join(hook.argv))
            try:
                proc = subprocess.run(list(hook.argv), env=full_env, cwd=hook.workdir, capture_output=True,
                                      text=True, timeout=hook.timeout_s, check=False, shell=False)
            except subprocess.TimeoutExpired:
                self._fail(phase, f"hook {hook.argv[0]} timed out after {hook.timeout_s:g}s")
                continue
            except OSError as e:
                self._fail(phase, f"hook {hook.argv[0]} could not run: {e}")
                continue
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                self._fail(phase, f"hook {hook.argv[0]} exited {proc.returncode}: {tail[0]}")

    @staticmethod
    def _fail(phase: str, msg: str) -> None:
        if phase == "apply-exit":
            log.warning("%s (ignored at apply-exit)", msg)
            return
        raise HookError(f"{phase}: {msg}")


def parse_hooks(node: object, strict: bool = True) -> Hooks:
    """``{phase: [{command: [argv...], timeout: 60s, workdir: DIR}]}`` from a located YAML node, or
    mig-parted's form ``{command: PROGRAM, args: [...], envs: {K: V}, workdir: DIR}``
    (api/hooks/v1/hooks.go HookSpec; run with exec.Command, no shell, as here).

    With ``strict`` (like sshd's StrictModes) a hook program that group or others may rewrite
    is refused: it runs as root whenever the GPUs are reconfigured."""
    from migd.trust import check_path
    from migd.yamlsrc import Node, ValidationError

    if not isinstance(node, Node):
        raise TypeError(f"parse_hooks takes a located YAML node, not {type(node).__name__}")
    phases: dict[str, list[Hook]] = {}
    for phase, items in node.mapping(allowed=PHASES).items():
        hooks = []
        for item in items.items():
            m = item.mapping(allowed=["command", "args", "envs", "timeout", "workdir"], required=["command"])
            command = m["command"]
            argv = (command.str(),) if command.is_scalar() else tuple(x.str() for x in command.items())
            argv += tuple(x.str() for x in m["args"].items()) if "args" in m else ()
            env = tuple((k, v.str()) for k, v in m["envs"].mapping().items()) if "envs" in m else ()
            if not argv:
                raise m["command"].error("must list the program and its arguments")
            if not os.path.isabs(argv[0]):
                raise m["command"].error(f"{argv[0]!r} must be an absolute path (hooks run without a shell or PATH)")
            if strict and os.path.exists(argv[0]):
                try:
                    check_path(argv[0], "hook program")
                except ValidationError as e:
                    raise m["command"].error(e.message) from None
            timeout = m["timeout"].duration() if "timeout" in m else 60.0
            hooks.append(Hook(argv=argv, timeout_s=timeout, workdir=m["workdir"].str() if "workdir" in m else None,
                              env=env))
        phases[phase] = hooks
    return Hooks(phases)
