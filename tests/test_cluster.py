"""Cluster use on one machine: a coordinator and node agents on different loopback
addresses (Linux routes all of 127/8 to lo), CURVE forced on with keys, real processes.

Every wait is a handshake or a bounded wait on a reply (ready pipes, ``coord.wait_nodes``,
long-polled results, pidfds); nothing sleeps to let something happen. Every test checks
that the processes it saw (coordinator, nodes, actors) are gone at the end.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from actorrl.algorithms.checkpoints import read_checkpoint
from actorrl.cluster.client import Client, ClusterConnectionError, Job
from actorrl.runtime.network import Network
from actorrl.runtime.sessions import remove_stale_session_dirs
from tests.helpers.cluster import (
    CLUSTER_CLI,
    REPO,
    SESSION_TIMEOUT_S,
    join_node,
    read,
    start_coordinator,
)
from tests.helpers.procs import pids_alive, ready_line, start_python, tcp_listeners, terminate
from transport.auth import (
    InsecureBindError,
    KeyFileError,
    KeyPair,
    Security,
    check_bind,
    ensure_authenticator,
    generate_keys,
    load_allowed_keys,
    load_keypair,
)
from transport.endpoint import Endpoint
from transport.errors import AuthenticationError, CallTimeoutError, PeerLostError
from transport.rpc import RpcClient, RpcServer

APEX_TINY = {"algorithm": "apex", "num_workers": 2, "num_envs_per_worker": 1,
             "rollout_fragment_length": 16, "learning_starts": 64, "buffer_size": 4000,
             "train_batch_size": 32, "min_iter_time_s": 0.5, "target_network_update_freq": 500,
             "max_weight_sync_delay": 100}


# ---------------------------------------------------------------------------- helpers
def next_result(job: Job, after: int, predicate: Callable[[dict[str, Any]], bool],
                timeout_s: float) -> tuple[dict[str, Any], int]:
    """The first result at index >= ``after`` meeting ``predicate``, and the index after
    it; fails when ``timeout_s`` passes first."""
    index = after
    try:
        for result in job.results(after=after, timeout_s=timeout_s):
            index += 1
            if predicate(result):
                return result, index
    except TimeoutError:
        pass
    raise AssertionError(f"no matching result within {timeout_s} s; job log:\n"
                         + job.logs()[-4000:])


def actor_named(job: Job, name: str) -> dict[str, Any]:
    """The job's live actor ``name``."""
    matches = [a for a in job.actors() if a["name"] == name]
    assert matches, f"{name} not among {[a['name'] for a in job.actors()]}"
    return matches[0]


class Cluster:
    """A coordinator, node agents and a client; remembers every pid it saw."""

    def __init__(self, tmp: str, keys: str | None) -> None:
        self.tmp = tmp
        self.keys = keys
        self.coordinator, self.address = start_coordinator(tmp, keys)
        self.nodes: dict[str, subprocess.Popen] = {}
        self.sessions: list[str] = []
        self.pids: set[int] = {self.coordinator.pid}
        self.client = Client(self.address, keys_dir=keys)

    def join(self, host: str, name: str, cpus: float, preload: str | None = None
             ) -> subprocess.Popen:
        node = join_node(self.tmp, self.address, self.keys, host, name, cpus, self.sessions,
                         preload)
        self.nodes[name] = node
        self.pids.add(node.pid)
        want = len([n for n in self.nodes.values() if n.poll() is None])
        assert self.client.wait_for_nodes(want, 60) >= want, self.client.nodes()
        return node

    def remember(self, job: Job) -> list[dict[str, Any]]:
        actors = job.actors()
        self.pids.update(a["pid"] for a in actors)
        return actors

    def close(self) -> None:
        try:
            self.client.call("coord.shutdown", [True], timeout_s=10)
        except Exception:
            pass
        self.client.close()
        for proc in (self.coordinator, *self.nodes.values()):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        left = pids_alive(sorted(self.pids), 30)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        for session in self.sessions:
            shutil.rmtree(session, ignore_errors=True)
        assert left == [], f"processes left behind: {left}"
        # Calls pending on killed actors and nodes are retrieved, not logged by asyncio.
        for log in ["coordinator.log", *(f"node-{name}.log" for name in self.nodes)]:
            text = read(os.path.join(self.tmp, log))
            assert "never retrieved" not in text, f"{log}:\n{text[-3000:]}"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A keys directory (coordinator, node, client)."""
    path = str(tmp_path_factory.mktemp("keys") / "keys")
    generate_keys(path)
    return path


@contextlib.contextmanager
def two_node_cluster(tmp: str, keys: str) -> Iterator[Cluster]:
    """Coordinator on 127.0.0.1, node ``a`` on 127.0.0.2 (3 CPUs), ``b`` on 127.0.0.3
    (2 CPUs), everything CURVE-encrypted; closed (and checked for leftovers) after."""
    c = Cluster(tmp, keys)
    try:
        c.join("127.0.0.2", "a", 3)
        c.join("127.0.0.3", "b", 2)
        yield c
    finally:
        c.close()


SHARES_THE_CLUSTER = pytest.mark.xdist_group("test_cluster-cluster")
"""For the tests on the module's shared cluster: under ``--dist loadgroup`` they run in one
pytest-xdist worker, so it starts once, not once per worker."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, keys: str) -> Iterator[Cluster]:
    """The module's shared :func:`two_node_cluster` (tests leave it as they found it)."""
    with two_node_cluster(str(tmp_path_factory.mktemp("cluster")), keys) as c:
        yield c


# ---------------------------------------------------------------------------- keys, binds
def test_key_files_have_safe_modes_and_unsafe_secrets_are_refused(tmp_path):
    """Secrets are written 0600 in a 0700 directory; every *.public is allowed; a secret
    readable by others, a malformed key and existing keys (without force) are refused."""
    d = str(tmp_path / "k")
    pairs = generate_keys(d)
    assert os.stat(d).st_mode & 0o777 == 0o700
    for name, pair in pairs.items():
        assert os.stat(os.path.join(d, f"{name}.secret")).st_mode & 0o777 == 0o600
        assert load_keypair(d, name) == pair
        assert zmq.curve_public(pair.secret) == pair.public
    assert load_allowed_keys(d) == {p.public for p in pairs.values()}
    with pytest.raises(KeyFileError, match="already exist"):
        generate_keys(d)
    os.chmod(os.path.join(d, "node.secret"), 0o644)
    with pytest.raises(KeyFileError, match="readable by others"):
        load_keypair(d, "node")
    with open(os.path.join(d, "client.public"), "w") as f:
        f.write("not a key\n")
    with pytest.raises(KeyFileError, match="z85"):
        load_allowed_keys(d)


def test_tcp_binds_need_keys_or_the_insecure_flag(tmp_path):
    """Binding tcp without CURVE keys is a clear error, for the runtime and the coordinator
    alike: anywhere but loopback always, on loopback too unless --insecure-loopback says
    so (a keyless loopback listener lets any local user run code); ipc is allowed."""
    with pytest.raises(InsecureBindError, match="CURVE"):
        check_bind("tcp://0.0.0.0:7450", None)
    with pytest.raises(InsecureBindError, match="CURVE"):
        Network.create("10.1.2.3")
    with pytest.raises(InsecureBindError, match="CURVE"):
        check_bind("tcp://0.0.0.0:7450", None, insecure_loopback=True)
    with pytest.raises(InsecureBindError, match="insecure-loopback"):
        check_bind("tcp://127.0.0.2:0", None)
    with pytest.raises(InsecureBindError, match="actorrl keys generate"):
        Network.create("127.0.0.1")
    check_bind("tcp://127.0.0.2:0", None, insecure_loopback=True)
    assert Network.create("127.0.0.1", insecure_loopback=True).to_env()[
        "ACTORRL_INSECURE_LOOPBACK"] == "1"
    check_bind("ipc:///tmp/x.sock", None)
    generate_keys(str(tmp_path / "k"))
    check_bind("tcp://0.0.0.0:7450", Security.from_dir(str(tmp_path / "k"), "node"))
    for bind, words in (("tcp://0.0.0.0:0", "needs CURVE keys"),
                        ("tcp://127.0.0.1:0", "--insecure-loopback")):
        result = subprocess.run([*CLUSTER_CLI, "coordinator", "start", "--bind", bind,
                                 "--state-dir", str(tmp_path / "s")], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert words in result.stderr and "actorrl keys generate" in result.stderr
    result = subprocess.run([*CLUSTER_CLI, "node", "join", "tcp://127.0.0.1:1", "--cpus", "1"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--insecure-loopback" in result.stderr, result.stderr


@pytest.mark.timeout(120)
def test_a_keyless_cluster_is_private_to_the_user(tmp_path):
    """Without keys or --bind the coordinator listens on an ipc socket in its fresh 0700
    state folder and binds no tcp; a keyless node joins it over ipc (no tcp either) and a
    client reaches both. With --insecure-loopback keyless loopback tcp still works."""
    proc, address = start_coordinator(str(tmp_path), None, bind=None)
    sessions: list[str] = []
    node = None
    try:
        assert address.startswith("ipc://" + str(tmp_path / "state" / "run")), address
        run_dir = tmp_path / "state" / "run"
        assert run_dir.stat().st_mode & 0o777 == 0o700
        assert run_dir.stat().st_uid == os.getuid()
        assert tcp_listeners(proc.pid) == 0
        node = join_node(str(tmp_path), address, None, None, "private", 1, sessions,
                         preload="numpy")  # it runs no actor
        with Client(address) as client:
            assert client.wait_for_nodes(1, 60) == 1
            info = client.nodes()[0]
            assert info["name"] == "private"
        assert tcp_listeners(node.pid) == 0
    finally:
        for p in (node, proc):
            if p is not None:
                terminate(p)
        for session in sessions:
            shutil.rmtree(session, ignore_errors=True)
    (tmp_path / "insecure").mkdir()
    proc, address = start_coordinator(str(tmp_path / "insecure"), None,
                                      insecure_loopback=True)
    try:
        assert address.startswith("tcp://127.0.0.1:")
        with Client(address, insecure_loopback=True) as client:
            assert client.nodes() == []
    finally:
        terminate(proc)


def test_endpoints_route_ipc_within_a_node_and_curve_tcp_across():
    """A composite endpoint round-trips; callers on the same node get the ipc address,
    others the tcp address with the server key."""
    key = zmq.curve_keypair()[0]
    ep = Endpoint("tcp://127.0.0.2:4000", key, "node-1", "ipc:///tmp/s/actor.sock")
    assert Endpoint.parse(str(ep)) == ep
    assert ep.route("node-1") == ("ipc:///tmp/s/actor.sock", None)
    assert ep.route("node-2") == ("tcp://127.0.0.2:4000", key)
    assert ep.route(None) == ("tcp://127.0.0.2:4000", key)
    with pytest.raises(ValueError, match="malformed"):
        Endpoint.parse("tcp://127.0.0.1:1|x=1")


async def test_curve_listener_admits_only_allowed_keys(tmp_path):
    """One ROUTER serves plain ipc and CURVE tcp: over tcp an allowed key is answered, an
    unknown key and a keyless client get nothing (the request never reaches the handler),
    and ipc works unencrypted next to it."""
    generate_keys(str(tmp_path / "k"))
    security = Security.from_dir(str(tmp_path / "k"), "coordinator")
    auth = ensure_authenticator(security.allowed)
    refused_before = auth.refused
    seen: list[str] = []

    def handler(request: Any) -> None:
        seen.append(request.method)
        request.reply("ok")

    server = RpcServer(handler)
    ipc = server.bind(f"ipc://{tmp_path}/s.sock")
    tcp = server.bind("tcp://127.0.0.1:0", security.identity.secret)
    server.start()
    stranger = KeyPair.generate()
    clients = []
    try:
        for method, keys in (("stranger", (security.identity.public, stranger.public,
                                           stranger.secret)), ("keyless", None)):
            client = RpcClient(tcp, curve_keys=keys, connect_timeout_s=2)
            clients.append(client)
            with pytest.raises((PeerLostError, CallTimeoutError), match=re.escape(tcp)):
                await client.call(method, timeout_s=3)
        good = RpcClient(tcp, curve_keys=security.client_keys(security.identity.public))
        plain = RpcClient(ipc)
        clients += [good, plain]
        assert await good.call("allowed", timeout_s=10) == "ok"
        assert await plain.call("ipc", timeout_s=10) == "ok"
        assert seen == ["allowed", "ipc"]
        assert auth.refused == refused_before + 1
    finally:
        for client in clients:
            client.close()
        server.close()


SILENT_LISTENER = r"""
import select, socket, sys
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
print("READY", listener.getsockname()[1], flush=True)
conn, _ = listener.accept()  # accepted, never read: a handshake nobody answers
# Announced once the client's greeting is here, unread (as in a node killed mid-handshake):
# killed before it arrived, the close would be a clean one that the client's next write
# meets with EPIPE, which is also what a server that read the greeting and dropped it
# (a wrong key) gives.
select.select([conn], [], [], 60)
print("ACCEPTED", flush=True)
sys.stdin.read()
"""


async def test_a_dead_peer_is_a_lost_peer_and_only_a_wrong_key_a_key_problem(tmp_path):
    """A CURVE client given the wrong server key fails with AuthenticationError saying the
    server key is likely wrong. A client whose peer process is SIGKILLed mid-handshake,
    its greeting unread (as a coordinator probing a killed node meets it), fails with a
    plain PeerLostError that says nobody answered, and nothing about keys (it used to blame
    the key)."""
    generate_keys(str(tmp_path / "k"))
    security = Security.from_dir(str(tmp_path / "k"), "coordinator")
    ensure_authenticator(security.allowed)
    server = RpcServer(lambda request: request.reply("ok"))
    tcp = server.bind("tcp://127.0.0.1:0", security.identity.secret)
    server.start()
    _, public, secret = security.client_keys(security.identity.public)
    wrong_key = RpcClient(tcp, curve_keys=(KeyPair.generate().public, public, secret))
    listener = start_python(["-c", SILENT_LISTENER], tmp_path / "listener.log")
    try:
        with pytest.raises(AuthenticationError, match="most likely not that server's") as bad:
            await wrong_key.call("hello", timeout_s=30)
        assert not bad.value.key_refused
        port = ready_line(listener, listener.stdout, "READY ", 60,
                          tmp_path / "listener.log").split()[1]
        dying = RpcClient(f"tcp://127.0.0.1:{port}", connect_timeout_s=60,
                          curve_keys=security.client_keys(security.identity.public))
        try:
            call = dying.call("hello", timeout_s=60)
            ready_line(listener, listener.stdout, "ACCEPTED", 60, tmp_path / "listener.log")
            listener.kill()
            listener.wait(10)
            with pytest.raises(PeerLostError) as lost:
                await call
            assert type(lost.value) is PeerLostError, repr(lost.value)
            assert "no answer to the handshake" in str(lost.value)
            assert "key" not in str(lost.value)
        finally:
            dying.close()
    finally:
        terminate(listener)
        listener.stdout.close()
        listener.stdin.close()
        wrong_key.close()
        server.close()


# ---------------------------------------------------------------------------- the cluster
@pytest.mark.timeout(120)
@SHARES_THE_CLUSTER
def test_clients_without_a_valid_key_get_nothing(cluster, tmp_path):
    """A client without keys and one with an unknown key are refused by the coordinator's
    CURVE handshake (the ZAP allow-list); the right key works, and nodes never saw the
    refused clients' requests."""
    with pytest.raises(ClusterConnectionError,
                       match="cannot reach the coordinator at .*pass keys_dir"):
        Client(cluster.address, connect_timeout_s=3)
    stranger = tmp_path / "stranger"
    generate_keys(str(stranger), ["client"])
    shutil.copy(os.path.join(cluster.keys, "coordinator.public"), stranger)
    with pytest.raises(ClusterConnectionError, match="authentication failed|within"):
        Client(cluster.address, keys_dir=str(stranger), bind_host=None, connect_timeout_s=3)
    with Client(cluster.address, keys_dir=cluster.keys, bind_host=None) as client:
        assert {n["name"] for n in client.nodes()} == {"a", "b"}
    log = read(os.path.join(cluster.tmp, "coordinator.log"))
    assert "refused a CURVE connection" in log and "unknown key" in log


@pytest.mark.timeout(120)
@SHARES_THE_CLUSTER
def test_actors_on_remote_nodes_are_reachable_over_curve_tcp(cluster):
    """The raw actor API: actors created on chosen nodes carry tcp endpoints of their node
    with its key; refs pass between hosts (a ref put by the client is fetched by an actor
    on node b; an actor on a fetches a result owned by an actor on b)."""
    client = cluster.client
    store_b = client.create_actor("tests.actors.basic:Store", num_cpus=0, node="b")
    relay_a = client.create_actor("tests.actors.basic:Relay", num_cpus=0, node="a")
    try:
        assert isinstance(client.actor_log(store_b.actor_id), str)
        for handle, host in ((store_b, "127.0.0.3"), (relay_a, "127.0.0.2")):
            endpoint = Endpoint.parse(handle.endpoint)
            assert endpoint.address.startswith(f"tcp://{host}:")
            assert endpoint.server_key == load_keypair(cluster.keys, "node").public
        cluster.pids.update(a["pid"] for a in client.actors())
        ref = client.put({"x": __import__("numpy").arange(10.0)})
        assert client.get(store_b.consume.remote(ref), timeout=30) == 45.0
        made = store_b.make.remote(1 << 20)
        total = client.get(relay_a.forward.remote(store_b, [made]), timeout=30)
        assert total == (1 << 20) // 8
    finally:
        client.kill_actor(store_b)
        client.kill_actor(relay_a)


@pytest.mark.timeout(120)
@SHARES_THE_CLUSTER
def test_actors_of_a_client_that_died_are_stopped(cluster):
    """A client process that exits without closing stops pinging its session; the
    coordinator stops the actors it created once the session timeout passes, even one
    whose creation took longer than that timeout (the session used to expire under the
    creation, leaving its actor to no session, alive forever). (The dead client's own
    temp folder is left for the next runtime's sweep, run here.)"""
    script = ("import os, sys\n"
              "from actorrl.cluster.client import Client\n"
              "c = Client(sys.argv[1], keys_dir=sys.argv[2])\n"
              f"h = c.create_actor('tests.actors.basic:SlowBuilt', [{SESSION_TIMEOUT_S + 2}],"
              " num_cpus=0, node='a')\n"
              "print(os.getpid(), c.get(h.pid.remote(), timeout=30), flush=True)\n"
              "os._exit(0)\n")
    done = subprocess.run([sys.executable, "-c", script, cluster.address, cluster.keys],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    client_pid, pid = map(int, done.stdout.split()[-2:])
    cluster.pids.add(pid)
    assert pids_alive([pid], SESSION_TIMEOUT_S + 10) == []
    remove_stale_session_dirs()
    assert [path for path in glob.glob(os.path.join(tempfile.gettempdir(), "actorrl-*",
                                                    "owner.pid"))
            if read(path).strip() == str(client_pid)] == []


@pytest.mark.timeout(240)
@SHARES_THE_CLUSTER
def test_job_runs_across_two_nodes_and_streams_results(cluster):
    """An Ape-X job is placed across both nodes (learner and its replay shard on a, the
    workers on b), results stream to the client in order, and the job finishes at its
    stop criterion with a checkpoint; a second job runs at the same time on what is left
    (one CPU on a for its learner, one for its worker)."""
    job = cluster.client.submit({**APEX_TINY, "stop": {"training_iteration": 3},
                                 "job": {"placement": {"learner": "a", "worker-*": "b"}}})
    other = cluster.client.submit({**APEX_TINY, "num_workers": 1,
                                   "stop": {"training_iteration": 2}})
    results = list(job.results(timeout_s=180))
    assert [r["training_iteration"] for r in other.results(timeout_s=120)] == [1, 2]
    assert other.status()["state"] == "finished"
    assert {j["job_id"] for j in cluster.client.jobs()} >= {job.id, other.id}
    assert [r["training_iteration"] for r in results] == [1, 2, 3]
    steps = [r["timesteps_total"] for r in results]
    assert steps == sorted(steps) and steps[-1] > 0
    status = job.status()
    assert status["state"] == "finished"
    assert status["checkpoint"]["iteration"] == 3
    assert os.path.isdir(status["checkpoint"]["path"])
    log = job.logs()
    placed = json.loads(log.split("placed: ", 1)[1].split("\n", 1)[0].replace("'", '"'))
    assert placed == {"worker-1": "b", "worker-2": "b", "learner": "a", "replay-0": "a"}
    assert job.actors() == []  # stopped with the job


@pytest.mark.timeout(240)
@SHARES_THE_CLUSTER
def test_an_lstm_job_trains_on_the_cluster(cluster):
    """A recurrent IMPALA job (``use_lstm`` on StatelessCartPole, RLlib's keys) runs on the
    remote nodes: its workers carry LSTM state, its learner unrolls sequences, and its
    checkpoint holds the LSTM's weights."""
    job = cluster.client.submit({
        "algorithm": "impala", "env": "actorrl/StatelessCartPole-v1", "num_workers": 1,
        "num_envs_per_worker": 4, "rollout_fragment_length": 20, "train_batch_size": 160,
        "min_iter_time_s": 0.5, "stop": {"training_iteration": 3},
        "model": {"fcnet_hiddens": [32], "use_lstm": True, "lstm_cell_size": 32,
                  "max_seq_len": 10},
        "job": {"placement": {"learner": "a", "worker-*": "b"}}})
    results = list(job.results(timeout_s=180))
    assert [r["training_iteration"] for r in results] == [1, 2, 3]
    assert results[-1]["num_steps_trained"] > 0
    status = job.status()
    assert status["state"] == "finished"
    _, state = read_checkpoint(status["checkpoint"]["path"])
    weights = state["policies"]["default_policy"]["weights"]
    assert any("lstm" in key for key in weights), sorted(weights)


@pytest.mark.timeout(300)
@SHARES_THE_CLUSTER
def test_killed_worker_and_replay_shard_are_replaced_and_the_job_continues(cluster):
    """SIGKILL of a rollout worker: the pipeline replaces it (on a node with room) and
    results keep coming. SIGKILL of the replay shard: the pipeline replaces it with an empty
    one and the job goes on (the data loss is reported). SIGKILL of the learner: the job
    restarts from its last checkpoint with fresh actors: counters never go backwards while
    the pipeline recovers by itself; after the learner's loss they continue from the
    checkpoint's, and the results say which iteration they rolled back to."""
    job = cluster.client.submit({**APEX_TINY, "job": {"checkpoint_interval_s": 0}})
    try:
        _, after = next_result(job, 0, lambda r: True, 150)
        worker = actor_named(job, "worker-1")
        cluster.remember(job)
        os.kill(worker["pid"], signal.SIGKILL)
        result, after = next_result(
            job, after, lambda r: r["info"]["num_worker_restarts"] >= 1, 120)
        assert result["num_healthy_workers"] == 2
        assert pids_alive([worker["pid"]], 10) == []
        replaced = actor_named(job, "worker-1")
        assert replaced["pid"] != worker["pid"]
        last = result

        # The replay shard: replaced by an empty one inside the pipeline, no job restart.
        before = job.status()["num_failures"]
        shard = actor_named(job, "replay-0")
        cluster.remember(job)
        os.kill(shard["pid"], signal.SIGKILL)
        result, after = next_result(
            job, after, lambda r: r["info"].get("num_shard_failures", 0) >= 1, 150)
        for key in ("training_iteration", "timesteps_total", "num_steps_trained"):
            assert result[key] >= last[key], (key, result[key], last[key])
        assert job.status()["num_failures"] == before
        assert actor_named(job, "replay-0")["pid"] != shard["pid"]
        last = result

        # The learner: the job restarts from its last checkpoint with fresh actors.
        before = job.status()["num_failures"]
        actor = actor_named(job, "learner")
        cluster.remember(job)
        os.kill(actor["pid"], signal.SIGKILL)
        result, after = next_result(
            job, after, lambda r, b=before: r["job"]["num_failures"] > b, 150)
        restored = result["info"]["restored_iteration"]  # the checkpoint's (every iteration)
        assert restored >= last["training_iteration"] - 1, (restored, last)
        assert result["info"]["num_restarts"] == 1
        assert result["training_iteration"] >= restored + 1
        assert actor_named(job, "learner")["pid"] != actor["pid"]
        log = job.logs()
        # Reported by the pipeline (which replaced it) or by the coordinator (which saw the
        # process die), whichever noticed first; either says the replay data is lost.
        shard_lines = [line for line in log.splitlines() if "replay-0" in line and "died" in line]
        assert any("lost" in line for line in shard_lines), shard_lines
        assert "restarting from checkpoint" in log
        current = cluster.remember(job)
    finally:
        job.stop()
    assert job.status()["state"] == "stopped"
    # The stop really ended the job: its actors exit (a lost cancel once left them running).
    assert pids_alive([a["pid"] for a in current], 30) == []


@pytest.fixture
def cluster_to_lose_c(tmp_path: Path, keys: str) -> Iterator[Cluster]:
    """A :func:`two_node_cluster` of its own for a test that adds and kills node c: the
    shared module cluster stays as its docstring says."""
    with two_node_cluster(str(tmp_path), keys) as c:
        yield c


@pytest.mark.timeout(300)
def test_lost_node_actors_are_recreated_on_the_remaining_nodes(cluster_to_lose_c):
    """SIGKILL of a node agent: its actors die with it (lifeline), the coordinator loses
    the node within seconds, the workers that ran there are recreated on a and b, and the
    job keeps producing results."""
    cluster = cluster_to_lose_c
    node_c = cluster.join("127.0.0.4", "c", 2)
    job = cluster.client.submit({**APEX_TINY, "job": {
        "placement": {"learner": "a", "worker-*": "c"}}})
    try:
        _, after = next_result(job, 0, lambda r: True, 150)
        on_c = [a for a in cluster.remember(job) if a["node"] == "c"]
        assert {a["name"] for a in on_c} == {"worker-1", "worker-2"}
        node_c.kill()
        node_c.wait(10)
        assert pids_alive([a["pid"] for a in on_c], 15) == []  # no orphans
        result, after = next_result(
            job, after, lambda r: r["info"]["num_worker_restarts"] >= 2
            and r["num_healthy_workers"] == 2, 150)
        # The pipeline may replace the workers (their calls failed) before the coordinator
        # declares the node lost (no heartbeat): wait for that too, result by result.
        result, after = next_result(
            job, after, lambda r: {n["name"] for n in cluster.client.nodes()} == {"a", "b"},
            60)
        assert {a["node"] for a in cluster.remember(job)
                if a["name"].startswith("worker")} <= {"a", "b"}
        lost = cluster.client.status()["lost_nodes"]
        assert any(n["name"] == "c" for n in lost)
        # A dead node is reported as gone, not as a key problem (the ping used to fail
        # with "the CURVE handshake ... failed ... most likely not that server's key").
        log = read(os.path.join(cluster.tmp, "coordinator.log")).splitlines()
        [lost_line] = [line for line in log if "node c lost" in line]
        assert "CURVE" not in lost_line and "server's" not in lost_line, lost_line
        next_result(job, after, lambda r: True, 60)
    finally:
        job.stop()


# ---------------------------------------------------------------------------- restarts
def _read_until(stream: Any, text: str, timeout_s: float, seen: list[str]) -> None:
    """Read lines of ``stream`` (a pipe) into ``seen`` until one contains ``text``."""
    deadline = time.monotonic() + timeout_s
    while not any(text in line for line in seen):
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([stream], [], [], max(remaining, 0))
        line = stream.readline().decode() if ready else ""
        if not line:
            raise AssertionError(f"no {text!r} within {timeout_s} s: {''.join(seen)}")
        seen.append(line)


@pytest.mark.timeout(300)
def test_a_restarted_coordinator_resumes_the_job_and_jobs_follow_reattaches(tmp_path, keys):
    """SIGKILL of the coordinator mid-job: the node stops the orphaned actors and waits; a
    coordinator restarted on the same address and state directory gets the node back and
    resumes the job from its checkpoint, counters continuing. ``actorrl jobs follow JOB``,
    attached before the kill to the job (submitted without --follow), prints its results,
    keeps following through the loss and the restart, and exits 0 once the job finished;
    so does ``Job.results()`` of a Python client (``actorrl train --address``), which
    raised at the loss before."""
    c = Cluster(str(tmp_path), keys)
    follower = None
    streamer: Client | None = None
    streamed: list[dict[str, Any]] = []
    stream_errors: list[BaseException] = []
    notes: list[str] = []
    stream_done = threading.Event()

    def stream(job: Job) -> None:
        try:
            for result in job.results(after=0, poll_s=2, on_connection=notes.append):
                streamed.append(result)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            stream_errors.append(exc)
        finally:
            stream_done.set()

    try:
        c.join("127.0.0.7", "f", 4)
        # 1 s iterations to 12: the follower (a fresh interpreter, slow to start on a
        # loaded machine) attaches while the job still runs; with 0.5 s iterations to 6
        # the job once finished first, and there was no coordinator loss to follow.
        job = c.client.submit({**APEX_TINY, "min_iter_time_s": 1.0,
                               "stop": {"training_iteration": 12},
                               "job": {"checkpoint_interval_s": 0}})
        first, _ = next_result(job, 0, lambda r: r["training_iteration"] >= 2, 150)
        job_id = job.id
        c.remember(job)
        follower = subprocess.Popen(
            [*CLUSTER_CLI, "jobs", "follow", job_id[:10], "--address", c.address, "--keys", keys,
             "--reconnect-timeout", "120", "--timeout", "5"], cwd=REPO,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        seen: list[str] = []
        _read_until(follower.stdout, "iter ", 60, seen)
        assert f"following job {job_id} (running" in "".join(seen), "".join(seen)
        streamer = Client(c.address, keys_dir=keys)
        threading.Thread(target=stream, args=(streamer.job(job_id),), daemon=True).start()
        old_actor_pids = [a["pid"] for a in job.actors()]
        c.client.close()
        c.coordinator.kill()
        c.coordinator.wait(10)
        assert pids_alive(old_actor_pids, 30) == []  # the node released them
        # Noticed by the disconnect or, at the latest, when the pending results call times
        # out (poll 10 s + 15 s); under a loaded machine that took over 60 s once.
        _read_until(follower.stdout, "lost the coordinator", 150, seen)
        c.coordinator, address = start_coordinator(str(tmp_path), keys, bind=c.address)
        assert address == c.address
        c.pids.add(c.coordinator.pid)
        c.client = Client(c.address, keys_dir=keys)
        assert c.client.wait_for_nodes(1, 60) == 1
        job = c.client.job(job_id)
        result, _ = next_result(job, job.status()["num_results"], lambda r: True, 150)
        assert result["training_iteration"] > first["training_iteration"]
        assert result["timesteps_total"] >= first["timesteps_total"]
        assert "resuming from checkpoint" in job.logs()
        c.remember(job)
        _read_until(follower.stdout, "reconnected", 60, seen)
        _read_until(follower.stdout, f"job {job_id} finished", 200, seen)
        assert follower.wait(30) == 0, "".join(seen)
        iterations = [int(line.split()[1]) for line in seen if line.startswith("iter ")]
        assert iterations[-1] >= 12 and iterations == sorted(iterations), "".join(seen)
        assert stream_done.wait(60), "Job.results() did not end with the job"
        assert stream_errors == [], stream_errors
        assert streamed[-1]["training_iteration"] >= 12
        assert any(r["info"].get("num_restarts") for r in streamed)  # resumed: a rollback
        assert any("lost the coordinator" in n for n in notes) and \
            any("reconnected" in n for n in notes), notes
    finally:
        if streamer is not None:
            streamer.close()
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait(10)
        if follower is not None:
            follower.stdout.close()
        c.close()


@pytest.mark.timeout(240)
def test_a_results_stream_reports_a_loss_it_finds_between_two_calls(tmp_path, keys):
    """A coordinator lost while no results call was pending (and restarted before the
    next): the stream's next call reaches the new coordinator on a fresh connection, and
    ``on_connection`` still hears of the loss and of the reconnection. It used to hear
    nothing (once in the restarted-coordinator test above, under the suite's load)."""
    c = Cluster(str(tmp_path), keys)
    try:
        c.join("127.0.0.7", "f", 4)
        job = c.client.submit({**APEX_TINY, "stop": {"training_iteration": 2}})
        finished = list(job.results(timeout_s=150))
        assert finished and job.status()["state"] == "finished", job.logs()[-3000:]
        c.remember(job)
        lost = threading.Event()
        connection = c.client.runtime.peers.clients[c.client._coordinator]
        connection.on_lost.append(lambda error: lost.set())  # its monitor saw the peer go
        c.coordinator.kill()
        c.coordinator.wait(10)
        assert lost.wait(30), "the client never saw the coordinator go"
        c.coordinator, address = start_coordinator(str(tmp_path), keys, bind=c.address)
        assert address == c.address
        c.pids.add(c.coordinator.pid)
        notes: list[str] = []
        again = list(job.results(timeout_s=60, on_connection=notes.append))
        assert [r["training_iteration"] for r in again] == \
            [r["training_iteration"] for r in finished]
        assert len(notes) == 2 and notes[0].startswith("lost the coordinator") and \
            notes[1].startswith("reconnected"), notes
    finally:
        c.close()


# ---------------------------------------------------------------------------- the shell
@pytest.mark.timeout(240)
def test_daemon_and_job_commands_from_the_shell(tmp_path, keys):
    """``coordinator start --daemon`` detaches and records itself; ``status``, ``submit``,
    ``jobs``, ``logs``, ``stop JOB`` and ``coordinator stop --with-nodes`` work from the
    shell; afterwards nothing runs and ``status`` says so."""
    state = str(tmp_path / "state")

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([*CLUSTER_CLI, *args, "--state-dir", state], cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    started = subprocess.run(
        [*CLUSTER_CLI, "coordinator", "start", "--daemon", "--bind", "tcp://127.0.0.1:0",
         "--keys", keys, "--state-dir", state], cwd=REPO, capture_output=True, text=True,
        timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    record = json.loads(read(os.path.join(state, "coordinator.json")))
    pid = record["pid"]
    assert os.getsid(pid) != os.getsid(0)  # detached into its own session
    sessions: list[str] = []
    node = join_node(str(tmp_path), record["address"], keys, "127.0.0.6", "shell", 4, sessions)
    pids = [pid, node.pid]
    try:
        with Client(record["address"], keys_dir=keys, bind_host=None) as client:
            assert client.wait_for_nodes(1, 60) == 1
        assert "1 node(s)" in cli("coordinator", "status").stdout
        config = tmp_path / "job.yaml"
        config.write_text("algorithm: apex\nnum_workers: 1\nlearning_starts: 64\n"
                          "min_iter_time_s: 0.5\nstop:\n  training_iteration: 100\n")
        job_id = cli("submit", str(config)).stdout.strip()
        assert job_id in cli("jobs").stdout
        assert "submitted: apex" in cli("logs", job_id[:12]).stdout
        with Client(record["address"], keys_dir=keys, bind_host=None) as client:
            learner = client.wait_for_actor("learner", owner=f"job:{job_id}", timeout_s=120)
            assert learner is not None
        assert "===== learner =====" in cli("logs", job_id, "--actors").stdout
        assert "stopped" in cli("stop", job_id).stdout
        bad = cli("submit", str(config), "--set", "num_workerz=2", check=False)
        assert bad.returncode == 2 and "num_workers" in bad.stderr
        assert "coordinator stopped" in cli("coordinator", "stop", "--with-nodes").stdout
        node.wait(60)
        assert pids_alive(pids, 30) == []
        assert not os.path.exists(os.path.join(state, "coordinator.json"))
        after = cli("coordinator", "status", check=False)
        assert after.returncode == 1 and "not running" in after.stdout
    finally:
        for p in pids_alive(pids, 0):
            os.kill(p, signal.SIGKILL)
        for session in sessions:
            shutil.rmtree(session, ignore_errors=True)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("light_fork_server")  # its actors are test actors
def test_local_client_runs_actors_in_process():
    """``Client.local()``: coordinator and node in this process; the raw actor API works
    and closing leaves no actor process."""
    with Client.local(num_cpus=2) as client:
        counter = client.create_actor("tests.actors.basic:Counter", args=(1,))
        assert client.get([counter.add.remote(i) for i in range(3)], timeout=30) == [1, 2, 4]
        ready, _ = client.wait([counter.pid.remote()], timeout=30)
        pid = client.get(ready[0])
        assert client.nodes()[0]["num_actors"] == 1
    assert pids_alive([pid], 15) == []


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("light_fork_server")  # its actors are test actors
def test_client_errors_arrive_typed():
    """Through the cluster client, a coordinator's refusals keep their type (and are
    RemoteErrors without the coordinator's traceback): a failed actor creation is an
    ActorCreationError, an unknown job a JobError, a bad submission a ConfigError."""
    from actorrl.cluster import JobError
    from actorrl.config.sections import ConfigError
    from actorrl.runtime.errors import ActorCreationError
    from transport.errors import RemoteError

    with Client.local(num_cpus=1) as client:
        with pytest.raises(ActorCreationError, match="constructor exploded") as created:
            client.create_actor("tests.actors.basic:Broken", num_cpus=0)
        assert isinstance(created.value, RemoteError)
        assert created.value.remote_traceback == ""
        with pytest.raises(ActorCreationError, match="no node named 'nowhere'"):
            client.create_actor("tests.actors.basic:Counter", num_cpus=0, node="nowhere")
        with pytest.raises(JobError, match="no job 'nope'"):
            client.job("nope")
        with pytest.raises(ConfigError, match="num_workerz") as refused:
            client.submit({"algorithm": "a2c", "num_workerz": 2})
        assert isinstance(refused.value, ValueError) and isinstance(refused.value, RemoteError)


def test_a_node_stopped_with_sigterm_leaves(tmp_path, keys):
    """SIGTERM makes a node send ``coord.leave`` before exiting: the coordinator records it
    as having left (it used to be declared lost after the heartbeat timeout)."""
    c = Cluster(str(tmp_path), keys)
    try:
        node = c.join("127.0.0.4", "leaver", 1, preload="numpy")  # it runs no actor
        node.send_signal(signal.SIGTERM)
        assert node.wait(30) == 0
        status = c.client.status()
        assert status["nodes"] == []  # gone at once, not after the heartbeat timeout
        assert [(n["name"], n["reason"]) for n in status["lost_nodes"]] == [
            ("leaver", "it left")]
    finally:
        c.close()


@pytest.mark.parametrize("how", ["shutdown", "sigkill"])
def test_closing_a_client_never_waits_on_a_gone_coordinator(tmp_path, keys, how,
                                                           monkeypatch):
    """After ``coord.shutdown`` (what ``actorrl coordinator stop`` sends) or a SIGKILL of
    the coordinator, ``Client.close()`` does not try to reach it; it used to wait 30 s on
    a fresh connection to the dead coordinator. Every timeout such a try could wait on is
    made 600 s here, so a close that tries misses the deadline by far on any machine. It
    also opens no connection: under load, a loss reported between close's check of the
    connection and its send once made that send reconnect (and wait)."""
    import actorrl.cluster.client

    monkeypatch.setattr(actorrl.cluster.client, "CLOSE_TIMEOUT_S", 600.0)
    proc, address = start_coordinator(str(tmp_path), keys)
    client = Client(address, keys_dir=keys, connect_timeout_s=600)
    closing = threading.Thread(target=client.close, name="client-close")
    peers = client.runtime.peers
    connects: list[str] = []
    try:
        assert client.nodes() == []
        real_connect = peers.connect
        monkeypatch.setattr(peers, "connect", lambda endpoint, *a, **k: (
            connects.append(endpoint), real_connect(endpoint, *a, **k))[1])
        if how == "shutdown":
            client.call("coord.shutdown", [False], timeout_s=10)
            proc.wait(30)
        else:
            proc.kill()
            proc.wait(10)
    finally:
        closing.start()
        closing.join(25)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not closing.is_alive(), "close() is waiting on the gone coordinator"
    assert connects == [], f"close() opened connections to the gone coordinator: {connects}"
