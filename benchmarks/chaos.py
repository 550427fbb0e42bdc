"""Chaos benchmark: learning jobs on a small cluster under a seeded schedule of faults;
prints ONE JSON object measured in one run.

    python benchmarks/chaos.py [--jobs apex,appo] [--fault-every 15] [--seed 0]
                               [--long-minutes 30] [--network auto|netns|loopback]
                               [--out FILE.json]
    python benchmarks/chaos.py --jobs "" --long-minutes 30    # the long run alone

A coordinator and three node agents (``--nodes``), each a separate process tree (the
coordinator bound to a fixed port so that it can be restarted on the same address with the
same state dir). Where they run (``--network``):

- ``netns`` (the default ``auto`` when run as root with iproute2's ``ip``): each node agent
  in a network namespace of its own, made by the benchmark, with its own IP address on a
  veth pair whose other end is a port of a bridge in the benchmark's namespace, where the
  coordinator listens on the bridge's address. The actors a node agent starts live in its
  namespace and advertise its address (``node join --host``); everything between hosts is
  tcp with CURVE keys made for the run. A partition is a real link cut: the node's veth is
  set down for 3-30 s, then up again;
- ``loopback`` (``--loopback``; ``auto`` when not root, without ``ip``, or when making a
  namespace fails): everything on 127.0.0.1 without keys, and a partition is a SIGSTOP of
  the node agent and its actors for 3-30 s, then SIGCONT.

The namespaces, veths and the bridge are removed at the end, also after an error, Ctrl-C
or SIGTERM, and the report says whether any is left.

Each job runs twice with the same seed: undisturbed, then under faults drawn from
``--seed``, one every ``--fault-every`` seconds (jittered by +-30%) until the job ends:

- ``worker`` / ``replay`` / ``learner``: SIGKILL of one of the job's actors of that kind;
- ``node``: SIGKILL of a node agent and every actor on it; the node rejoins 1-3 s later;
- ``coordinator``: SIGKILL of the coordinator, restarted at once with the same state dir;
- ``partition``: a node cut off for 3-30 s (``--partition-s``): its link down (netns), or
  it and its actors stopped (loopback).

Per job it reports time and env steps to the target for both runs and their ratio, the
faults injected, the rollbacks the results record (``info.num_restarts``,
``info.restored_iteration``, ``info.timesteps_lost``), and the invariants: the job
finished; ``training_iteration`` goes up by one except where a result records a new
rollback, which resumes at its ``restored_iteration`` + 1; ``timesteps_total`` never counts
lost work (it restarts from the restored iteration's); no process of the cluster, no
session folder, no shared-memory segment of a dead process, and (netns) no namespace, veth
or bridge is left afterwards.
``--long-minutes`` adds one long Ape-X run (a fault every 60 s) whose stop is that many
minutes of training.

Jobs: Ape-X on CartPole-v1 (target 450) and APPO on MinAtar Space Invaders (target 60,
the minatar extra). Faults need the job's actors alive to aim at: when the drawn kind has
no target (the learner is being restarted...), another kind is drawn.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The repository first, also when PYTHONPATH names it: benchmarks/transport.py (this
# script's folder comes first otherwise) would shadow the transport package.
sys.path[:] = [str(REPO), *(p for p in sys.path if p != str(REPO))]

from actorrl.cluster.client import Client  # noqa: E402

CLI = [sys.executable, "-m", "actorrl.cli.cluster"]
MARKER = "ACTORRL_CHAOS_RUN"
"""Environment variable set on every process the benchmark starts (leftover detection)."""

JOBS: dict[str, dict[str, Any]] = {
    "apex": {
        "algorithm": "apex", "env": "CartPole-v1", "num_workers": 2, "seed": 0,
        "min_iter_time_s": 1.0,
        "stop": {"episode_reward_mean": 450, "time_total_s": 900},
        "job": {"checkpoint_interval_s": 5, "max_failures": None},
    },
    "appo": {
        "algorithm": "appo", "env": "MinAtar/SpaceInvaders-v0", "seed": 0,
        "num_workers": 2, "num_envs_per_worker": 8, "rollout_fragment_length": 20,
        "train_batch_size": 160, "minibatch_buffer_size": 4, "num_sgd_iter": 2,
        "max_sample_requests_in_flight_per_worker": 1, "lr": 0.0005, "clip_param": 0.3,
        "vf_loss_coeff": 1.0, "entropy_coeff": 0.01, "grad_clip": 10,
        "model": {"conv_filters": [[16, 3, 1], [128, 10, 1]], "channels_first": False,
                  "vf_share_layers": True},
        "min_iter_time_s": 2.0,
        "stop": {"episode_reward_mean": 60, "time_total_s": 1800},
        "job": {"checkpoint_interval_s": 5, "max_failures": None},
    },
}
"""The benchmark's jobs (``actorrl submit`` configs): checkpoints every 5 s, no failure
limit (the benchmark measures what faults cost, not when a job gives up)."""

FAULT_KINDS = ("worker", "replay", "learner", "node", "coordinator", "partition")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


NETNS_PREFIX = "arlchaos-"
"""The benchmark's network namespaces: ``arlchaos-<run tag>-<node>``."""
LINK_PREFIX = "arlc"
"""Its links (at most 15 characters): ``arlc<tag>br``, the bridge; ``arlc<tag><node>h``,
a node's veth on the bridge (``...c``, its peer in the node's namespace)."""


def ip_command(*args: str) -> str:
    """Run iproute2's ``ip ARGS``; its output. RuntimeError with ip's message on failure."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: "
                           f"{done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def netns_problem() -> str | None:
    """Why this process cannot make network namespaces at all (None: it may try)."""
    if os.geteuid() != 0:
        return "not root (making network namespaces and links needs root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    return None


@dataclass
class Namespaces:
    """The benchmark's network: a bridge in this namespace (the coordinator's, at
    ``SUBNET.1``) and per node a network namespace joined to it by a veth pair (node
    ``i``'s address ``SUBNET.(10+i)``). :meth:`remove` undoes whatever was made."""

    tag: str = field(default_factory=lambda: os.urandom(2).hex())
    subnet: str = ""
    """The /24 in use, e.g. ``10.213.7`` (chosen by :meth:`create` among unused ones)."""
    hosts: dict[str, str] = field(default_factory=dict)
    """Node name -> its address."""
    made_namespaces: list[str] = field(default_factory=list)
    made_links: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        """The bridge's name."""
        return f"{LINK_PREFIX}{self.tag}br"

    @property
    def gateway(self) -> str:
        """The bridge's address: where the coordinator listens."""
        return f"{self.subnet}.1"

    def namespace(self, node: str) -> str:
        """The namespace of node ``node``."""
        return f"{NETNS_PREFIX}{self.tag}-{node}"

    def veth(self, node: str) -> str:
        """Node ``node``'s veth on the bridge (cut to partition it)."""
        return f"{LINK_PREFIX}{self.tag}{node}h"

    def create(self, nodes: list[str]) -> None:
        """Make the bridge and one namespace per node in ``nodes``; RuntimeError naming the
        ``ip`` command that failed (what was made is recorded for :meth:`remove`)."""
        used = ip_command("-4", "-o", "addr", "show") + ip_command("-4", "route", "show")
        rng = random.Random()
        free = [f"10.213.{n}" for n in range(256) if f"10.213.{n}." not in used]
        if not free:
            raise RuntimeError("no free 10.213.N.0/24 subnet on this host")
        self.subnet = rng.choice(free)
        self.made_links.append(self.bridge)
        ip_command("link", "add", self.bridge, "type", "bridge")
        ip_command("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip_command("link", "set", self.bridge, "up")
        for index, node in enumerate(nodes, start=1):
            self._add_node(node, f"{self.subnet}.{10 + index}")

    def _add_node(self, node: str, host: str) -> None:
        ns, outside, inside = self.namespace(node), self.veth(node), self.veth(node)[:-1] + "c"
        self.made_namespaces.append(ns)
        ip_command("netns", "add", ns)
        self.made_links.append(outside)
        ip_command("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip_command("link", "set", inside, "netns", ns)
        ip_command("link", "set", outside, "master", self.bridge)
        ip_command("link", "set", outside, "up")
        ip_command("-n", ns, "addr", "add", f"{host}/24", "dev", inside)
        ip_command("-n", ns, "link", "set", inside, "up")
        ip_command("-n", ns, "link", "set", "lo", "up")
        self.hosts[node] = host

    def exec_prefix(self, node: str) -> list[str]:
        """The command prefix that runs a program in node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(node)]

    def cut(self, node: str) -> None:
        """Partition node ``node``: its veth on the bridge goes down (packets to and from
        its namespace are dropped; nothing in it is told)."""
        ip_command("link", "set", self.veth(node), "down")

    def restore(self, node: str) -> None:
        """End :meth:`cut`."""
        ip_command("link", "set", self.veth(node), "up")

    def remove(self) -> None:
        """SIGKILL whatever still runs in the namespaces, delete them, the veths and the
        bridge (each step tried whatever the others did)."""
        for ns in self.made_namespaces:
            try:
                pids = ip_command("netns", "pids", ns).split()
            except RuntimeError:
                pids = []
            for pid in pids:
                _kill(int(pid))
            try:
                ip_command("netns", "del", ns)
            except RuntimeError:
                pass
        for link in reversed(self.made_links):  # a namespace's deletion took its veth
            if link in self.links_left():
                try:
                    ip_command("link", "del", link)
                except RuntimeError:
                    pass

    def namespaces_left(self) -> list[str]:
        """This run's namespaces that still exist."""
        try:
            listed = ip_command("netns", "list")
        except RuntimeError:
            return []
        names = [line.split()[0] for line in listed.splitlines() if line.strip()]
        return [n for n in names if n.startswith(f"{NETNS_PREFIX}{self.tag}-")]

    def links_left(self) -> list[str]:
        """This run's links (bridge, veths) that still exist here."""
        try:
            listed = ip_command("-o", "link", "show")
        except RuntimeError:
            return []
        names = [line.split(":")[1].strip().split("@")[0] for line in listed.splitlines()
                 if line.count(":") >= 2]
        return [n for n in names if n.startswith(f"{LINK_PREFIX}{self.tag}")]


@dataclass
class ChaosCluster:
    """A coordinator and ``nodes`` node agents, each its own process tree: on loopback, or
    (``network``) each node agent in a network namespace of its own."""

    root: Path
    nodes: int = 3
    cpus_per_node: int = 2
    network: Namespaces | None = None
    """The namespaces the node agents run in (None: loopback)."""
    partition_s: tuple[float, float] = (3.0, 30.0)
    """A partition's length is drawn uniformly from this range."""
    port: int = 0
    """The coordinator's port (0: a free one, chosen by :meth:`start`)."""
    coordinator: subprocess.Popen | None = None
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)
    sessions: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        """Where the coordinator listens: the bridge's address, or 127.0.0.1."""
        return self.network.gateway if self.network is not None else "127.0.0.1"

    @property
    def address(self) -> str:
        """The coordinator's address (the same across restarts)."""
        return f"tcp://{self.host}:{self.port}"

    @property
    def keys(self) -> Path | None:
        """The run's CURVE keys (netns: tcp off loopback needs them); None on loopback."""
        return self.root / "keys" if self.network is not None else None

    def node_names(self) -> list[str]:
        """``n1`` ... ``nN``."""
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def env(self) -> dict[str, str]:
        """The environment of every process started (marked for leftover checks)."""
        return {**os.environ, MARKER: str(self.root), "PYTHONPATH": str(REPO)}

    def start(self) -> None:
        """Start the coordinator and every node agent; wait until all have joined. With
        :attr:`network`, its namespaces must exist (:meth:`Namespaces.create`)."""
        if self.keys is not None and not self.keys.exists():
            from transport.auth import generate_keys

            generate_keys(str(self.keys), ["coordinator", "node", "admin"])
        if not self.port:
            self.port = free_port(self.host)
        self.start_coordinator()
        for name in self.node_names():
            self.join(name)
        with self.client() as client:
            if client.wait_for_nodes(self.nodes, 120) < self.nodes:
                raise RuntimeError(f"the node agents did not all join within 120 s; see "
                                   f"their logs in {self.root}")

    def _security(self) -> list[str]:
        return ["--keys", str(self.keys)] if self.keys is not None else \
            ["--insecure-loopback"]

    def start_coordinator(self) -> None:
        """Start (or restart) the coordinator on :attr:`address` with the same state dir."""
        read_fd, write_fd = os.pipe()
        args = ["coordinator", "start", "--bind", self.address, "--state-dir",
                str(self.root / "state"), *self._security(), "--ready-fd", str(write_fd)]
        self.coordinator = self._spawn([*CLI, *args], "coordinator.log", (write_fd,))
        os.close(write_fd)
        ready, _, _ = select.select([read_fd], [], [], 120)
        line = os.read(read_fd, 4096).decode() if ready else ""
        os.close(read_fd)
        if not line.startswith("READY "):
            raise RuntimeError(f"the coordinator did not start: {line!r}; see "
                               f"{self.root / 'coordinator.log'}")

    def join(self, name: str) -> None:
        """Start the node agent ``name`` (again, after a node fault): in its namespace,
        advertising the namespace's address, when :attr:`network` is set."""
        session = tempfile.mkdtemp(prefix=f"arl-chaos-{name}-")
        self.sessions.append(session)
        args = ["node", "join", self.address, "--name", name, "--cpus",
                str(self.cpus_per_node), "--gpus", "0", "--session-dir", session,
                *self._security()]
        prefix: list[str] = []
        if self.network is not None:
            # `ip netns exec` execs the node agent itself (the Popen's pid is the agent's).
            prefix = self.network.exec_prefix(name)
            args += ["--host", self.network.hosts[name]]
        self.agents[name] = self._spawn([*prefix, *CLI, *args], f"node-{name}.log")

    def client(self) -> Client:
        """A new client of the coordinator (the admin key with :attr:`network`: it may
        shut the coordinator down)."""
        if self.keys is not None:
            return Client(self.address, keys_dir=str(self.keys), identity="admin",
                          connect_timeout_s=30)
        return Client(self.address, insecure_loopback=True, connect_timeout_s=30)

    def _spawn(self, argv: list[str], log: str, fds: tuple[int, ...] = ()
               ) -> subprocess.Popen:
        with open(self.root / log, "ab") as f:
            return subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                                    stdout=f, stderr=subprocess.STDOUT, pass_fds=fds,
                                    env=self.env())

    def close(self) -> list[int]:
        """Stop everything and remove the namespaces; the pids of marked processes still
        alive 30 s later."""
        try:
            with self.client() as client:
                client.call("coord.shutdown", [True], timeout_s=30)
        except Exception:
            pass
        procs = [p for p in [self.coordinator, *self.agents.values()] if p is not None]
        deadline = time.monotonic() + 60
        for proc in procs:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        left = marked_processes(str(self.root), deadline_s=30)
        for pid in left:
            _kill(pid)
        if self.network is not None:
            self.network.remove()
        for session in self.sessions:
            shutil.rmtree(session, ignore_errors=True)
        return left


def marked_processes(marker: str, deadline_s: float) -> list[int]:
    """Processes whose environment carries ``MARKER=marker``, after waiting up to
    ``deadline_s`` for them to exit."""
    end = time.monotonic() + deadline_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if f"{MARKER}={marker}".encode() in environ.split(b"\0"):
                found.append(int(entry))
        if not found or time.monotonic() >= end:
            return found
        time.sleep(0.5)


SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "actorrl-shm."
"""actorrl's shared-memory segments: ``actorrl-shm.<uid>.<pid>.<start>.<n>``."""


def orphan_segments(before: set[str]) -> list[str]:
    """actorrl's shared-memory segments that appeared since ``before`` and whose creating
    process is gone (what a dead process left behind)."""
    if not SHM_DIR.is_dir():
        return []
    left = []
    for name in sorted(os.listdir(SHM_DIR)):
        if not name.startswith(SHM_PREFIX) or name in before:
            continue
        parts = name[len(SHM_PREFIX):].split(".")
        if len(parts) >= 2 and parts[1].isdigit() and not Path(f"/proc/{parts[1]}").exists():
            left.append(name)
    return left


class Injector:
    """Draws and injects faults into one job on a :class:`ChaosCluster`."""

    def __init__(self, cluster: ChaosCluster, job_id: str, rng: random.Random) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.rng = rng
        self.log: list[dict[str, Any]] = []

    def job_actors(self) -> list[dict[str, Any]]:
        """The job's live actors (empty while the coordinator is down)."""
        try:
            with self.cluster.client() as client:
                return [a for a in client.actors()
                        if self.job_id in str(a.get("owner")) and a.get("pid")]
        except Exception:
            return []

    def inject(self, started: float, only: str | None = None) -> dict[str, Any] | None:
        """One fault of kind ``only`` (None: of a kind drawn among those with a target now);
        its record, or None when there was no target."""
        actors = self.job_actors()
        kinds = list(FAULT_KINDS)
        self.rng.shuffle(kinds)
        for kind in [only] if only else kinds:
            record = self._try(kind, actors)
            if record is not None:
                record["t_s"] = round(time.monotonic() - started, 1)
                self.log.append(record)
                return record
        return None

    def _try(self, kind: str, actors: list[dict[str, Any]]) -> dict[str, Any] | None:
        by_name = {
            "worker": [a for a in actors if str(a["name"]).startswith("worker")],
            "replay": [a for a in actors if "replay" in str(a["name"])],
            "learner": [a for a in actors if a["name"] == "learner"],
        }
        if kind in by_name:
            if not by_name[kind]:
                return None
            actor = self.rng.choice(by_name[kind])
            _kill(int(actor["pid"]))
            return {"kind": kind, "actor": actor["name"], "node": actor["node"]}
        if kind == "coordinator":
            assert self.cluster.coordinator is not None
            self.cluster.coordinator.kill()
            self.cluster.coordinator.wait(30)
            self.cluster.start_coordinator()
            return {"kind": kind}
        nodes = sorted({a["node"] for a in actors if a["node"] in self.cluster.agents})
        if not nodes:
            return None
        name = self.rng.choice(nodes)
        pids = [int(a["pid"]) for a in actors if a["node"] == name]
        agent = self.cluster.agents[name]
        if kind == "node":
            agent.kill()
            for pid in pids:
                _kill(pid)
            agent.wait(30)
            time.sleep(self.rng.uniform(1, 3))  # the node is down for a moment
            self.cluster.join(name)
            return {"kind": kind, "node": name, "actors": len(pids)}
        pause = self.rng.uniform(*self.cluster.partition_s)
        network = self.cluster.network
        if network is not None:  # a real link cut: the node and its actors keep running
            network.cut(name)
            try:
                time.sleep(pause)  # the partition's length
            finally:
                network.restore(name)
            return {"kind": kind, "node": name, "seconds": round(pause, 1),
                    "how": "link down", "actors": len(pids)}
        for pid in [agent.pid, *pids]:
            _signal(pid, signal.SIGSTOP)
        try:
            time.sleep(pause)  # the partition's length
        finally:
            for pid in [agent.pid, *pids]:
                _signal(pid, signal.SIGCONT)
        return {"kind": kind, "node": name, "seconds": round(pause, 1), "how": "SIGSTOP",
                "actors": len(pids)}


def _kill(pid: int) -> None:
    _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _tcp_host(endpoint: str) -> str:
    """The host of an endpoint's tcp address (``tcp://HOST:PORT|...``); "" for none."""
    address = endpoint.split("|", 1)[0]
    return address[len("tcp://"):].rsplit(":", 1)[0] if address.startswith("tcp://") else ""


def read_results(path: Path) -> list[dict[str, Any]]:
    """The result rows of a job's ``result.jsonl`` (a torn last line is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def check_invariants(rows: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a job's result stream: iterations that neither go up by one nor
    resume after a recorded rollback, and env steps counted across a rollback."""
    problems = []
    restarts = 0
    for before, row in zip(rows, rows[1:]):
        info = row.get("info") or {}
        now = int(info.get("num_restarts") or 0)
        iteration, previous = row.get("training_iteration"), before.get("training_iteration")
        if now > restarts:
            restored = info.get("restored_iteration")
            if restored is None or iteration != int(restored) + 1:
                problems.append(f"iteration {iteration} after a rollback to {restored}")
            restarts = now
        elif iteration != previous + 1:
            problems.append(f"iteration {iteration} after {previous} with no rollback")
        if now == restarts and iteration == previous + 1 and \
                row.get("timesteps_total", 0) < before.get("timesteps_total", 0):
            problems.append(f"timesteps_total fell at iteration {iteration}")
    return problems


def run_job(cluster: ChaosCluster, name: str, config: dict[str, Any], *,
            fault_every_s: float | None, rng: random.Random,
            faults_at: list[tuple[int, str]] = ()) -> dict[str, Any]:
    """Submit ``config``, inject faults every ``fault_every_s`` (None: none) and those of
    ``faults_at`` (the kind once the job has written that many results) until the job
    ends; what it cost."""
    pending = sorted(faults_at)
    with cluster.client() as client:
        job_id = client.submit(config).id
    job_dir = cluster.root / "state" / "jobs" / job_id
    injector = Injector(cluster, job_id, rng)
    target = config["stop"].get("episode_reward_mean", math.inf)  # none: a time stop
    started = time.monotonic()
    next_fault = started + (fault_every_s or 0) * rng.uniform(0.7, 1.3)
    reached: dict[str, Any] | None = None
    actor_hosts: dict[str, str] = {}
    state = "pending"
    while state not in ("finished", "stopped", "failed"):
        if not actor_hosts and state == "running":  # where the actors are reached
            actor_hosts = {f"{a['name']}@{a['node']}": _tcp_host(str(a.get("endpoint")))
                           for a in injector.job_actors()}
        if fault_every_s and time.monotonic() >= next_fault:
            injector.inject(started)
            next_fault = time.monotonic() + fault_every_s * rng.uniform(0.7, 1.3)
        rows = read_results(job_dir / "result.jsonl")
        if pending and len(rows) >= pending[0][0] and \
                injector.inject(started, pending[0][1]) is not None:
            pending.pop(0)
        if reached is None:
            for row in rows:
                if (row.get("episode_reward_mean") or -1e9) >= target:
                    reached = {"seconds": round(time.monotonic() - started, 1),
                               "timesteps_total": row.get("timesteps_total"),
                               "training_s": row.get("time_total_s")}
                    break
        try:
            state = json.loads((job_dir / "job.json").read_text()).get("state", state)
        except (OSError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    rows = read_results(job_dir / "result.jsonl")
    last = rows[-1] if rows else {}
    info = last.get("info") or {}
    record = json.loads((job_dir / "job.json").read_text())
    return {
        "job": name, "state": state, "reached_target": reached,
        "job_failures": record.get("num_failures"),
        "num_worker_restarts": info.get("num_worker_restarts", 0),
        "wall_s": round(time.monotonic() - started, 1), "results": len(rows),
        "faults": injector.log, "num_restarts": info.get("num_restarts", 0),
        "timesteps_lost": info.get("timesteps_lost", 0),
        "timesteps_total": last.get("timesteps_total"),
        "rollbacks": [{"iteration": r["training_iteration"],
                       "restored_iteration": (r.get("info") or {}).get("restored_iteration")}
                      for before, r in zip(rows, rows[1:])
                      if (r.get("info") or {}).get("num_restarts", 0)
                      > (before.get("info") or {}).get("num_restarts", 0)],
        "faults_not_injected": [f"{k}:{kind}" for k, kind in pending],
        "actor_hosts": actor_hosts,
        "invariant_problems": check_invariants(rows),
    }


def parse_range(text: str) -> tuple[float, float]:
    """``MIN,MAX`` (or one number for both) as two floats, MIN <= MAX."""
    low, _, high = text.partition(",")
    try:
        pair = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN,MAX in seconds") from None
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < MIN <= MAX")
    return pair


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print and return its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="apex,appo")
    parser.add_argument("--fault-every", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long-minutes", type=float, default=0.0)
    parser.add_argument("--faults-at", default="", metavar="N:KIND,...",
                        help="faults at result counts instead of a clock (e.g. "
                             "2:learner,4:worker,6:coordinator), in the faulty run")
    parser.add_argument("--no-undisturbed", action="store_true",
                        help="skip the undisturbed reference run")
    parser.add_argument("--set", action="append", default=[], metavar="JOB.KEY=VALUE",
                        help="change a job's config (e.g. apex.stop.episode_reward_mean=150)")
    parser.add_argument("--network", choices=("auto", "netns", "loopback"), default="auto",
                        help="netns: each node agent in a network namespace of its own "
                             "(root and iproute2 needed), a partition cuts its link; "
                             "loopback: all on 127.0.0.1, a partition is a SIGSTOP; auto "
                             "(default): netns when possible, else loopback")
    parser.add_argument("--loopback", dest="network", action="store_const", const="loopback",
                        help="the same as --network loopback")
    parser.add_argument("--nodes", type=int, default=3, help="node agents (default 3)")
    parser.add_argument("--partition-s", type=parse_range, default=(3.0, 30.0),
                        metavar="MIN,MAX", help="a partition's length range (default 3,30)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    problem = netns_problem() if args.network != "loopback" else None
    if problem is not None and args.network == "netns":
        parser.error(f"--network netns: {problem}; run as root with iproute2, or pass "
                     "--loopback")
    jobs = {name: json.loads(json.dumps(JOBS[name])) for name in args.jobs.split(",") if name}
    for text in args.set:
        dotted, _, value = text.partition("=")
        name, *path = dotted.split(".")
        target = jobs[name]
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = json.loads(value)
    root = Path(tempfile.mkdtemp(prefix="arl-chaos-"))
    network = Namespaces() if args.network != "loopback" and problem is None else None
    cluster = ChaosCluster(root, nodes=args.nodes, network=network,
                           partition_s=args.partition_s)
    segments_before = set(os.listdir(SHM_DIR)) if SHM_DIR.is_dir() else set()
    # A SIGTERM (a stopped benchmark) still stops the cluster: SystemExit runs `finally`.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out: dict[str, Any] = {"measured": time.strftime("%Y-%m-%d %H:%M"), "seed": args.seed,
                           "fault_every_s": args.fault_every, "nodes": cluster.nodes,
                           "network": "loopback", "jobs": []}
    if problem is not None and args.network == "auto":
        out["network_note"] = f"no network namespaces: {problem}"
    try:
        if network is not None:
            try:
                network.create(cluster.node_names())
            except RuntimeError as exc:
                network.remove()
                if args.network == "netns":
                    raise RuntimeError(f"--network netns: making the namespaces failed "
                                       f"({exc}); pass --loopback to run without them"
                                       ) from None
                out["network_note"] = f"no network namespaces: {exc}"
                print(f"chaos.py: {out['network_note']}; running on loopback",
                      file=sys.stderr, flush=True)
                cluster.network = None
            else:
                out["network"] = "netns"
        cluster.start()
        with cluster.client() as client:
            out["node_hosts"] = {n["name"]: n["host"] for n in client.nodes()}
        faults_at = [(int(n), kind) for n, _, kind in
                     (item.partition(":") for item in args.faults_at.split(",") if item)]
        for name, config in jobs.items():
            calm = None if args.no_undisturbed else run_job(
                cluster, name, config, fault_every_s=None, rng=random.Random(args.seed))
            faulty = run_job(cluster, name, config,
                             fault_every_s=None if faults_at else args.fault_every,
                             rng=random.Random(args.seed), faults_at=faults_at)
            ratio = None
            if calm and calm["reached_target"] and faulty["reached_target"]:
                ratio = round(faulty["reached_target"]["seconds"]
                              / calm["reached_target"]["seconds"], 2)
            out["jobs"].append({"job": name, "undisturbed": calm, "faults": faulty,
                                "time_ratio": ratio})
            print(json.dumps(out["jobs"][-1]), file=sys.stderr, flush=True)
        if args.long_minutes:
            config = json.loads(json.dumps(JOBS["apex"]))
            config["stop"] = {"time_total_s": args.long_minutes * 60}
            out["long_run"] = run_job(cluster, "apex-long", config, fault_every_s=60.0,
                                      rng=random.Random(args.seed + 1))
    finally:
        # The cleanup runs to its end: a second Ctrl-C or SIGTERM must not leave the
        # cluster or its namespaces behind (it is bounded: about two minutes at most).
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            out["processes_left"] = cluster.close()
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous)
        out["session_folders_left"] = [s for s in cluster.sessions if os.path.exists(s)]
        out["shm_segments_left"] = orphan_segments(segments_before)
        if network is not None:
            out["namespaces_left"] = network.namespaces_left()
            out["links_left"] = network.links_left()
        shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return out


if __name__ == "__main__":
    main()
