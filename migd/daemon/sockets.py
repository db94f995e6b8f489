"""migd's two sockets: the control socket (root's) and the read-only socket every local user may reach.

Why a module of its own: they are bound once, while migd still waits for the NVIDIA driver, and the daemon
takes them over, so there is no moment where neither listens (a second migd could claim the path in one).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from migd import paths
from migd.daemon.answers import Reloaded
from migd.daemon.server import AlreadyRunning, ControlServer, Handlers, refusing
from migd.errors import ValidationError
from migd.paths import socket_too_long

log = logging.getLogger("migd")


@dataclass
class Sockets:
    """migd's control socket and read-only socket, each bound once: while migd waits for the driver they
    refuse every request with the wait (``migctl daemon`` said no migd listened, and a second migd
    started beside it), then the daemon takes them over, with no moment where neither listens."""

    path: Path
    control: ControlServer | None = None
    viewer: ControlServer | None = None

    def answer(self, handlers: Handlers) -> None:
        if self.control is None:
            self.control = ControlServer(self.path, handlers)
            self.control.start()
            self.viewer = viewer(paths.status_socket(self.path), handlers)
            return
        self.control.take(handlers)
        if self.viewer is not None:  # (one that could not be made was said once, at the wait)
            self.viewer.take(handlers)

    def waiting(self, said: Callable[[], str], reload: Callable[[], Reloaded]) -> Callable[[], None]:
        """``open_nvml``'s answer: refusing with ``said()`` (``reload``: what answers a reload meanwhile);
        what it returns closes them."""
        try:
            self.answer(refusing(said, reload))
        except (OSError, ValidationError, AlreadyRunning) as e:  # (the daemon's own binding says it again)
            log.error("no control socket while waiting for the NVIDIA driver: %s", e)
        return self.close

    def close(self) -> None:
        for server in (self.control, self.viewer):
            if server is not None:
                server.close()
        self.control = self.viewer = None


def viewer(path: Path, handlers: Handlers) -> ControlServer | None:
    """The read-only socket (mode 0666) in a directory others may look into but not write; a missing
    or unsafe directory costs only this socket: said once, and migd serves on."""
    try:
        with contextlib.suppress(FileExistsError):
            path.parent.mkdir(mode=0o755)
            os.chmod(path.parent, 0o755)  # (whatever the umask)
        st = path.parent.lstat()
        if not os.path.isdir(path.parent) or os.path.islink(path.parent) or st.st_uid != os.geteuid() \
                or st.st_mode & 0o022:
            raise OSError(f"{path.parent} must be a directory of this user that others cannot write")
        if (why := socket_too_long(path)) is not None:
            raise OSError(f"{path}: {why}")
        server = ControlServer(path, handlers, mode=0o666, read_only=True)
    except OSError as e:
        log.error("no read-only socket for ordinary users (migctl status/daemon as non-root): %s", e)
        return None
    server.start()
    return server
