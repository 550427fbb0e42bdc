"""Many workers on one coordinator, and the cluster commands as deployments run them.

- 64 simulated rollout workers (``tests/actors/simulated.py``) on two node agents feed the
  real IMPALA pipeline through a coordinator; one agent is SIGKILLed; the pipeline carries
  on with its workers replaced on the other node, and no process is left behind;
- ``coordinator start`` and ``node join`` take their address, keys, name, host and CPUs
  from environment variables (what docs/deploy.md's Slurm script and Kubernetes manifests
  set), and ``node join`` without an address says where to give one;
- the Kubernetes manifests and Slurm script in docs/deploy.md drive exactly those
  commands and variables.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import tests.actors.simulated  # noqa: F401  (its wire types, for replies decoded here)
from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.runtime.cluster.coordinator import Coordinator
from actorrl.runtime.cluster.driver import ClusterDriver
from actorrl.runtime.network import Network
from actorrl.runtime.node.fork_server import PRELOAD_ENV
from actorrl.runtime.node.process import descendant_pids
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.sessions import remove_stale_session_dirs
from tests.helpers.procs import NO_TORCH_PRELOAD, pids_alive, terminate
from transport.auth import generate_keys
from transport.sockets import new_event_loop

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "actorrl.cli.cluster"]
FRAGMENT = 50
NUM_WORKERS = 64
SIMULATED_PRELOAD = {PRELOAD_ENV: "numpy,tests.actors.simulated"}
"""What the nodes' fork servers preload for simulated actors (which need no torch): what
those actors import, not the RL stack (~2 s of CPU per fork server for nothing)."""


def node_env(tmp: Path, address: str, name: str, host: str, cpus: int,
             keys: str | None = None) -> dict[str, str]:
    """The environment of a ``node join`` that is given nothing on its command line."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "ACTORRL_ADDRESS": address,
           "ACTORRL_NODE_NAME": name, "ACTORRL_NODE_HOST": host, "ACTORRL_CPUS": str(cpus),
           "ACTORRL_GPUS": "0"}
    if keys:
        env["ACTORRL_KEYS_DIR"] = keys
    return env


def start_node(tmp: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    """``actorrl node join`` with only ``extra`` flags; output to ``tmp/NAME.log``."""
    with open(tmp / f"{env['ACTORRL_NODE_NAME']}.log", "ab") as log:
        return subprocess.Popen([*CLI, "node", "join", *extra], cwd=REPO, env=env,
                                stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)


def child_pids(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    return sorted(descendant_pids(pid))


async def _nodes_joined(coordinator: Coordinator, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(coordinator.nodes) < count:
        assert time.monotonic() < deadline, f"{len(coordinator.nodes)} of {count} nodes"
        await coordinator.wait_change(0.5)


async def _run_until(pipeline: Any, batches: int, timeout_s: float) -> None:
    """Step ``pipeline`` until it has sampled ``batches`` more fragments."""
    target = pipeline.num_steps_sampled + batches * FRAGMENT
    deadline = time.monotonic() + timeout_s
    while pipeline.num_steps_sampled < target:
        assert time.monotonic() < deadline, (
            f"the pipeline sampled {pipeline.num_steps_sampled} of {target} steps in "
            f"{timeout_s} s")
        await pipeline.step()


async def _scale_and_lose_a_node(tmp: Path) -> dict[str, Any]:
    network = Network.create("127.0.0.1", "coord-test-scale", None, "coordinator",
                             insecure_loopback=True)
    session = tmp / "coord"
    session.mkdir(mode=0o700)
    runtime = Runtime.start(str(session), "coordinator", extra_bind=["tcp://127.0.0.1:0"],
                            network=network)
    coordinator = Coordinator(runtime)
    coordinator.serve()
    coordinator.start()
    address = runtime.server.endpoints[-1]
    lost: list[str] = []
    coordinator.on_node_lost.append(lambda node, reason: lost.append(node.name))
    # Node "a" holds the learner, half the workers and room for the other half's
    # replacements; node "b" holds the even-numbered workers (a soft preference).
    half = NUM_WORKERS // 2
    # The nodes' session folders go to a temp folder of their own: another test run on
    # this host (or another xdist worker) starting a session would otherwise sweep node
    # b's stale folder before this test's own sweep below could.
    node_tmp = tempfile.mkdtemp(prefix="arl-scale-")  # short: ipc paths max ~107 bytes
    private = {**SIMULATED_PRELOAD, "TMPDIR": node_tmp}
    nodes = {"a": start_node(tmp, {**node_env(tmp, address, "a", "127.0.0.21", 1 + 2 * half),
                                   **private}, "--insecure-loopback"),
             "b": start_node(tmp, {**node_env(tmp, address, "b", "127.0.0.22", half),
                                   **private}, "--insecure-loopback")}
    out: dict[str, Any] = {"node_pids": [p.pid for p in nodes.values()]}
    trainer = None
    try:
        await _nodes_joined(coordinator, 2, 120)
        spec = dataclasses.replace(get_algorithm("impala"),
                                   worker_class="tests.actors.simulated:SimulatedWorker",
                                   learner_class="tests.actors.simulated:SinkLearner")
        config = load_config(spec.config_cls, {
            "num_workers": NUM_WORKERS, "rollout_fragment_length": FRAGMENT,
            "num_envs_per_worker": 1, "train_batch_size": 4 * FRAGMENT,
            "env_config": {"sim_batch": "cartpole", "sim_rate_hz": 5}})
        driver = ClusterDriver(coordinator, "test-scale", start_timeout_s=120, placement={
            "learner": "a", "worker-*[02468]": "b", "worker-*": "a"})
        trainer = await Trainer.create(spec, config, driver)
        pipeline = trainer.pipeline
        assert pipeline is not None
        records = [r for r in coordinator.actors.values() if r.owner == "test-scale"]
        by_node = {name: [r for r in records if coordinator.nodes[r.node_id].name == name]
                   for name in nodes}
        out["workers_on_b"] = sum(r.spec.name.startswith("worker-") for r in by_node["b"])
        out["all_pids"] = [r.pid for r in records]
        out["b_pids"] = [r.pid for r in by_node["b"]]
        await _run_until(pipeline, NUM_WORKERS, 120)  # every worker is sampled from

        nodes["b"].send_signal(signal.SIGKILL)
        nodes["b"].wait(30)
        killed = time.monotonic()
        while not lost:
            assert time.monotonic() - killed < 30, "node b was not noticed lost"
            await pipeline.step(0.1)
        out["detect_s"] = time.monotonic() - killed
        out["lost"] = list(lost)
        # The pipeline carries on: the lost workers are replaced on node a and it routes
        # another round of batches from a full set of workers.
        await _run_until(pipeline, 2 * NUM_WORKERS, 120)
        # The survivors routed those while the replacements started in the background;
        # the step goes on until every lost worker has its replacement.
        deadline = time.monotonic() + 120
        while trainer.num_worker_restarts < half:
            assert time.monotonic() < deadline, f"{trainer.num_worker_restarts} replaced"
            await pipeline.step(0.1)
        out["workers_after"] = len(pipeline.workers)
        out["restarts"] = trainer.num_worker_restarts
        alive = [r for r in coordinator.actors.values()
                 if r.owner == "test-scale" and r.state == "alive"]
        out["alive_on_b"] = [r.spec.name for r in alive
                             if r.node_id not in coordinator.nodes]
        out["all_pids"] += [r.pid for r in alive]
        out["a_children"] = child_pids(nodes["a"].pid)
    finally:
        if trainer is not None:
            await trainer.stop()
        await coordinator.shutdown(release_nodes=True)
        for proc in nodes.values():
            if proc.poll() is None:
                terminate(proc)
        runtime.close()
        # Node b was SIGKILLed and could not remove its session folder: the next session
        # started with the nodes' temp folder does (make_session_dir), which this stands for.
        saved_tempdir, tempfile.tempdir = tempfile.tempdir, node_tmp
        try:
            out["stale_removed"] = remove_stale_session_dirs()
        finally:
            tempfile.tempdir = saved_tempdir
            out["node_tmp_left"] = os.listdir(node_tmp)
            shutil.rmtree(node_tmp, ignore_errors=True)
    return out


@pytest.mark.timeout(300)
def test_64_simulated_workers_carry_on_when_a_node_is_killed(tmp_path: Path) -> None:
    """64 simulated workers on two node agents feed the IMPALA pipeline; SIGKILL of the
    agent holding 32 of them: the coordinator notices, the pipeline replaces them on the
    other node and keeps routing batches, and afterwards no actor, fork server or node
    process is left."""
    loop = new_event_loop()
    try:
        out = loop.run_until_complete(_scale_and_lose_a_node(tmp_path))
    finally:
        loop.close()
    assert out["workers_on_b"] == NUM_WORKERS // 2, out["workers_on_b"]
    assert out["lost"] == ["b"]
    assert out["detect_s"] < 30
    assert out["workers_after"] == NUM_WORKERS
    assert out["restarts"] >= NUM_WORKERS // 2
    assert out["alive_on_b"] == []
    assert any("actorrl-node-" in path for path in out["stale_removed"]), out["stale_removed"]
    assert out["node_tmp_left"] == [], out["node_tmp_left"]  # node a removed its own
    assert pids_alive(out["b_pids"], 30) == []  # killed with their node
    pids = out["all_pids"] + out["a_children"] + out["node_pids"]
    assert pids_alive(pids, 60) == []


def _start_coordinator(tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    read_fd, write_fd = os.pipe()
    with open(tmp / "coordinator.log", "ab") as log:
        proc = subprocess.Popen(
            [*CLI, "coordinator", "start", "--ready-fd", str(write_fd)], cwd=REPO, env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            pass_fds=(write_fd,))
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 60)
        line = os.read(read_fd, 4096).decode() if ready else ""
    finally:
        os.close(read_fd)
    if not line.startswith("READY "):
        terminate(proc)
        raise AssertionError(f"coordinator did not start: {line!r}\n"
                             + (tmp / "coordinator.log").read_text()[-3000:])
    return proc, line.split()[1]


@pytest.mark.timeout(180)
def test_cluster_commands_take_address_and_keys_from_the_environment(tmp_path: Path
                                                                     ) -> None:
    """``coordinator start``, ``node join`` and ``nodes`` with no address, keys, bind, name,
    host or CPU flags: all of it from ACTORRL_* variables, CURVE included."""
    keys = str(tmp_path / "keys")
    generate_keys(keys)
    base = {**os.environ, "PYTHONPATH": str(REPO)}
    coord_env = {**base, "ACTORRL_BIND": "tcp://127.0.0.1:0", "ACTORRL_KEYS_DIR": keys,
                 "ACTORRL_STATE_DIR": str(tmp_path / "state")}
    coord, address = _start_coordinator(tmp_path, coord_env)
    node = None
    try:
        assert address.startswith("tcp://127.0.0.1:")
        # Everything from the environment; its fork server preloads no torch (no actors).
        node = start_node(tmp_path, {**node_env(tmp_path, address, "from-env", "127.0.0.23", 3,
                                                keys), **NO_TORCH_PRELOAD})
        client_env = {**base, "ACTORRL_ADDRESS": address, "ACTORRL_KEYS_DIR": keys}
        deadline = time.monotonic() + 90
        listed: list[dict[str, Any]] = []
        while not listed:
            assert time.monotonic() < deadline, "the node did not join"
            result = subprocess.run([*CLI, "nodes", "--json", "--timeout", "30"], cwd=REPO,
                                    env=client_env, capture_output=True, text=True,
                                    timeout=60)
            assert result.returncode == 0, result.stderr
            listed = json.loads(result.stdout)
        assert [(n["name"], n["host"], n["num_cpus"], n["num_gpus"]) for n in listed] == [
            ("from-env", "127.0.0.23", 3.0, 0.0)]
        missing = subprocess.run([*CLI, "node", "join"], cwd=REPO, env=base,
                                 capture_output=True, text=True, timeout=60)
        assert missing.returncode == 2
        assert "ACTORRL_ADDRESS" in missing.stderr and "ADDRESS" in missing.stderr
    finally:
        if node is not None:
            terminate(node)
        terminate(coord)
    assert pids_alive([coord.pid] + ([node.pid] if node else []), 30) == []


# ---------------------------------------------------------------- docs/deploy.md
DEPLOY = REPO / "docs" / "deploy.md"


def _blocks(language: str) -> list[str]:
    """docs/deploy.md's ``language`` code blocks as the site shows them: a block that is a
    snippet include (``--8<-- "PATH"``, pymdownx.snippets) is the file it names."""
    text = DEPLOY.read_text()
    blocks = re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)
    return [re.sub(r'^--8<-- "([^"]+)"$', lambda m: (REPO / m.group(1)).read_text(), block,
                   flags=re.M) for block in blocks]


def _actorrl_command(command: list[str]) -> list[str]:
    """The ``actorrl ...`` argv a container runs: its command itself, or the one a
    ``sh -c "... && exec actorrl ..."`` ends with (pods that install actorrl first)."""
    if command[:2] == ["sh", "-c"]:
        return shlex.split(command[2].rsplit("exec ", 1)[1])
    return command


def _cli_commands() -> dict[str, set[str]]:
    """Each cluster command's flags, from the CLI's own parser."""
    import argparse

    from actorrl.cli.cluster import register

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register(sub)
    flags: dict[str, set[str]] = {}
    # Private (argparse's _actions, 3 uses): argparse offers no public way to list the
    # options a parser accepts, and the check is that the docs use only those.
    for name, action in sub.choices.items():
        for inner in action._actions:
            if isinstance(inner, argparse._SubParsersAction):
                for verb, p in inner.choices.items():
                    flags[f"{name} {verb}"] = {o for a in p._actions for o in a.option_strings}
        flags.setdefault(name, {o for a in action._actions for o in a.option_strings})
    return flags


def _containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for doc in docs:
        if doc.get("kind") in ("Deployment", "StatefulSet"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                out[doc["metadata"]["name"]] = {"container": container, "doc": doc}
    return out


def test_kubernetes_manifests_run_the_cli_with_what_it_needs() -> None:
    """The manifests parse; the coordinator Deployment runs ``actorrl coordinator start``
    bound to the Service's port with keys from the Secret; the node agents run
    ``actorrl node join`` with ACTORRL_ADDRESS naming that Service, their own pod IP as
    ACTORRL_NODE_HOST and the same Secret's keys."""
    docs = [d for block in _blocks("yaml") for d in yaml.safe_load_all(block) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Service", "Deployment", "StatefulSet"} <= kinds, kinds
    service = next(d for d in docs if d["kind"] == "Service")
    # The Secret is made from `actorrl keys generate keys/` by kubectl, as the docs say.
    made = re.search(r"kubectl create secret generic (\S+) --from-file=keys/",
                     DEPLOY.read_text())
    assert made, "docs/deploy.md no longer says how the keys Secret is made"
    secret = {"metadata": {"name": made.group(1)}}
    containers = _containers(docs)
    coord = _actorrl_command(containers["actorrl-coordinator"]["container"]["command"])
    nodes = _actorrl_command(containers["actorrl-node"]["container"]["command"])
    assert coord[:3] == ["actorrl", "coordinator", "start"]
    assert nodes[:3] == ["actorrl", "node", "join"]
    flags = _cli_commands()
    for command, verb in ((coord, "coordinator start"), (nodes, "node join")):
        used = {a.split("=")[0] for a in command[3:] if a.startswith("--")}
        assert used <= flags[verb], used - flags[verb]
    env = {c: {e["name"]: e for e in containers[c]["container"]["env"]} for c in containers}
    port = service["spec"]["ports"][0]["port"]
    assert env["actorrl-coordinator"]["ACTORRL_BIND"]["value"] == f"tcp://0.0.0.0:{port}"
    assert env["actorrl-node"]["ACTORRL_ADDRESS"]["value"] == (
        f"tcp://{service['metadata']['name']}:{port}")
    assert env["actorrl-node"]["ACTORRL_NODE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] \
        == "status.podIP"
    assert service["spec"]["selector"].items() <= containers["actorrl-coordinator"][
        "doc"]["spec"]["template"]["metadata"]["labels"].items()
    for name in ("actorrl-coordinator", "actorrl-node"):
        # Secret files are group-readable symlinks, which actorrl refuses as keys: an init
        # container copies them from the Secret into the private volume the keys dir is.
        keys_dir = env[name]["ACTORRL_KEYS_DIR"]["value"]
        pod = containers[name]["doc"]["spec"]["template"]["spec"]
        mounts = {m["mountPath"]: m["name"] for m in containers[name]["container"]
                  ["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        init = pod["initContainers"][0]
        init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
        secret_volume = next(n for n in init_mounts if "secret" in volumes[n])
        assert volumes[secret_volume]["secret"]["secretName"] == secret["metadata"]["name"]
        assert mounts[keys_dir] in init_mounts
        script = " ".join(init["command"])
        assert "chmod 700" in script and "chmod 600" in script
        assert f"{init_mounts[secret_volume]}/" in script


def test_slurm_script_runs_the_cli_with_the_environment() -> None:
    """The Slurm batch script (deploy/slurm/actorrl.sbatch, which the docs include) starts
    the coordinator on the first node and one node agent per node through srun, setting
    the ACTORRL_* variables the commands read and passing no flag the CLI lacks
    (tests/test_slurm.py runs it under Slurm)."""
    script = next(b for b in _blocks("bash") if "#SBATCH" in b)
    assert "actorrl coordinator start" in script and "actorrl node join" in script
    assert "srun" in script and "ACTORRL_ADDRESS" in script and "ACTORRL_KEYS_DIR" in script
    flags = _cli_commands()
    for verb in ("coordinator start", "coordinator stop", "node join", "nodes", "submit"):
        for line in re.findall(rf"actorrl {verb}([^\n]*)", script):
            used = set(re.findall(r"(--[a-z-]+)", line))
            assert used <= flags[verb], (verb, used - flags[verb])
