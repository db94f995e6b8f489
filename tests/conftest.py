from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from migd.hardware.nvml.backend import NvmlBackend
from migd.sim.backend import sim_backend
from migd.sim.filewatch import FileWatch
from migd.sim.library import loaded
from migd.sim.state import StateStore
from tests.installed import elsewhere
from tests.slurm_node import night_node, node, shared_partition_node  # noqa: F401  (the Slurm tests' fixtures)

REPO = Path(__file__).resolve().parents[1]
FACTS_DIR = REPO / "tests" / "fixtures" / "reference"  # copies, see SOURCES.md there


def pytest_configure(config: pytest.Config) -> None:
    """Stop before any test where the tests' processes would import another migd (tests/installed.py)."""
    if not hasattr(config, "workerinput"):  # (once, in the process that starts pytest-xdist's workers)
        why = elsewhere(REPO, sys.executable, os.environ)
        if why is not None:
            pytest.exit(why, returncode=pytest.ExitCode.USAGE_ERROR)


# -- unit tests and integration tests (README, Contributing) ----------------------------------------
# A test that starts a process (a migd daemon, migctl or the fake nvidia-smi as a program, Slurm,
# Prometheus, Chromium, a namespace, a forked child) is an integration test and says so:
# ``@pytest.mark.integration``, or ``pytestmark = pytest.mark.integration`` for a whole module; so is
# an in-process test that takes seconds.  ``pytest -m "not integration"`` is the fast loop.  Kept, not
# remembered: while an unmarked test sets up and runs, every way to start a process fails it.
_SPAWNERS = ((os, "fork", "os.fork"), (os, "forkpty", "os.forkpty"), (os, "posix_spawn", "os.posix_spawn"),
             (os, "posix_spawnp", "os.posix_spawnp"), (os, "system", "os.system"),
             (subprocess, "_fork_exec", "subprocess"), (_posixsubprocess, "fork_exec", "subprocess or multiprocessing"))


def _unit_message(item: pytest.Item, how: str) -> str:
    return (f"{item.nodeid} starts a process ({how}) but is not marked integration: mark it "
            "@pytest.mark.integration (a whole module: pytestmark = pytest.mark.integration); "
            "`pytest -m \"not integration\"` runs in-process tests only")


# Parallel (pytest-xdist, --dist loadgroup): each test has its own tmp_path, ports and simulated node.  One
# thing a simulated node cannot have of its own: the device numbers of its capability nodes (real
# character devices, the same major and minors on every simulated node), and migd finds who holds an
# instance's node by its number in all of /proc, as on a real node.  The tests that boot capability
# nodes, open them or run migd with access by owner (the sampled crash matrix's owner changes too) are one
# group, run by one worker one after another: pytestmark = pytest.mark.xdist_group("caps").

# pytest-xdist groups a test by a suffix it writes into the test's node id (``...::test@caps``); pytest
# 9.2 keeps node ids where that write no longer reaches (pytest-dev/pytest-xdist#1386, open), so the
# groups are silently dealt out round-robin and the "caps" tests collide at random.  pyproject.toml keeps
# pytest below 9.2; under any other combination that loses the groups, each grouped test fails at once
# with one line that says why, rather than at random with what the collision broke.
_GROUPS_LOST = pytest.StashKey[str]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.getoption("loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and not _suffixed(i.nodeid)]
    if lost:
        session.config.stash[_GROUPS_LOST] = (
            f"pytest-xdist's --dist loadgroup does not group the tests marked xdist_group ({len(lost)}) under "
            f"pytest {pytest.__version__} (pytest-dev/pytest-xdist#1386), so they would run side by side: "
            "pip install 'pytest<9.2', as pyproject.toml's test extra asks")


def _suffixed(nodeid: str) -> bool:
    """Whether pytest-xdist wrote its group into the id (``...@caps``; an ``@`` inside a parameter's
    brackets is not it: xdist's own reading, loadgroup.py)."""
    return nodeid.rfind("@") > nodeid.rfind("]")


@pytest.fixture(autouse=True)
def grouped_as_marked(request: pytest.FixtureRequest) -> None:
    lost = request.config.stash.get(_GROUPS_LOST, None)
    if lost is not None and request.node.get_closest_marker("xdist_group") is not None:
        pytest.fail(lost, pytrace=False)


# Longest first: xdist hands out one test at a time as workers free up (after the "caps" group, the largest
# unit), so the integration tests, which take seconds each, go out before the in-process ones, which then
# fill the gaps at the end instead of leaving three workers idle while a late slow test runs on the fourth.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("integration") is None)  # a stable sort


# A suite started in the background of a script (`pytest &`, nohup) inherits SIGINT ignored, and so would
# every migctl it starts: the tests of Ctrl-C (migctl's cancel) need it delivered, however pytest was run.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The simulator's event wait finds libc once per process (ctypes.util.find_library runs ldconfig): that
# one child starts here, not in whichever unit test first waits for an event.
FileWatch(__file__)


@contextlib.contextmanager
def _no_processes(item: pytest.Item) -> Iterator[list[BaseException]]:
    refusals: list[BaseException] = []
    saved = [(mod, name, how, getattr(mod, name)) for mod, name, how in _SPAWNERS if hasattr(mod, name)]

    def refuse(how: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            try:
                pytest.fail(_unit_message(item, how))
            except BaseException as e:
                refusals.append(e)
                raise
        return refused

    for mod, name, how, _ in saved:
        setattr(mod, name, refuse(how))
    try:
        yield refusals
    finally:
        for mod, name, _, real in saved:
            setattr(mod, name, real)


def _unit_only(item: pytest.Item) -> Generator[None, object, object]:
    __tracebackhide__ = True
    if item.get_closest_marker("integration") is not None:
        return (yield)
    with _no_processes(item) as refusals:
        try:
            result = yield
        except BaseException as e:
            if not refusals or e is refusals[0]:
                raise  # (the refusal itself, where the test started the process)
        if refusals:  # the test, or a thread of it, caught the refusal, or failed of it otherwise
            raise refusals[0]
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _unit_only(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _unit_only(item))


@pytest.fixture(autouse=True)
def no_leaked_nvml_session() -> Iterator[None]:
    """A test that leaves NVML initialised holds every simulated GPU (a reset would be refused, an
    Ampere mode change stays pending) for the tests after it: close what you open."""
    yield
    lib = loaded()
    if lib is not None and lib.init_count > 0:
        leaked = lib.init_count
        with lib.store.transaction() as state:
            lib.register_client(state, os.getpid(), -leaked)
        lib.init_count = 0
        pytest.fail(f"the test left {leaked} NVML session(s) initialised (close the backend)")


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    return FACTS_DIR


@pytest.fixture(scope="session")
def facts() -> dict[str, Any]:
    path = FACTS_DIR / "mig-facts.yaml"
    if not path.exists():
        raise FileNotFoundError(path)
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.fixture
def make_backend(tmp_path: Path) -> Iterator[Callable[..., tuple[NvmlBackend, StateStore, Path]]]:
    """Build the production NVML backend over a fresh simulated fleet in tmp_path."""
    made: list[NvmlBackend] = []

    def make(fleet: str = "dgx-a100", mig_enabled: bool = False, name: str = "sim.json") -> tuple[
            NvmlBackend, StateStore, Path]:
        path = tmp_path / name
        backend = sim_backend(path, fleet, mig_enabled)
        made.append(backend)
        return backend, StateStore(path), path

    yield make
    for b in made:
        try:
            b.close()
        except Exception:
            pass
