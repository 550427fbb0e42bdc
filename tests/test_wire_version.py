"""Mixed actorrl versions in one cluster, on loopback with CURVE keys and real processes.

Typed values cross the wire with tags derived from module paths, so a node agent or a
client of another release would misread a coordinator (and it them). Each sends its wire
version when it joins (:mod:`actorrl.runtime.wire_version`); the coordinator refuses
another version, and a peer of a release from before versions (it sends none), with a
message naming both versions and the fix, which the joining side shows (the CLI exits with
it, no traceback); it keeps serving the nodes and clients of its own version.

"Another version" is this code with its ``WIRE_VERSION`` changed (in this process, or in
the child a CLI command runs in); "a release from before versions" is today's calls
without the version argument. Every wait is a reply, a process exit or a bounded wait.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

import actorrl.cluster.client as client_module
import actorrl.runtime.cluster.coordinator_link as link_module
from actorrl.cluster.client import Client, ClusterConnectionError
from actorrl.runtime.cluster.callers import serve_async, serve_guarded
from actorrl.runtime.cluster.node_agent import NodeAgent, NodeJoinError
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.wire_version import FIX, WIRE_VERSION, WireVersionError
from tests.helpers.cluster import join_node, keyed_coordinator, read
from tests.helpers.procs import REPO, child_env, pids_alive, terminate
from transport.auth import load_keypair, load_public_key
from transport.errors import RemoteError
from transport.rpc import RpcClient

OTHER = WIRE_VERSION + 41
"""The wire version of the "other release" here."""
CALL_S = 10.0
pytestmark = pytest.mark.usefixtures("light_fork_server")  # the actors here are test actors


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory):
    """A keyed coordinator on 127.0.0.1: ``(tmp, address, keys_dir)``."""
    with keyed_coordinator(str(tmp_path_factory.mktemp("coord"))) as coordinator:
        yield coordinator


def other_release_cli(args: list[str], tmpdir: Path, timeout_s: float = 60
                      ) -> subprocess.CompletedProcess:
    """``actorrl ARGS`` in a child whose node agent and client speak wire version
    :data:`OTHER` (its temporary folders in ``tmpdir``); bounded by ``timeout_s`` (a node
    that retried forever would miss it)."""
    code = ("import sys\n"
            "import actorrl.cluster.client as client\n"
            "import actorrl.runtime.cluster.coordinator_link as link\n"
            f"client.WIRE_VERSION = link.WIRE_VERSION = {OTHER}\n"
            "from actorrl.cli.cluster import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s, env=child_env(TMPDIR=str(tmpdir)))


def names_both_versions(text: str, theirs: str) -> bool:
    """Whether a refusal names the peer's version, the coordinator's and the fix."""
    return (f"wire version {theirs}" in text and f"speaks version {WIRE_VERSION}" in text
            and FIX in text)


def connect(address: str, keys: str, who: str) -> RpcClient:
    """A raw CURVE connection to the coordinator at ``address`` with key pair ``who``."""
    pair = load_keypair(keys, who)
    return RpcClient(address, curve_keys=(load_public_key(keys, "coordinator"), pair.public,
                                          pair.secret), connect_timeout_s=CALL_S)


async def refusal(conn: RpcClient, method: str, args: list[Any]) -> str:
    """The message of the :class:`WireVersionError` ``method(args)`` is refused with (it
    arrives typed, without the coordinator's traceback)."""
    with pytest.raises(WireVersionError) as refused:
        await conn.call(method, args, timeout_s=CALL_S)
    assert isinstance(refused.value, RemoteError) and refused.value.remote_traceback == ""
    return refused.value.message


# ---------------------------------------------------------------------------- nodes
@pytest.mark.timeout(120)
def test_a_node_of_another_version_is_refused_and_the_cli_exits_with_the_message(
        coordinator, tmp_path):
    """``node join`` of another wire version exits 1 at once (no retries, no traceback)
    with the coordinator's message naming both versions and the fix; the coordinator logs
    the refusal; the node's temporary folder is gone."""
    tmp, address, keys = coordinator
    done = other_release_cli(["node", "join", address, "--keys", keys, "--host", "127.0.0.6",
                              "--name", "newer", "--cpus", "1", "--gpus", "0"], tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"cannot join the coordinator at {address}" in output, output
    assert names_both_versions(output, str(OTHER)), output
    assert "Traceback" not in output and "retrying" not in output, output
    assert not list(tmp_path.glob("actorrl-node-*"))
    log = read(os.path.join(tmp, "coordinator.log"))
    assert f"it speaks wire version {OTHER}, this coordinator {WIRE_VERSION}" in log, log


@pytest.mark.timeout(120)
async def test_a_node_agent_of_another_version_fails_with_node_join_error(
        coordinator, monkeypatch):
    """In-process: :meth:`NodeAgent.run` raises :class:`NodeJoinError` with that message
    on its first try (it does not retry: another try gets the same answer)."""
    _, address, keys = coordinator
    monkeypatch.setattr(link_module, "WIRE_VERSION", OTHER)
    agent = NodeAgent(address, host="127.0.0.7", num_cpus=1, num_gpus=0, keys_dir=keys,
                      name="newer")
    with pytest.raises(NodeJoinError) as failed:
        await asyncio.wait_for(agent.run(), 60)
    assert names_both_versions(str(failed.value), str(OTHER)), failed.value
    assert not agent.joined.is_set()


@pytest.mark.timeout(60)
async def test_a_node_or_client_of_a_release_before_versions_is_refused(coordinator):
    """Today's ``coord.register_node`` without the version (what a release from before
    versions sends), a session opened without one (``coord.create_actor``) and a job
    submitted without one (``job.submit``) are refused
    naming "none" and the fix; a bare ``coord.hello`` (a probe) is answered with the
    coordinator's version."""
    _, address, keys = coordinator
    node, client = connect(address, keys, "node"), connect(address, keys, "client")
    try:
        message = await refusal(node, "coord.register_node", [
            uuid.uuid4().hex, "older", "tcp://127.0.0.8:1", "127.0.0.8", 1.0, 0.0])
        assert names_both_versions(message, "none") and "'older'" in message, message
        message = await refusal(client, "coord.create_actor", [
            uuid.uuid4().hex, ["tests.actors.basic:Counter", [], {}, 0, 0, "", {}]])
        assert names_both_versions(message, "none") and "this client" in message, message
        message = await refusal(client, "job.submit", [{"algorithm": "apex"}])
        assert names_both_versions(message, "none") and "this client" in message, message
        hello = await client.call("coord.hello", timeout_s=CALL_S)
        assert hello["wire_version"] == WIRE_VERSION
        status = await client.call("coord.status", timeout_s=CALL_S)
        assert "older" not in [n["name"] for n in status["nodes"]]
        assert status["num_actors"] == 0 and status["jobs"] == []
    finally:
        node.close()
        client.close()


# ---------------------------------------------------------------------------- clients
@pytest.mark.timeout(120)
def test_a_client_of_another_version_is_refused(coordinator, tmp_path, monkeypatch):
    """A :class:`Client` of another wire version fails to connect with the coordinator's
    message; a CLI command of that version exits 1 with it, without a traceback."""
    tmp, address, keys = coordinator
    done = other_release_cli(["nodes", "--address", address, "--keys", keys], tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"actorrl: error: cannot use the coordinator at {address}" in output, output
    assert names_both_versions(output, str(OTHER)), output
    assert "Traceback" not in output, output
    monkeypatch.setattr(client_module, "WIRE_VERSION", OTHER)
    with pytest.raises(ClusterConnectionError) as refused:
        Client(address, keys_dir=keys, bind_host=None)
    assert names_both_versions(str(refused.value), str(OTHER)), refused.value
    assert "this client" in str(refused.value)


# ---------------------------------------------------------------------------- serving on
@pytest.mark.timeout(180)
def test_the_coordinator_keeps_serving_nodes_and_clients_of_its_version(coordinator,
                                                                      tmp_path):
    """After refusing a node of another version, a node of this version joins the same
    coordinator and runs a client's actor; only it is a member."""
    tmp, address, keys = coordinator
    refused = other_release_cli(["node", "join", address, "--keys", keys, "--host",
                                 "127.0.0.9", "--name", "newer", "--cpus", "1", "--gpus",
                                 "0"], tmp_path)
    assert refused.returncode == 1 and names_both_versions(refused.stderr, str(OTHER)), \
        refused.stdout + refused.stderr
    sessions: list[str] = []
    node = join_node(tmp, address, keys, "127.0.0.10", "same", 1, sessions, "numpy")
    pids = [node.pid]
    try:
        with Client(address, keys_dir=keys) as client:
            assert client.wait_for_nodes(1, 60) == 1, read(os.path.join(tmp, "node-same.log"))
            assert [n["name"] for n in client.nodes()] == ["same"]
            counter = client.create_actor("tests.actors.basic:Counter", args=(1,), num_cpus=0,
                                          node="same")
            assert client.get(counter.add.remote(2), timeout=30) == 3
            pids.append(client.get(counter.pid.remote(), timeout=30))
            client.kill_actor(counter)
    finally:
        terminate(node)
        for session in sessions:
            shutil.rmtree(session, ignore_errors=True)
    assert pids_alive(pids, 30) == []


# ---------------------------------------------------------------------------- old coordinator
async def test_a_coordinator_of_a_release_before_versions_is_refused_by_nodes_and_clients(
        tmp_path):
    """A coordinator that shows no wire version (its ``coord.hello`` as a release from
    before versions answers it, its ``coord.register_node`` taking six fields) is given up
    at once by a node agent and a client of this release, naming the address and the
    fix."""
    session = tempfile.mkdtemp(prefix="arl-old-")  # short: ipc paths max ~107 bytes
    runtime = Runtime.start(session, "old-coordinator")

    async def register_node(node_id: str, name: str, endpoint: str, host: str,
                            num_cpus: float, num_gpus: float) -> dict[str, Any]:
        raise AssertionError("a registration with a version must not get this far")

    try:
        serve_guarded(runtime, "coord.hello", lambda r: r.reply({
            "address": runtime.address, "max_frame_bytes": runtime.server.max_frame_bytes}))
        serve_async(runtime, "coord.register_node", register_node)
        address = runtime.address
        agent = NodeAgent(address, num_cpus=1, num_gpus=0, name="newer")
        with pytest.raises(NodeJoinError) as failed:
            await asyncio.wait_for(agent.run(), 60)
        text = str(failed.value)
        assert f"the coordinator at {address} speaks no cluster wire version" in text, text
        assert f"version {WIRE_VERSION}" in text and FIX in text, text
        with pytest.raises(ClusterConnectionError) as refused:
            await asyncio.wait_for(asyncio.to_thread(Client, address), 60)
        assert f"the coordinator at {address} speaks no cluster wire version" in \
            str(refused.value), refused.value
    finally:
        runtime.close()
        shutil.rmtree(session, ignore_errors=True)
