"""Shared pytest fixtures, and the check that a test session leaves nothing behind."""

from __future__ import annotations

import glob
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from actorrl.runtime.node.forking import KEPT, KEPT_FORK_SERVERS_IGNORE_ENV
from actorrl.runtime.sessions import pid_alive
from tests.helpers.procs import NO_TORCH_PRELOAD, descendants, pids_alive

# The suite starts hundreds of interpreters (drivers, CLI runs, fork servers, node agents).
# Where the environment turns bytecode writing off (PYTHONDONTWRITEBYTECODE, as this CI
# image does), each of them compiles actorrl's modules again (~0.25 s of CPU) and every
# pytest worker rewrites every test module again: cache the bytecode for this run's
# processes instead (pytest reads ``sys.dont_write_bytecode`` when it rewrites a module).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# pytest sets PYTEST_CURRENT_TEST per test phase; nothing reads it while a fork server
# imports, so the process's kept fork servers may be taken over across tests.
os.environ[KEPT_FORK_SERVERS_IGNORE_ENV] = ",".join(
    filter(None, [os.environ.get(KEPT_FORK_SERVERS_IGNORE_ENV), "PYTEST_CURRENT_TEST"]))

GROUPS = ("unit", "process", "cluster", "learning")
"""What a test proves, one marker each (registered in pyproject.toml): ``pytest -m unit``,
``pytest -m "not learning"`` (the fast part) and so on."""
UNIT_MODULES = {
    "test_actor_critic", "test_atari", "test_codec", "test_config_components", "test_dqn",
    "test_envs", "test_experiment", "test_frame_replay", "test_frames", "test_impala_policy",
    "test_layering", "test_learner", "test_metrics", "test_models", "test_paired_lstm",
    "test_readme", "test_replay", "test_rollout", "test_timeouts", "test_vtrace"}
"""Modules whose tests run in this process only (no child processes)."""
CLUSTER_MODULES = {"test_cluster", "test_node_join"}
"""Modules that start coordinators and node agents."""
LEARNING_MODULES = {"test_learning", "test_learning_pixels"}
"""Modules of trainings to a reward threshold. Elsewhere such a test is marked
``learning`` (or ``slow``, its older name) itself; any other module is ``process``."""


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``), give each worker a temp folder of its own (``TMPDIR``,
    inherited by every process its tests start): runtimes sweep the folders of dead owners
    in their temp folder, and the leak check below looks there, so one worker neither
    sweeps another's session folders nor counts them as its own leaks."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        # Short (ipc socket paths must fit 107 bytes) and not matching ``actorrl-*``.
        folder = tempfile.mkdtemp(prefix=f"arlx-{worker}-")
        os.environ["TMPDIR"] = folder
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        config.arl_worker_tmpdir = folder  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove a worker's temp folder (what is left in it was reported as a leak)."""
    folder = getattr(config, "arl_worker_tmpdir", None)
    if folder:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every test exactly one group marker of :data:`GROUPS` (an explicit one wins)."""
    for item in items:
        if any(item.get_closest_marker(group) for group in GROUPS):
            continue
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if item.get_closest_marker("slow") or module in LEARNING_MODULES:
            group = "learning"
        elif module in UNIT_MODULES:
            group = "unit"
        elif module in CLUSTER_MODULES:
            group = "cluster"
        else:
            group = "process"
        item.add_marker(group)


EXIT_GRACE_S = 15.0
"""How long processes still exiting at the end of the session may take."""


def _temp_entries() -> set[str]:
    """This user's ``actorrl-*`` entries in the temp folder and in /dev/shm."""
    paths = glob.glob(os.path.join(tempfile.gettempdir(), "actorrl-*"))
    paths += glob.glob("/dev/shm/actorrl*")
    mine = set()
    for path in paths:
        try:
            if os.lstat(path).st_uid == os.getuid():
                mine.add(path)
        except OSError:
            continue
    return mine


SHM_OWNER = re.compile(r"actorrl-shm\.\d+\.(\d+)\.")
"""A shared-memory segment's name holds the pid of the process that made it."""


def _of_another_pytest_run(path: str, basetemp: Path) -> bool:
    """An ipc socket folder (``actorrl-ipc-*``) standing in for a session directory under
    another pytest run's base temp folder: that run's, not a leak of this one."""
    try:
        owner_dir = Path(path, "for").read_text()
    except OSError:
        return False
    return "/pytest-of-" in owner_dir and not owner_dir.startswith(str(basetemp))


def _owned_by_other_live_process(path: str) -> bool:
    """A session folder whose owner (``owner.pid``), or a shared-memory segment whose maker,
    is another live process (not one of this session's): another test run or training on
    this machine, not a leak of this one."""
    shm_owner = SHM_OWNER.search(os.path.basename(path))
    try:
        pid = int(shm_owner.group(1) if shm_owner
                  else Path(path, "owner.pid").read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    if pid in (0, os.getpid()) or pid in descendants(os.getpid()):
        return False
    return pid_alive(pid)


FIRST_SEEN: dict[int | str, str] = {}
"""Process id or temp path -> the test after which it was first seen running or present
(so a leak names the test that left it)."""


@pytest.fixture
def light_fork_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fork servers started by the test preload numpy only, not torch (``ACTORRL_FORK_PRELOAD``):
    for modules whose actors are plain test actors, so each runtime starts in a fraction of
    a second instead of importing torch (~2 s of CPU) for nothing."""
    for name, value in NO_TORCH_PRELOAD.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(autouse=True)
def note_what_each_test_leaves(request: pytest.FixtureRequest):
    """After each test: remember which processes and temp entries first appeared by then
    (processes of module fixtures are legitimately shared; only what is left at the end
    of the session is a leak, and then this names its test)."""
    yield
    for item in (*descendants(os.getpid()), *_temp_entries()):
        FIRST_SEEN.setdefault(item, request.node.nodeid)


def _named(items: list) -> list[str]:
    return [f"{item} (left by {FIRST_SEEN.get(item, 'a fixture teardown')})" for item in items]


def kept_fork_servers_check(kept_servers=None) -> tuple[set[int], list[str]]:
    """The pids of this process's kept fork servers (``kept_servers``: a
    :class:`~actorrl.runtime.node.forking.KeptForkServers`, default ``KEPT``), and what is wrong
    with them: a kept server is a legitimate process of ours only while it is alive, idle
    (no child, no request), bound to the process's lifeline (so it dies with it) and within
    the kept count. Checked before the session's leak check stops them."""
    kept_servers = KEPT if kept_servers is None else kept_servers
    servers = kept_servers.servers
    problems = []
    if len(servers) > kept_servers.max_kept:
        problems.append(f"{len(servers)} kept, more than the limit of "
                        f"{kept_servers.max_kept}: pids "
                        f"{_named([s.process.pid for s in servers])}")
    for server in servers:
        pid = server.process.pid
        if server.process.popen.poll() is not None:
            problems.append(f"kept server {pid} has exited")
        elif not server.idle or descendants(pid):
            problems.append(f"kept server {_named([pid])[0]} is not idle (children "
                            f"{sorted(descendants(pid))})")
        if server.lifeline is not kept_servers.lifeline:
            problems.append(f"kept server {_named([pid])[0]} does not watch the process's "
                            "lifeline")
    return {s.process.pid for s in servers}, problems


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(tmp_path_factory: pytest.TempPathFactory):
    """After the whole session: no actor, zygote or server process of ours still runs, and
    no ``actorrl-*`` temp folder or shared-memory segment created during it remains
    (SIGKILLed drivers included: the runtime must clean up after them). Each leak is
    named with the test after which it first appeared."""
    before = _temp_entries()
    yield
    kept, kept_problems = kept_fork_servers_check()
    # Every other process of ours must exit; the kept servers are counted too, after
    # being checked above (idle, within the limit) and then stopped: they must exit.
    others = pids_alive(sorted(descendants(os.getpid()) - kept), EXIT_GRACE_S)
    KEPT.stop_all()  # fork servers kept for a next runtime that no test will start now
    still_running = others + pids_alive(sorted(kept), EXIT_GRACE_S)
    basetemp = tmp_path_factory.getbasetemp()
    left = sorted(p for p in _temp_entries() - before if not _owned_by_other_live_process(p)
                  and not _of_another_pytest_run(p, basetemp))
    assert not kept_problems, f"kept fork servers leaked: {kept_problems}"
    assert not still_running, f"processes left running after the tests: {_named(still_running)}"
    assert not left, f"temp folders or shared-memory segments left after the tests: {_named(left)}"
