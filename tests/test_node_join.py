"""Joining a cluster when something is wrong (issue 13, items 10 and 13), on loopback.

Authentication failures are reported as such on both sides, retried with backoff and
given up; a failed ``node join`` leaves no temporary directory; network errors name the
endpoint; ``train --address`` writes nothing before it reached its coordinator.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from actorrl.runtime.cluster.node_agent import CoordinatorAddressError, NodeAgent, NodeJoinError
from tests.helpers.cluster import (
    CLUSTER_CLI,
    REPO,
    keyed_coordinator,
    read,
    run_cli,
    run_dirs,
)
from transport.auth import generate_keys

BAD_NAME = "tcp://no-such-coordinator.invalid:7000"
pytestmark = pytest.mark.usefixtures("light_fork_server")  # the nodes here start no actor


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory):
    """A keyed coordinator on 127.0.0.1: ``(tmp, address, keys_dir)``."""
    with keyed_coordinator(str(tmp_path_factory.mktemp("coord"))) as coordinator:
        yield coordinator


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A short temporary directory used as the system's for this test (what
    ``tempfile.mkdtemp`` creates lands there, so the test can see what is left)."""
    path = Path(tempfile.mkdtemp(prefix="arl-t-"))
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def stranger_keys(tmp: Path, keys: str, *, node_known: bool, coordinator_right: bool) -> str:
    """A keys directory with a node identity the coordinator does (not) know and its
    coordinator.public right (or another key)."""
    path = tmp / ("stranger" if not node_known else "wrongcoord")
    path.mkdir(mode=0o700)
    if node_known:
        for name in ("node.public", "node.secret"):
            shutil.copy2(os.path.join(keys, name), path / name)
    else:
        generate_keys(str(path), ["node"], overwrite=True)
    if coordinator_right:
        shutil.copy2(os.path.join(keys, "coordinator.public"), path / "coordinator.public")
    else:
        other = tmp / "other"
        generate_keys(str(other), ["coordinator"])
        shutil.copy2(other / "coordinator.public", path / "coordinator.public")
    return str(path)


async def _join(address: str, keys: str) -> BaseException:
    """The NodeJoinError of a node that gives up joining (it used to retry forever: the
    deadline fails that)."""
    agent = NodeAgent(address, host="127.0.0.5", num_cpus=1, num_gpus=0, keys_dir=keys,
                      auth_attempts=3, auth_retry_s=0.05)
    with pytest.raises(NodeJoinError) as failed:
        await asyncio.wait_for(agent.run(), 60)
    return failed.value


@pytest.mark.timeout(90)
def test_a_node_key_the_coordinator_refuses_is_given_up_and_logged_once(
        coordinator, tmp_path, private_tmp):
    """A node whose key is not on the coordinator's allow-list fails with an error naming
    the coordinator and the key file after ``auth_attempts`` tries (it used to retry every
    2 s forever); the coordinator logs the refusal of that peer once, not once per try;
    the node's temporary session directory is gone."""
    tmp, address, keys = coordinator
    node_keys = stranger_keys(tmp_path, keys, node_known=False, coordinator_right=True)
    log_path = os.path.join(tmp, "coordinator.log")
    before = read(log_path).count("refused a CURVE connection")
    error = asyncio.run(_join(address, node_keys))
    text = str(error)
    assert address in text and "refused this node's key" in text, text
    assert f"{node_keys}/node.public" in text and "gave up after 3 tries" in text, text
    assert not list(private_tmp.glob("actorrl-node-*"))
    # One warning for the 3 refusals (written and flushed before each refusal is sent).
    lines = read(log_path).count("refused a CURVE connection") - before
    assert lines == 1, read(log_path)[-3000:]
    assert "unknown key" in read(log_path)


@pytest.mark.timeout(90)
def test_a_wrong_coordinator_key_is_an_authentication_error(coordinator, tmp_path,
                                                            private_tmp):
    """With a ``coordinator.public`` that is not the coordinator's, the node says that the
    CURVE handshake failed and which file is likely wrong, and gives up (it used to say
    "connection ... was lost" and retry forever). The coordinator logs it as an
    authentication failure on its endpoint, with the likely cause, once for all tries (it
    used to log nothing: no ZAP request happens)."""
    tmp, address, keys = coordinator
    log_path = os.path.join(tmp, "coordinator.log")
    before = read(log_path).count("authentication failure")
    node_keys = stranger_keys(tmp_path, keys, node_known=True, coordinator_right=False)
    error = asyncio.run(_join(address, node_keys))
    text = str(error)
    assert address in text and "CURVE handshake failed" in text, text
    assert f"{node_keys}/coordinator.public" in text and "was lost" not in text, text
    assert not list(private_tmp.glob("actorrl-node-*"))
    deadline = time.monotonic() + 10
    while read(log_path).count("authentication failure") == before and \
            time.monotonic() < deadline:  # the coordinator's own loop logs it: poll the file
        time.sleep(0.05)
    lines = [line for line in read(log_path).splitlines() if "authentication failure" in line]
    assert len(lines) - before == 1, read(log_path)[-3000:]
    assert address in lines[-1] and "wrong coordinator.public" in lines[-1], lines[-1]


def _node_join(args: list[str], tmpdir: Path, timeout_s: float = 30
               ) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([*CLUSTER_CLI, "node", "join", *args, "--cpus", "1", "--gpus", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          env=env)


@pytest.mark.timeout(90)
def test_a_failed_node_join_leaves_no_temporary_directory(coordinator, tmp_path,
                                                           private_tmp):
    """``node join`` whose keys directory lacks this node's secret exits 1 with the reason
    and removes its ``actorrl-node-*`` directory (it was made before the cleanup began)."""
    _, address, keys = coordinator
    partial = tmp_path / "partial"
    partial.mkdir(mode=0o700)
    shutil.copy2(os.path.join(keys, "coordinator.public"), partial / "coordinator.public")
    proc = _node_join([address, "--host", "127.0.0.6", "--keys", str(partial)], private_tmp)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "node.secret" in proc.stderr, proc.stderr
    assert not list(private_tmp.glob("actorrl-node-*"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("host", [None, "127.0.0.1"])
def test_an_unresolvable_coordinator_name_is_named(tmp_path, private_tmp, host):
    """A coordinator name that does not resolve is an error naming it, at once, with or
    without --host (it used to print only "Name or service not known" / "Temporary
    failure in name resolution", or, with --host, retry forever)."""
    args = [BAD_NAME] + (["--host", host] if host else [])
    proc = _node_join(args, private_tmp)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no-such-coordinator.invalid" in proc.stderr and BAD_NAME in proc.stderr, \
        proc.stderr
    assert not list(private_tmp.glob("actorrl-node-*"))
    with pytest.raises(CoordinatorAddressError, match="no-such-coordinator.invalid"):
        NodeAgent(BAD_NAME, num_cpus=1, num_gpus=0)


@pytest.mark.timeout(120)
def test_train_address_writes_nothing_before_the_coordinator_answers(tmp_path):
    """``train --address`` to a coordinator it cannot reach fails naming the address and
    creates no results folder (it used to leave a "failed" one)."""
    output = tmp_path / "results"
    proc = run_cli(["train", "apex", "--address", BAD_NAME, "--output", str(output)],
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no-such-coordinator.invalid" in proc.stderr, proc.stderr
    assert not run_dirs(output)


FOREIGN_IP = "203.0.113.5"
"""TEST-NET-3 (RFC 5737): never an address of this host and never routed, so binding it
fails at once, locally; nothing is sent to it."""


@pytest.mark.parametrize("args,env,setting,fix", [
    (["coordinator", "start", "--bind", f"tcp://{FOREIGN_IP}:7450"], {},
     f"--bind tcp://{FOREIGN_IP}:7450 (or $ACTORRL_BIND)", "--bind tcp://127.0.0.1:7450"),
    (["coordinator", "start", "--bind", "tcp://127.0.0.1:0", "--advertise", FOREIGN_IP],
     {}, f"--advertise {FOREIGN_IP} (or $ACTORRL_ADVERTISE)", "an address of this host"),
    (["node", "join", "tcp://127.0.0.1:9", "--host", FOREIGN_IP], {},
     f"--host {FOREIGN_IP} (or $ACTORRL_NODE_HOST)", "127.0.0.1"),
    (["node", "join", "tcp://127.0.0.1:9"], {"ACTORRL_NODE_HOST": FOREIGN_IP},
     f"--host {FOREIGN_IP} (or $ACTORRL_NODE_HOST)", "127.0.0.1"),
], ids=["coordinator-bind", "coordinator-advertise", "node-host", "node-host-env"])
def test_an_address_of_another_host_is_refused_naming_the_setting(args, env, setting, fix,
                                                                 tmp_path) -> None:
    """``actorrl coordinator start --bind`` / ``--advertise`` and ``actorrl node join
    --host`` (or ``$ACTORRL_NODE_HOST``) with an IP that is not this host's: a usage error
    (exit 2) naming the setting, the address and the fix, before anything listens or
    connects, instead of ZeroMQ's bare "Cannot assign requested address (addr=...)". The
    node's coordinator address is loopback's discard port: nothing reaches it either.
    With keys, as such a setup has (without them the keyless-bind refusal comes first)."""
    from tests.helpers.cluster import cli_env

    keys = str(tmp_path / "keys")
    generate_keys(keys)
    extra = ["--keys", keys] + (["--state-dir", str(tmp_path / "state")]
                                if args[0] == "coordinator" else [])
    proc = subprocess.run(
        [*CLUSTER_CLI, *args, *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**cli_env(), **env, "HOME": str(tmp_path)})
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr
    assert f"actorrl: error: {setting}: {FOREIGN_IP} is not an address of this host" in err, err
    assert fix in err and "addr='tcp://" not in err, err


def test_a_server_bound_to_another_hosts_address_names_the_address_and_the_fix() -> None:
    """Below the CLI (an API caller, an actor given such a host): binding an IP that is
    not this host's fails naming it and what to bind instead, not with ZeroMQ's message
    alone."""
    import zmq

    from transport.rpc import RpcServer

    server = RpcServer(lambda request: None)
    try:
        with pytest.raises(zmq.ZMQError) as info:
            server.bind(f"tcp://{FOREIGN_IP}:0")
    finally:
        server.close()
    message = str(info.value)
    assert f"cannot listen on tcp://{FOREIGN_IP}:0: {FOREIGN_IP} is not an address of this " \
           "host" in message, message
    assert "127.0.0.1" in message and "0.0.0.0" in message, message
