"""Key roles (issue 13, item 8): a key's role comes from its file name; each role is
refused what it may not call, and a client key sees and stops only its own sessions' and
jobs' actors and jobs (an admin key all of them).

Everything runs in this process on loopback with CURVE: a coordinator runtime serving
``coord.*`` and ``job.*``, a node agent joined to it, and one RPC connection per key.
Actors and jobs whose ownership is checked are records put straight into the
coordinator (starting processes or training adds nothing to what is checked here).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from actorrl.cli.cluster import CommandError, key_names
from actorrl.cluster import JobError
from actorrl.cluster.jobs import JobManager, JobOptions, ManagedJob, Submission
from actorrl.runtime.cluster.coordinator import Coordinator
from actorrl.runtime.cluster.node_agent import NodeAgent
from actorrl.runtime.cluster.records import ActorRecord
from actorrl.runtime.network import Network
from actorrl.runtime.process.handles import ActorSpec
from actorrl.runtime.process.runtime import Runtime
from transport.auth import (
    KeyFileError,
    generate_keys,
    load_key_roles,
    load_keypair,
    load_public_key,
    parse_user_id,
    role_of_name,
)
from transport.rpc import RpcClient

KEYS = ("coordinator", "node", "client", "bob", "admin")
CALL_S = 10.0


@dataclass
class Cluster:
    """An in-process keyed coordinator (with jobs) and a connection per key."""

    keys: str
    runtime: Runtime
    coordinator: Coordinator
    jobs: JobManager
    endpoint: str
    conns: dict[str, RpcClient]

    async def call(self, who: str, method: str, *args: Any) -> Any:
        """``method(*args)`` on the coordinator with key ``who``."""
        return await self.conns[who].call(method, list(args), timeout_s=CALL_S)


def connect(endpoint: str, keys: str, server: str, who: str) -> RpcClient:
    """A CURVE connection to ``endpoint`` (whose server key is ``server``) as ``who``."""
    pair = load_keypair(keys, who)
    return RpcClient(endpoint, curve_keys=(load_public_key(keys, server), pair.public,
                                           pair.secret), connect_timeout_s=CALL_S)


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[Cluster]:
    """Coordinator + jobs on 127.0.0.1 with keys coordinator, node, client, bob, admin."""
    keys = str(tmp_path / "keys")
    generate_keys(keys, KEYS)
    session = tempfile.mkdtemp(prefix="arl-roles-")  # short: ipc paths max ~107 bytes
    network = Network.create("127.0.0.1", "coord-roles", keys, "coordinator")
    runtime = Runtime.start(session, "coordinator", network=network)
    coordinator = Coordinator(runtime)
    jobs = JobManager(coordinator, str(tmp_path / "state"))
    coordinator.serve()
    jobs.serve()
    endpoint = runtime.server.endpoints[-1]
    assert endpoint.startswith("tcp://")
    conns = {who: connect(endpoint, keys, "coordinator", who) for who in KEYS}
    try:
        yield Cluster(keys, runtime, coordinator, jobs, endpoint, conns)
    finally:
        for conn in conns.values():
            conn.close()
        await jobs.shutdown(checkpoint=False)
        await coordinator.shutdown()
        runtime.close()
        shutil.rmtree(session, ignore_errors=True)


async def refused(call: Any, role: str) -> str:
    """The message of the PermissionError ``call`` must fail with; it names ``role``."""
    with pytest.raises(PermissionError) as info:
        await call
    message = str(info.value)
    assert f"the calling key has role {role!r}" in message, message
    return message


# ---------------------------------------------------------------------------- key files
def test_a_keys_role_comes_from_its_file_name(tmp_path):
    """coordinator*, node*, admin* have those roles; anything else is a client; one key
    under names of two roles is refused."""
    assert [role_of_name(n) for n in ("coordinator", "node", "node-gpu1", "admin-alice",
                                      "client", "alice")] == \
        ["coordinator", "node", "node", "admin", "client", "client"]
    keys = str(tmp_path / "k")
    pairs = generate_keys(keys, ["coordinator", "node", "alice", "admin-ops"])
    roles = load_key_roles(keys)
    assert {roles[p.public] for p in pairs.values()} == {"coordinator", "node", "client",
                                                         "admin"}
    assert roles[pairs["admin-ops"].public] == "admin"
    shutil.copy(os.path.join(keys, "alice.public"), os.path.join(keys, "node-2.public"))
    with pytest.raises(KeyFileError, match="a key has one role"):
        load_key_roles(keys)
    assert parse_user_id("node:" + "x" * 40) == ("node", "x" * 40)
    assert parse_user_id("") == (None, None)
    assert parse_user_id("root:abc") == ("unknown", None)  # refused by every check
    assert parse_user_id("abc") == ("unknown", None)


def test_keys_generate_role_names_the_files():
    """``--role admin --names alice`` writes admin-alice; a client cannot take a name
    that would give it another role."""
    assert key_names(["alice"], "admin") == ["admin-alice"]
    assert key_names(["admin-ops"], "admin") == ["admin-ops"]
    assert key_names(None, "admin") == ["admin"]
    assert key_names(["gpu1"], "node") == ["node-gpu1"]
    assert key_names(None, None) == ["coordinator", "node", "client"]
    with pytest.raises(CommandError, match="cannot be called 'admin-x'"):
        key_names(["admin-x"], "client")


# ---------------------------------------------------------------------------- roles
NODE_ONLY = [("coord.register_node", ["n1", "n", "tcp://127.0.0.1:1", "127.0.0.1", 1.0, 0.0]),
             ("coord.heartbeat", ["n1"]), ("coord.actor_died", ["n1", "a", "x"]),
             ("coord.leave", ["n1"])]
CLIENT_ONLY = [("job.list", []), ("job.submit", [{"algorithm": "apex"}]),
               ("job.status", ["x"]), ("job.stop", ["x"]), ("job.results", ["x"]),
               ("job.logs", ["x"]), ("job.actors", ["x"]), ("job.checkpoint", ["x"]),
               ("coord.create_actor", ["s", ["m:C", [], {}, 1, 0, "", {}]]),
               ("coord.kill_actor", ["s", "a"]), ("coord.close_session", ["s"]),
               ("coord.session_ping", ["s"]), ("coord.actors", []), ("coord.nodes", []),
               ("coord.status", []), ("coord.actor_log", ["a"]),
               ("coord.wait_actor", ["x", None, [], 0.01]), ("coord.wait_nodes", [0, 0.01]),
               ("coord.shutdown", [])]


async def test_a_node_key_is_refused_job_and_client_methods(cluster):
    """A node key calls no ``job.*`` and none of the client ``coord.*`` methods."""
    for method, args in CLIENT_ONLY:
        message = await refused(cluster.call("node", method, *args), "node")
        assert method in message and "'client'" in message
    assert not cluster.coordinator.shutdown_requested.is_set()
    assert (await cluster.call("node", "coord.heartbeat", "n1")) == {"known": False}
    assert "address" in await cluster.call("node", "coord.hello")


@pytest.mark.parametrize("who", ["client", "admin"])
async def test_client_and_admin_keys_are_refused_node_methods(cluster, who):
    """Client and admin keys cannot register nodes, heartbeat, report deaths or leave."""
    for method, args in NODE_ONLY:
        message = await refused(cluster.call(who, method, *args), role_of_name(who))
        assert method in message and "'node'" in message
    assert cluster.coordinator.nodes == {}
    assert (await cluster.call(who, "coord.status"))["nodes"] == []


@pytest.mark.usefixtures("light_fork_server")  # the node starts no actor
async def test_node_methods_take_only_the_coordinators_key(cluster):
    """``node.*`` on a node agent: client, admin and node keys are refused; the
    coordinator's key (what the coordinator itself uses) is served."""
    agent = NodeAgent(cluster.endpoint, host="127.0.0.1", num_cpus=1, num_gpus=0,
                      keys_dir=cluster.keys, name="n1")
    task = asyncio.get_running_loop().create_task(agent.run())
    try:
        await asyncio.wait_for(agent.joined.wait(), 30)
        assert agent.runtime is not None
        endpoint = agent.runtime.server.endpoints[-1]
        conns = {who: connect(endpoint, cluster.keys, "node", who)
                 for who in ("client", "admin", "node", "coordinator")}
        try:
            for who in ("client", "admin", "node"):
                for method, args in (("node.info", []), ("node.kill_actor", ["a"]),
                                     ("node.start_actor", [["m:C", [], {}, 1, 0, "", {}], 1]),
                                     ("node.stop_actor", ["a", 1.0]),
                                     ("node.release", [False]), ("node.actor_log", ["a", 10])):
                    message = await refused(conns[who].call(method, args, timeout_s=CALL_S),
                                            role_of_name(who))
                    assert "'coordinator'" in message
            info = await conns["coordinator"].call("node.info", timeout_s=CALL_S)
            assert info["node_id"] == agent.node_id
        finally:
            for conn in conns.values():
                conn.close()
        assert [n.name for n in cluster.coordinator.nodes.values()] == ["n1"]
    finally:
        agent.stop()
        await asyncio.wait_for(task, 30)


# ---------------------------------------------------------------------------- ownership
def add_actor(cluster: Cluster, actor_id: str, session: str, key_of: str) -> None:
    """An actor record of ``client:SESSION``, that session opened with ``key_of``'s key."""
    owner = f"client:{session}"
    cluster.coordinator.owner_keys[owner] = load_public_key(cluster.keys, key_of).decode()
    cluster.coordinator.sessions[session] = 1e18  # (never times out in the test)
    cluster.coordinator.actors[actor_id] = ActorRecord(
        actor_id, ActorSpec("m:C", name=actor_id), "no-node", owner, "ipc:///nowhere", 1)


async def test_a_client_sees_and_stops_only_its_own_sessions_actors(cluster):
    """bob cannot list, read, kill or close alice's (``client``) actors and session, nor
    create actors in her session; she and an admin can."""
    add_actor(cluster, "alice-1", "sa", "client")
    add_actor(cluster, "bob-1", "sb", "bob")
    names = {who: {a["actor_id"] for a in await cluster.call(who, "coord.actors")}
             for who in ("client", "bob", "admin")}
    assert names == {"client": {"alice-1"}, "bob": {"bob-1"},
                     "admin": {"alice-1", "bob-1"}}
    for method, args in (("coord.kill_actor", ["sb", "alice-1"]),
                         ("coord.kill_actor", ["sb", "alice-1", True]),
                         ("coord.actor_log", ["alice-1"]),
                         ("coord.close_session", ["sa"]),
                         ("coord.create_actor", ["sa", ["m:C", [], {}, 1, 0, "", {}]])):
        with pytest.raises(PermissionError, match="another"):
            await cluster.call("bob", method, *args)
    assert await cluster.call("bob", "coord.wait_actor", "alice-1", None, [], 0.01) is None
    assert (await cluster.call("bob", "coord.session_ping", "sa")) == {"known": False}
    assert (await cluster.call("client", "coord.session_ping", "sa")) == {"known": True}
    assert "alice-1" in cluster.coordinator.actors
    assert await cluster.call("client", "coord.kill_actor", "sa", "alice-1") is True
    assert "alice-1" not in cluster.coordinator.actors
    assert await cluster.call("admin", "coord.close_session", "sb") == 1
    assert cluster.coordinator.actors == {}


def add_job(cluster: Cluster, job_id: str, key_of: str) -> ManagedJob:
    """A (not running) job submitted with ``key_of``'s key."""
    job = ManagedJob(job_id, Submission("apex", {}, {}, JobOptions()),
              os.path.join(cluster.jobs.state_dir, "jobs", job_id))
    job.owner_key = load_public_key(cluster.keys, key_of).decode()
    cluster.jobs.jobs[job_id] = job
    cluster.coordinator.owner_keys[f"job:{job_id}"] = job.owner_key
    return job


async def test_a_client_sees_and_stops_only_its_own_jobs(cluster):
    """``job.list`` and the status' job list show a client its own jobs; another client's
    job is "no job" to every ``job.*`` call; an admin sees and stops all."""
    add_job(cluster, "job-alice", "client")
    bobs = add_job(cluster, "job-bob", "bob")
    for who, expect in (("client", ["job-alice"]), ("bob", ["job-bob"]),
                        ("admin", ["job-alice", "job-bob"])):
        assert sorted(j["job_id"] for j in await cluster.call(who, "job.list")) == expect
        status = await cluster.call(who, "coord.status")
        assert sorted(j["job_id"] for j in status["jobs"]) == expect
    for method in ("job.status", "job.stop", "job.logs", "job.actors", "job.results",
                   "job.checkpoint"):
        for job_id in ("job-alice", "job-a"):  # by id and by prefix
            with pytest.raises(JobError, match="no job .* of this client key"):
                await cluster.call("bob", method, job_id)
    assert (await cluster.call("bob", "job.stop", "job-bob"))["state"] == "stopped"
    assert (await cluster.call("admin", "job.stop", "job-alice"))["state"] == "stopped"
    assert (await cluster.call("client", "job.status", "job-alice"))["owner_key"] == \
        load_public_key(cluster.keys, "client").decode()
    # The owner is kept in job.json: a restarted coordinator still knows it.
    assert ManagedJob.load(bobs.dir).owner_key == bobs.owner_key


async def test_with_an_admin_key_only_admins_shut_the_coordinator_down(cluster):
    """Client keys may not stop the coordinator once an admin key exists (without one,
    clients are the operators: ``actorrl coordinator stop`` keeps working)."""
    with pytest.raises(PermissionError, match="only admin keys"):
        await cluster.call("client", "coord.shutdown")
    assert not cluster.coordinator.shutdown_requested.is_set()
    assert await cluster.call("admin", "coord.shutdown") is True
    assert cluster.coordinator.shutdown_requested.is_set()
