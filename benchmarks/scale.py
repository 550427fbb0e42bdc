"""Scale by simulation: hundreds of rollout workers on one coordinator; prints ONE JSON
object and writes a plot.

    python benchmarks/scale.py [--quick] [--plot docs/results/scale.png]

The real Ape-X and IMPALA pipelines, coordinator, node agents, transport and replay shards
run unchanged; only the rollout workers and the learner are stand-ins
(``tests/actors/simulated.py``, plugged in through ``AlgorithmSpec.worker_class`` /
``learner_class``): each simulated worker is its own actor process, forked by its node's
fork server, answering ``sample_ref`` with a prebuilt batch (a 50-step Pong fragment as
actorrl packs it, ~375 kB, or a 50-step CartPole fragment) as fast as it is asked; the
learner fetches every train batch from its owner and trains nothing. The coordinator is
this process (a cluster job's pipeline runs in the coordinator's process and loop, as
here); node agents are ``actorrl node join`` processes on their own loopback addresses
(plain tcp, ``--insecure-loopback``): one for the learner and replay shard, four for the
workers (each carrying N/4).

Per series (IMPALA with Pong batches, IMPALA with CartPole batches, Ape-X with Pong
batches) and worker count N, a row holds:

- ``batches_per_s``: sample batches routed per second by the pipeline (sampled by a
  worker, handed by reference to the learner or a replay shard), measured over a window
  after a warm-up; with this 2-core machine saturated by N+7 processes this is a
  whole-machine figure, not the coordinator's ceiling;
- ``coordinator_cpu_ms_per_batch``: this process's CPU time (all threads: event loop and
  ZeroMQ I/O) over the window, per routed batch; ``coordinator_cpu_share`` the fraction of
  one core it used;
- ``coordinator_bytes_per_batch``: bytes sent plus received by the coordinator's sockets
  (``Runtime.traffic()``: its server and every connection it opened) over the window,
  per routed batch;
- ``weight_serialisations_per_version``: wire encodings of the learner's weights (counted
  by the learner) per weights version handed out (``get_weights`` calls); N workers
  fetch each version;
- ``start_s``: ``Trainer.create`` for N workers, the learner and the first weight broadcast;
  ``start_coordinator_cpu_s`` the coordinator's CPU time in it (the rest is the node
  agents forking and the new processes starting);
- ``pss_mb_per_worker``: mean PSS of the worker processes (``/proc/PID/smaps_rollup``);
- ``node_loss_detect_s``: from SIGKILL of one worker node's agent (its N/4 workers die with
  it) to the coordinator declaring the node lost; ``node_loss_recover_s`` to the pipeline
  routing N more batches after that, with the lost workers replaced on the other nodes
  (``workers_after``; ``node_loss_recovered`` false: not within 60 s of the kill). A train
  batch the learner is fetching from a worker that died waits for the learner's connect
  timeout (30 s) before it is counted lost, and holds IMPALA's enqueue credit meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, str(REPO))

import tests.actors.simulated  # noqa: E402,F401  (its wire types)
from actorrl.algorithms import Trainer, get_algorithm  # noqa: E402
from actorrl.config.algorithm import load_config  # noqa: E402
from actorrl.runtime.cluster.coordinator import Coordinator  # noqa: E402
from actorrl.runtime.cluster.driver import ClusterDriver  # noqa: E402
from actorrl.runtime.network import Network  # noqa: E402
from actorrl.runtime.node.fork_server import PRELOAD_ENV, PRELOAD_MODULES  # noqa: E402
from actorrl.runtime.process.runtime import Runtime  # noqa: E402
from transport.sockets import new_event_loop  # noqa: E402

SIM_MODULE = "tests.actors.simulated"
"""Preloaded by the nodes' fork servers besides the usual modules: the stand-ins' prebuilt
fragments then reach every forked worker in shared pages."""
SIM_WORKER = f"{SIM_MODULE}:SimulatedWorker"
SINK_LEARNER = f"{SIM_MODULE}:SinkLearner"
CLI = [sys.executable, "-m", "actorrl.cli.cluster"]
FRAGMENT = 50
WORKER_NODES = 4
NODE_CPUS = 96  # per worker node: N/4 workers plus room for the lost node's replacements

SERIES = {
    "impala-pong": ("impala", "pong"),
    "impala-cartpole": ("impala", "cartpole"),
    "apex-pong": ("apex", "pong"),
}


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pss_mb(pid: int) -> float:
    """Proportional set size of a process in MB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class NodeAgents:
    """``actorrl node join`` processes on loopback addresses 127.0.0.x."""

    def __init__(self, address: str, root: str) -> None:
        self.address = address
        self.root = root
        self.procs: dict[str, subprocess.Popen] = {}
        self.count = 0

    def start(self, name: str, cpus: float) -> None:
        """Start node ``name`` offering ``cpus`` CPUs."""
        self.count += 1
        env = {**os.environ, "PYTHONPATH": str(REPO), "ACTORRL_LOG_LEVEL": "WARNING",
               PRELOAD_ENV: ",".join([*PRELOAD_MODULES, SIM_MODULE])}
        with open(os.path.join(self.root, f"{name}.log"), "ab") as log:
            self.procs[name] = subprocess.Popen(
                [*CLI, "node", "join", self.address, "--host", f"127.0.0.{10 + self.count}",
                 "--name", name, "--cpus", str(cpus), "--gpus", "0", "--insecure-loopback"],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT)

    def kill(self, name: str) -> None:
        """SIGKILL node ``name``'s agent."""
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def close(self) -> None:
        """Stop every agent (SIGTERM: it stops its actors), SIGKILL after 30 s."""
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs.clear()


def make_config(algo: str, n: int, batch: str) -> Any:
    """The algorithm's config for N simulated workers sending ``batch`` fragments."""
    spec = get_algorithm(algo)
    values: dict[str, Any] = {
        "env": "CartPole-v1", "num_workers": n, "num_envs_per_worker": 1,
        "rollout_fragment_length": FRAGMENT, "num_cpus_per_worker": 1,
        "env_config": {"sim_batch": batch, "sim_learner_cost_s": 0.0, "sim_weights_mb": 1.0},
    }
    if algo == "impala":
        values.update(train_batch_size=10 * FRAGMENT)
    else:
        values.update(training_intensity=None, train_batch_size=64, buffer_size=20_000,
                      learning_starts=500, max_weight_sync_delay=400)
    sim = dataclasses.replace(spec, worker_class=SIM_WORKER, learner_class=SINK_LEARNER)
    return sim, load_config(spec.config_cls, values)


class Bench:
    """The coordinator (this process), its node agents, and one case after another."""

    def __init__(self, root: str) -> None:
        self.root = root

    async def start(self) -> None:
        """Serve a coordinator on 127.0.0.1 and start the learner node."""
        network = Network.create("127.0.0.1", "coord-scale", None, "coordinator",
                                 insecure_loopback=True)
        session = os.path.join(self.root, "coord")
        os.makedirs(session, mode=0o700)
        self.runtime = Runtime.start(session, "coordinator", extra_bind=["tcp://127.0.0.1:0"],
                                     network=network)
        self.coordinator = Coordinator(self.runtime)
        self.coordinator.serve()
        self.coordinator.start()
        self.address = self.runtime.server.endpoints[-1]
        self.nodes = NodeAgents(self.address, self.root)
        self.worker_nodes = [f"workers-{i}" for i in range(WORKER_NODES)]
        try:
            self.nodes.start("learner", 2)
            for name in self.worker_nodes:
                self.nodes.start(name, NODE_CPUS)
            await self.wait_nodes(1 + WORKER_NODES)
            await self.warm_up()
        except BaseException:  # a failed start leaves no node agent behind
            await self.close()
            raise
        self.lost: list[tuple[float, str]] = []
        self.coordinator.on_node_lost.append(
            lambda node, reason: self.lost.append((time.perf_counter(), node.name)))

    async def wait_nodes(self, count: int, timeout_s: float = 120) -> None:
        """Until ``count`` nodes are members."""
        deadline = time.monotonic() + timeout_s
        while len(self.coordinator.nodes) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self.coordinator.nodes)} of {count} nodes "
                                   f"joined; see the logs in {self.root}")
            await self.coordinator.wait_change(1.0)

    async def close(self) -> None:
        """Stop the nodes and the coordinator."""
        await self.coordinator.shutdown(release_nodes=True)
        self.nodes.close()
        self.runtime.close()

    def wire_bytes(self) -> int:
        """Bytes sent plus received by the coordinator's sockets so far."""
        traffic = self.runtime.traffic()
        return traffic["bytes_sent"] + traffic["bytes_received"]

    async def warm_up(self) -> None:
        """Start and stop one actor on every node, so that each node's fork server has
        imported torch before the first measured start."""
        driver = ClusterDriver(self.coordinator, "bench-warm-up")
        handles = await asyncio.gather(*(
            driver.create_actor(SIM_WORKER, args=("", "", {}), num_cpus=0, name=f"warm-{n}",
                                node=n) for n in ["learner", *self.worker_nodes]))
        await asyncio.gather(*(driver.kill_actor(h) for h in handles))

    def actor_records(self, owner: str, prefix: str) -> list[Any]:
        """Live actors of ``owner`` whose name starts with ``prefix``."""
        return [r for r in self.coordinator.actors.values()
                if r.owner == owner and r.spec.name.startswith(prefix) and r.state == "alive"]

    async def case(self, series: str, n: int, window_s: float, node_loss: bool
                   ) -> dict[str, Any]:
        """One row: N workers of ``series``."""
        algo, batch = SERIES[series]
        spec, config = make_config(algo, n, batch)
        owner = f"bench-{series}-{n}"
        driver = ClusterDriver(self.coordinator, owner, placement={"learner": "learner"},
                               colocate={"replay-*": "learner"}, start_timeout_s=120)
        started, start_cpu = time.perf_counter(), cpu_seconds()
        trainer = await Trainer.create(spec, config, driver)
        start_s = time.perf_counter() - started
        start_cpu = cpu_seconds() - start_cpu
        pipeline = trainer.pipeline
        assert pipeline is not None and trainer.learner is not None
        try:
            warm_until = time.perf_counter() + max(1.0, window_s / 2)
            while time.perf_counter() < warm_until:
                await pipeline.step()
            learner0 = await self.runtime.get_async(trainer.learner.stats.remote(), 30)
            batches0 = pipeline.num_steps_sampled // FRAGMENT
            cpu0, io0, t0 = cpu_seconds(), self.wire_bytes(), time.perf_counter()
            while time.perf_counter() - t0 < window_s:
                await pipeline.step()
            elapsed = time.perf_counter() - t0
            cpu, io = cpu_seconds() - cpu0, self.wire_bytes() - io0
            batches = pipeline.num_steps_sampled // FRAGMENT - batches0
            learner1 = await self.runtime.get_async(trainer.learner.stats.remote(), 30)
            workers = self.actor_records(owner, "worker-")
            pss = [pss_mb(r.pid) for r in workers]
            versions = learner1["weight_gets"] - learner0["weight_gets"]
            encodings = learner1["weight_encodings"] - learner0["weight_encodings"]
            row: dict[str, Any] = {
                "workers": n,
                "batches_per_s": round(batches / elapsed, 1),
                "coordinator_cpu_ms_per_batch": round(1000 * cpu / max(batches, 1), 3),
                "coordinator_cpu_share": round(cpu / elapsed, 3),
                "coordinator_bytes_per_batch": round(io / max(batches, 1)),
                "weight_serialisations_per_version": (round(encodings / versions, 2)
                                                      if versions else None),
                "weight_versions": versions,
                "start_s": round(start_s, 2),
                "start_coordinator_cpu_s": round(start_cpu, 2),
                "pss_mb_per_worker": round(sum(pss) / max(len(pss), 1), 2),
                "batches": batches, "window_s": round(elapsed, 2),
            }
            if node_loss:
                row.update(await self.node_loss(trainer, owner, n))
            return row
        finally:
            await trainer.stop()

    async def node_loss(self, trainer: Trainer, owner: str, n: int) -> dict[str, Any]:
        """SIGKILL the agent of the worker node carrying the most of this case's workers;
        time the coordinator's notice and the pipeline carrying on; start a new node."""
        pipeline = trainer.pipeline
        assert pipeline is not None
        by_node: dict[str, int] = {}
        names = {node.node_id: node.name for node in self.coordinator.nodes.values()}
        for record in self.actor_records(owner, "worker-"):
            node_name = names.get(record.node_id, "")
            by_node[node_name] = by_node.get(node_name, 0) + 1
        victim = max(self.worker_nodes, key=lambda name: by_node.get(name, 0))
        lost_before = len(self.lost)
        killed = time.perf_counter()
        self.nodes.kill(victim)
        deadline = killed + 60
        while len(self.lost) == lost_before and time.perf_counter() < deadline:
            await pipeline.step(0.05)
        if len(self.lost) == lost_before:
            raise RuntimeError(f"node {victim} was not noticed lost within 60 s")
        detected = self.lost[-1][0] - killed
        target = pipeline.num_steps_sampled // FRAGMENT + n
        while pipeline.num_steps_sampled // FRAGMENT < target and \
                time.perf_counter() < deadline:
            await pipeline.step()
        recovered = time.perf_counter() - killed
        out = {"node_loss_workers": by_node.get(victim, 0),
               "node_loss_detect_s": round(detected, 3),
               "node_loss_recover_s": round(recovered, 2),
               "node_loss_recovered": pipeline.num_steps_sampled // FRAGMENT >= target,
               "workers_after": len(pipeline.workers)}
        self.worker_nodes.remove(victim)
        replacement = f"{victim}-r{self.nodes.count}"
        self.nodes.start(replacement, NODE_CPUS)
        self.worker_nodes.append(replacement)
        await self.wait_nodes(1 + WORKER_NODES)
        return out


def plot(result: dict[str, Any], path: str) -> None:
    """Batches/s, coordinator CPU per batch and start time against N, one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [("batches_per_s", "batches routed / s"),
              ("coordinator_cpu_ms_per_batch", "coordinator CPU ms / batch"),
              ("start_s", "start of N workers (s)"),
              ("node_loss_detect_s", "lost node noticed (s)")]
    colors = {series: f"C{i}" for i, series in enumerate(SERIES)}  # the same in each panel
    for ax, (key, label) in zip(axes, panels, strict=True):
        for series, rows in result["series"].items():
            points = [(r["workers"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=series,
                        color=colors[series])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("simulated workers N")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"actorrl at scale, simulated workers ({result['cpus']} cores, "
                 f"{'quick' if result['quick'] else 'full'} run)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run(args: argparse.Namespace, root: str) -> dict[str, Any]:
    """Every series at every N."""
    if args.quick:
        plan = {"impala-pong": [8, 32, 64], "impala-cartpole": [64], "apex-pong": [32]}
        window = 2.0
    else:
        plan = {"impala-pong": [8, 32, 128, 256], "impala-cartpole": [8, 256],
                "apex-pong": [32, 256]}
        window = 6.0
    if args.series:
        plan = {s: ns for s, ns in plan.items() if s in args.series}
    if args.workers:
        plan = {s: [n for n in ns if n in args.workers] for s, ns in plan.items()}
    bench = Bench(root)
    started = time.perf_counter()
    await bench.start()
    out: dict[str, Any] = {"quick": args.quick, "machine": platform.machine(),
                           "cpus": os.cpu_count(),
                           "nodes_start_s": round(time.perf_counter() - started, 2),
                           "series": {}}
    try:
        for series, counts in plan.items():
            rows = []
            for n in counts:
                # Node loss: every N of the Pong series (the largest only with --quick).
                node_loss = series != "impala-cartpole" and (not args.quick
                                                             or n == max(counts))
                row = await bench.case(series, n, window, node_loss=node_loss)
                print(series, json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
            out["series"][series] = rows
    finally:
        await bench.close()
    out["rows"] = out["series"].get("impala-pong", [])
    out["total_s"] = round(time.perf_counter() - started, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N up to 64, short windows")
    parser.add_argument("--workers", type=int, nargs="*", help="only these N")
    parser.add_argument("--series", nargs="*", choices=sorted(SERIES), help="only these")
    parser.add_argument("--plot", default=None, help="PNG to write (default: none)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="arl-scale-")
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        result = loop.run_until_complete(run(args, root))
    except BaseException:
        print(f"scale: failed; the node agents' and actors' logs are kept in {root}",
              file=sys.stderr)
        raise
    else:
        shutil.rmtree(root, ignore_errors=True)
    finally:
        loop.close()
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
