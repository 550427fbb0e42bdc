"""Chaos benchmark: learning jobs on a small cluster under a seeded schedule of faults;
prints ONE JSON object measured in one run.

    python benchmarks/chaos.py [--jobs apex,appo] [--fault-every 15] [--seed 0]
                               [--long-minutes 30] [--out FILE.json]
    python benchmarks/chaos.py --jobs "" --long-minutes 30    # the long run alone

A coordinator and three node agents run on loopback, each a separate process tree (the
coordinator bound to a fixed port so that it can be restarted on the same address with the
same state dir). Each job runs twice with the same seed: undisturbed, then under faults
drawn from ``--seed``, one every ``--fault-every`` seconds (jittered by +-30%) until the job
ends:

- ``worker`` / ``replay`` / ``learner``: SIGKILL of one of the job's actors of that kind;
- ``node``: SIGKILL of a node agent and every actor on it; the node rejoins 1-3 s later;
- ``coordinator``: SIGKILL of the coordinator, restarted at once with the same state dir;
- ``partition``: SIGSTOP of a node agent and its actors for 3-30 s, then SIGCONT.

Per job it reports time and env steps to the target for both runs and their ratio, the
faults injected, the rollbacks the results record (``info.num_restarts``,
``info.restored_iteration``, ``info.timesteps_lost``), and the invariants: the job
finished; ``training_iteration`` goes up by one except where a result records a new
rollback, which resumes at its ``restored_iteration`` + 1; ``timesteps_total`` never counts
lost work (it restarts from the restored iteration's); no process of the cluster, no
session folder and no shared-memory segment of a dead process is left afterwards.
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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ChaosCluster:
    """A coordinator and ``nodes`` node agents on loopback, each its own process tree."""

    root: Path
    nodes: int = 3
    cpus_per_node: int = 2
    port: int = field(default_factory=free_port)
    coordinator: subprocess.Popen | None = None
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)
    sessions: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        """The coordinator's address (the same across restarts)."""
        return f"tcp://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment of every process started (marked for leftover checks)."""
        return {**os.environ, MARKER: str(self.root), "PYTHONPATH": str(REPO)}

    def start(self) -> None:
        """Start the coordinator and every node agent; wait until all have joined."""
        self.start_coordinator()
        for i in range(1, self.nodes + 1):
            self.join(f"n{i}")
        with self.client() as client:
            if client.wait_for_nodes(self.nodes, 120) < self.nodes:
                raise RuntimeError("the node agents did not all join within 120 s")

    def start_coordinator(self) -> None:
        """Start (or restart) the coordinator on :attr:`address` with the same state dir."""
        read_fd, write_fd = os.pipe()
        args = ["coordinator", "start", "--bind", self.address, "--state-dir",
                str(self.root / "state"), "--insecure-loopback", "--ready-fd", str(write_fd)]
        self.coordinator = self._spawn(args, "coordinator.log", (write_fd,))
        os.close(write_fd)
        ready, _, _ = select.select([read_fd], [], [], 120)
        line = os.read(read_fd, 4096).decode() if ready else ""
        os.close(read_fd)
        if not line.startswith("READY "):
            raise RuntimeError(f"the coordinator did not start: {line!r}")

    def join(self, name: str) -> None:
        """Start the node agent ``name`` (again, after a node fault)."""
        session = tempfile.mkdtemp(prefix=f"arl-chaos-{name}-")
        self.sessions.append(session)
        self.agents[name] = self._spawn(
            ["node", "join", self.address, "--name", name, "--cpus", str(self.cpus_per_node),
             "--gpus", "0", "--session-dir", session, "--insecure-loopback"],
            f"node-{name}.log")

    def client(self) -> Client:
        """A new client of the coordinator."""
        return Client(self.address, insecure_loopback=True, connect_timeout_s=30)

    def _spawn(self, args: list[str], log: str, fds: tuple[int, ...] = ()
               ) -> subprocess.Popen:
        with open(self.root / log, "ab") as f:
            return subprocess.Popen([*CLI, *args], cwd=REPO, stdin=subprocess.DEVNULL,
                                    stdout=f, stderr=subprocess.STDOUT, pass_fds=fds,
                                    env=self.env())

    def close(self) -> list[int]:
        """Stop everything; the pids of marked processes still alive 30 s later."""
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
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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
        pause = self.rng.uniform(3, 30)
        for pid in [agent.pid, *pids]:
            _signal(pid, signal.SIGSTOP)
        time.sleep(pause)  # the partition's length
        for pid in [agent.pid, *pids]:
            _signal(pid, signal.SIGCONT)
        return {"kind": kind, "node": name, "seconds": round(pause, 1)}


def _kill(pid: int) -> None:
    _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


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
    state = "pending"
    while state not in ("finished", "stopped", "failed"):
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
        "invariant_problems": check_invariants(rows),
    }


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
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    jobs = {name: json.loads(json.dumps(JOBS[name])) for name in args.jobs.split(",") if name}
    for text in args.set:
        dotted, _, value = text.partition("=")
        name, *path = dotted.split(".")
        target = jobs[name]
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = json.loads(value)
    root = Path(tempfile.mkdtemp(prefix="arl-chaos-"))
    cluster = ChaosCluster(root)
    segments_before = set(os.listdir(SHM_DIR)) if SHM_DIR.is_dir() else set()
    # A SIGTERM (a stopped benchmark) still stops the cluster: SystemExit runs `finally`.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out: dict[str, Any] = {"measured": time.strftime("%Y-%m-%d %H:%M"), "seed": args.seed,
                           "fault_every_s": args.fault_every, "nodes": cluster.nodes,
                           "jobs": []}
    try:
        cluster.start()
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
        signal.signal(signal.SIGTERM, previous)
        out["processes_left"] = cluster.close()
        out["session_folders_left"] = [s for s in cluster.sessions if os.path.exists(s)]
        out["shm_segments_left"] = orphan_segments(segments_before)
        shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return out


if __name__ == "__main__":
    main()
