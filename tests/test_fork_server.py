"""The fork server: actors forked from one process that imported torch once.

The rest of the suite runs with the default start method (fork), so every runtime, kill,
restart and no-orphan test exercises forked actors too; these tests check what forking
itself must get right.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from actorrl.runtime.driver import Driver
from actorrl.runtime.errors import ActorDiedError
from actorrl.runtime.node.fork_server import preload_for_class
from actorrl.runtime.node.forking import (
    KEPT,
    ForkedProcess,
    ForkServerClient,
    KeptForkServers,
    resolve_start_method,
)
from actorrl.runtime.node.process import ChildProcess
from tests.helpers.procs import pids_alive

INFO = "tests.actors.process_info:ProcessInfo"


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def test_forked_actors_are_children_of_one_server_that_imported_torch():
    """Every actor is a child of the same fork server (itself a child of the driver), was
    built with torch already imported and is named after its class; the server runs a
    single thread (nothing that does not survive fork)."""
    async with Driver.start(start_method="fork") as driver:
        actors = [await driver.create_actor(INFO) for _ in range(2)]
        parents = {await driver.get(a.parent.remote(), timeout_s=30) for a in actors}
        assert len(parents) == 1
        server_pid = parents.pop()
        assert server_pid != os.getpid()
        assert Path(f"/proc/{server_pid}/stat").read_text().split()[3] == str(os.getpid())
        assert _threads(server_pid) == 1
        for actor in actors:
            process = driver.node.process_of(actor)
            assert isinstance(process, ForkedProcess)
            assert await driver.get(actor.had_torch_before_first_call.remote(), timeout_s=30)
            # Named after the actor for ps/top (the command line is the server's).
            assert Path(f"/proc/{process.pid}/comm").read_text().strip() == "arl:ProcessInfo"


async def test_the_preload_list_comes_from_the_environment_when_set(monkeypatch):
    """``ACTORRL_FORK_PRELOAD`` replaces what the server imports: with ``json`` only, an
    actor starts without torch; unset, with it (the previous test)."""
    monkeypatch.setenv("ACTORRL_FORK_PRELOAD", "json")
    async with Driver.start(start_method="fork") as driver:
        actor = await driver.create_actor(INFO)
        assert not await driver.get(actor.had_torch_before_first_call.remote(), timeout_s=30)


async def test_the_server_imports_what_an_actor_class_lists_before_forking_it(monkeypatch):
    """The modules an actor class lists in ``FORK_PRELOAD`` are imported by the server
    before it forks the first actor of that class, and later forks share them. Only a
    class whose module the server has loaded is asked (here through the preload list):
    the server never imports an actor's own code."""
    monkeypatch.setenv("ACTORRL_FORK_PRELOAD", "tests.actors.process_info")
    async with Driver.start(start_method="fork") as driver:
        actors = [await driver.create_actor(f"tests.actors.process_info:{name}")
                  for name in ("ProcessInfo", "NeedsColorsys", "ProcessInfo")]
        seen = await driver.get([a.had_module_at_start.remote("colorsys") for a in actors],
                                timeout_s=30)
    assert seen == [False, True, True]
    assert preload_for_class("tests.actors.not_a_loaded_module:Anything") == []
    assert "tests.actors.not_a_loaded_module" not in sys.modules


async def test_forked_actors_share_the_servers_memory_spawned_ones_do_not():
    """A forked actor shares the server's written pages (the imported modules): tens of MB
    of shared dirty memory, against next to none for a spawned interpreter."""
    async with Driver.start(start_method="fork") as driver:
        forked = await driver.create_actor(INFO)
        forked_kb = await driver.get(forked.shared_dirty_kb.remote(), timeout_s=30)
    async with Driver.start(start_method="spawn") as driver:
        spawned = await driver.create_actor(INFO)
        assert isinstance(driver.node.process_of(spawned), ChildProcess)
        spawned_kb = await driver.get(spawned.shared_dirty_kb.remote(), timeout_s=30)
    assert forked_kb > 20_000, forked_kb
    assert spawned_kb < forked_kb / 4, (spawned_kb, forked_kb)


async def test_forked_actors_get_their_own_rng_threads_and_environment(monkeypatch):
    """Global numpy/torch generators are reseeded per actor; torch's thread count follows
    the CPU request; the environment is the driver's at creation time (not the server's
    at its start) plus the actor's own, and CPU actors see no GPU."""
    async with Driver.start(start_method="fork") as driver:
        await driver.node.fork_server.ready  # the server's environment is fixed by now
        monkeypatch.setenv("ACTORRL_TEST_LATE_VARIABLE", "late")
        one = await driver.create_actor(INFO, num_cpus=1)
        two = await driver.create_actor(INFO, num_cpus=2, env={"ACTORRL_TEST_OWN": "mine"})
        draws = await driver.get([one.draws.remote(), two.draws.remote()], timeout_s=30)
        assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1]
        assert await driver.get(one.torch_threads.remote(), timeout_s=30) == 1
        assert await driver.get(two.torch_threads.remote(), timeout_s=30) == 2
        assert await driver.get(one.env.remote("ACTORRL_TEST_LATE_VARIABLE")) == "late"
        assert await driver.get(two.env.remote("ACTORRL_TEST_OWN")) == "mine"
        assert await driver.get(one.env.remote("ACTORRL_TEST_OWN")) is None
        assert await driver.get(one.env.remote("CUDA_VISIBLE_DEVICES")) == ""


async def test_forked_actor_output_goes_to_its_own_log():
    """What a forked actor prints lands in its own log file, not the server's."""
    async with Driver.start(start_method="fork") as driver:
        actor = await driver.create_actor(INFO, args=("hello from the forked actor",))
        process = driver.node.process_of(actor)
        await driver.get(actor.pid.remote(), timeout_s=30)
        assert "hello from the forked actor" in process.log_tail()
        server_log = Path(driver.session_dir, "logs", "fork-server.log").read_text()
        assert "hello from the forked actor" not in server_log


async def test_a_killed_fork_server_takes_its_actors_and_is_restarted():
    """SIGKILL of the fork server kills its actors (reported dead, with the exit seen
    through their pidfds); the next actor comes from a fresh server."""
    async with Driver.start(start_method="fork") as driver:
        actor = await driver.create_actor(INFO)
        actor_pid = await driver.get(actor.pid.remote(), timeout_s=30)
        server = driver.node.fork_server
        deaths: list[str] = []
        driver.node.on_death.append(lambda actor_id, reason: deaths.append(actor_id))
        os.kill(server.process.pid, signal.SIGKILL)
        assert await driver.node.process_of(actor).wait(30) == -signal.SIGKILL
        assert deaths == [actor.actor_id]
        with pytest.raises(ActorDiedError, match="killed by SIGKILL"):
            await driver.get(actor.pid.remote(), timeout_s=30)
        assert pids_alive([actor_pid], timeout_s=10) == []
        again = await driver.create_actor(INFO)
        assert driver.node.fork_server is not server
        assert await driver.get(again.pid.remote(), timeout_s=30) != actor_pid


def _running(server: ForkServerClient) -> bool:
    return server.process.popen.poll() is None


async def test_shutdown_stops_every_actor_and_the_next_node_takes_over_the_idle_server():
    """After shutdown no actor it forked is alive. The server, idle, is kept: the process's
    next node takes it over (no second torch import), and the server then writes into that
    node's own log folder. ``KEPT.stop_all`` stops it."""
    KEPT.stop_all()
    async with Driver.start(start_method="fork") as driver:
        actors = [await driver.create_actor(INFO) for _ in range(3)]
        pids = await driver.get([a.pid.remote() for a in actors], timeout_s=30)
        server = driver.node.fork_server
    assert pids_alive(pids, timeout_s=10) == []
    assert _running(server) and len(KEPT) == 1
    async with Driver.start(start_method="fork") as driver:
        assert driver.node.fork_server is server and len(KEPT) == 0
        actor = await driver.create_actor(INFO)
        assert await driver.get(actor.parent.remote(), timeout_s=30) == server.process.pid
        assert await driver.get(actor.had_torch_before_first_call.remote(), timeout_s=30)
        server_log = Path(driver.session_dir, "logs", "fork-server.log")
        assert f"fork server {server.process.pid}: serving a new node" in server_log.read_text()
    KEPT.stop_all()
    assert not _running(server) and len(KEPT) == 0


async def test_only_a_node_with_the_same_environment_takes_a_kept_server(monkeypatch):
    """A node whose environment differs (here what the server preloads) starts a server of
    its own, and both are kept; with ``ACTORRL_KEPT_FORK_SERVERS=0`` a node takes none and
    its server stops with it."""
    KEPT.stop_all()
    async with Driver.start(start_method="fork") as driver:
        full = driver.node.fork_server
    monkeypatch.setenv("ACTORRL_FORK_PRELOAD", "json")
    async with Driver.start(start_method="fork") as driver:
        light = driver.node.fork_server
        assert light is not full
        actor = await driver.create_actor(INFO)
        assert not await driver.get(actor.had_torch_before_first_call.remote(), timeout_s=30)
    assert _running(full) and _running(light) and len(KEPT) == 2
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS", "0")
    async with Driver.start(start_method="fork") as driver:
        own = driver.node.fork_server
        assert own not in (full, light)
    assert not _running(own) and len(KEPT) == 2
    KEPT.stop_all()
    assert not _running(full) and not _running(light)


async def test_another_working_directory_or_variable_starts_another_server(monkeypatch,
                                                                         tmp_path):
    """A node in another working directory, or with one more environment variable, does
    not take a kept server over; a variable named in ``ACTORRL_KEPT_FORK_SERVERS_IGNORE``
    may differ (the suite names ``PYTEST_CURRENT_TEST`` there: product code does not)."""
    KEPT.stop_all()
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS", "4")
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS_IGNORE", "ARL_PER_RUN_NOTE")
    monkeypatch.setenv("ARL_PER_RUN_NOTE", "first")
    async with Driver.start(start_method="fork") as driver:
        first = driver.node.fork_server
    monkeypatch.setenv("ARL_PER_RUN_NOTE", "second")
    async with Driver.start(start_method="fork") as driver:
        assert driver.node.fork_server is first, "an ignored variable changed the match"
    monkeypatch.chdir(tmp_path)
    async with Driver.start(start_method="fork") as driver:
        elsewhere = driver.node.fork_server
        assert elsewhere is not first, "a kept server was taken in another directory"
    monkeypatch.undo()  # back to the first directory and variables, then one more
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS", "4")
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS_IGNORE", "ARL_PER_RUN_NOTE")
    monkeypatch.setenv("ARL_ANOTHER_SETTING", "1")
    async with Driver.start(start_method="fork") as driver:
        other = driver.node.fork_server
        assert other not in (first, elsewhere), "a kept server was taken with another env"
    assert len(KEPT) == 3 and all(_running(s) for s in (first, elsewhere, other))
    KEPT.stop_all()


async def test_edited_modules_start_another_server(monkeypatch, tmp_path):
    """A kept server imported the modules as they were: once one of them is edited (its
    mtime or size changes), the next node starts a server that imports them afresh."""
    import actorrl.runtime.node.forking as forking

    source = tmp_path / "pkg"
    source.mkdir()
    module = source / "mod.py"
    module.write_text("VALUE = 1\n")
    monkeypatch.setattr(forking, "_SOURCE_ROOTS", (str(source),))
    KEPT.stop_all()
    async with Driver.start(start_method="fork") as driver:
        first = driver.node.fork_server
    async with Driver.start(start_method="fork") as driver:
        assert driver.node.fork_server is first
    module.write_text("VALUE = 22\n")
    async with Driver.start(start_method="fork") as driver:
        assert driver.node.fork_server is not first
    KEPT.stop_all()


async def test_the_leak_check_sees_kept_servers_past_their_limit(monkeypatch):
    """The session's leak check (tests/conftest.py) checks the kept servers before it stops
    them: two kept under a limit of two pass, the same two under a limit of one are named."""
    from tests.conftest import kept_fork_servers_check

    KEPT.stop_all()
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS", "2")
    async with Driver.start(start_method="fork") as driver:
        first = driver.node.fork_server
    monkeypatch.setenv("ACTORRL_FORK_PRELOAD", "json")
    async with Driver.start(start_method="fork") as driver:
        second = driver.node.fork_server
    assert kept_fork_servers_check() == ({first.process.pid, second.process.pid}, [])
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS", "1")
    _, problems = kept_fork_servers_check()
    assert len(problems) == 1 and "2 kept, more than the limit of 1" in problems[0], problems
    KEPT.stop_all()


async def test_past_the_kept_count_the_oldest_kept_server_stops(monkeypatch):
    """With ``ACTORRL_KEPT_FORK_SERVERS=1``, keeping a second idle server (another
    environment) stops the one kept before."""
    KEPT.stop_all()
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS", "1")
    async with Driver.start(start_method="fork") as driver:
        first = driver.node.fork_server
    monkeypatch.setenv("ACTORRL_FORK_PRELOAD", "json")
    async with Driver.start(start_method="fork") as driver:
        second = driver.node.fork_server
    assert not _running(first) and _running(second) and len(KEPT) == 1
    KEPT.stop_all()
    assert not _running(second)


async def test_a_kept_server_that_died_is_replaced():
    """A kept server killed while idle is not handed to the next node, which starts a new
    one and forks its actors from it."""
    KEPT.stop_all()
    async with Driver.start(start_method="fork") as driver:
        server = driver.node.fork_server
    os.kill(server.process.pid, signal.SIGKILL)
    assert pids_alive([server.process.pid], timeout_s=10) == []
    async with Driver.start(start_method="fork") as driver:
        assert driver.node.fork_server is not server and len(KEPT) == 0
        actor = await driver.create_actor(INFO)
        assert await driver.get(actor.parent.remote(), timeout_s=30) == \
            driver.node.fork_server.process.pid
    assert not _running(server)


def test_the_kept_server_count_must_be_a_count(monkeypatch):
    """``ACTORRL_KEPT_FORK_SERVERS`` that is no count is refused, naming the variable."""
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS", "many")
    with pytest.raises(ValueError, match="ACTORRL_KEPT_FORK_SERVERS='many' is not a count"):
        assert KeptForkServers().max_kept is None  # raises first
    monkeypatch.setenv("ACTORRL_KEPT_FORK_SERVERS", "3")
    assert KeptForkServers().max_kept == 3


def test_start_method_switch(monkeypatch):
    """``spawn`` and ``fork`` are accepted (argument first, then the environment); any
    other value is refused saying what the choices mean."""
    monkeypatch.setenv("ACTORRL_START_METHOD", "spawn")
    assert resolve_start_method() == "spawn"
    assert resolve_start_method("fork") == "fork"
    monkeypatch.delenv("ACTORRL_START_METHOD")
    assert resolve_start_method() == "fork"
    with pytest.raises(ValueError, match="'fork'.*'spawn'"):
        resolve_start_method("forkserver")


def test_a_node_agent_refuses_an_unknown_start_method(tmp_path):
    """``actorrl node join --start-method`` reaches the node's LocalNode; a wrong value
    fails when the agent is built, before anything starts."""
    from actorrl.runtime.cluster.node_agent import NodeAgent

    address = f"ipc://{tmp_path}/coordinator.sock"
    assert NodeAgent(address, start_method="spawn").start_method == "spawn"
    with pytest.raises(ValueError, match="unknown start method 'vfork'"):
        NodeAgent(address, start_method="vfork")
