"""Cluster benchmarks on one machine; prints ONE JSON object measured in one run.

    python benchmarks/cluster.py [--quick]

Two clusters run side by side, each a coordinator on 127.0.0.1 and a node agent on its own
loopback address: one with CURVE keys (encrypted, authenticated tcp), one without (plain
tcp; allowed because it is loopback). Figures:

- ``node_join_s``: from spawning ``actorrl node join`` to the coordinator listing the node
  (process start, imports, runtime, registration); median over both clusters' nodes.
- ``actor_start_s``: median time of ``client.create_actor(Counter, node=...)`` on the
  CURVE cluster's remote node (placement, node RPC, process spawn, hello/ready handshake).
- ``call_rtt_us_median`` (``_curve`` / ``_plain``): sequential no-op actor calls from the
  client's event loop to an actor on the remote node over tcp,
  ``await runtime.get_async(runtime.submit(actor, "noop", (), {}))``. Rounds alternate
  between the two clusters so that load from other processes hits both alike.
  ``curve_rtt_ratio`` = curve / plain (goal <= 1.3).
- ``job_submit_to_first_result_s``: a tiny Ape-X CartPole job (2 workers, learner, replay
  shard) from ``client.submit`` to its first result streamed back (includes starting four
  actor processes that import torch).
- ``worker_recovery_s``: SIGKILL of rollout worker 1 to its replacement (started by the
  pipeline through the coordinator on a node with room) answering a ``sample()`` call;
  ``worker_replaced_s`` to the replacement being registered; ``worker_recovery_to_result_s``
  to the first result reporting the restart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import actorrl.data.batch  # noqa: E402,F401  (registers SampleBatch: sample() replies carry one)
from actorrl.cluster.client import Client  # noqa: E402
from actorrl.runtime.process.handles import ActorHandle  # noqa: E402
from transport.auth import generate_keys  # noqa: E402

CLI = [sys.executable, "-m", "actorrl.cli.cluster"]
APEX_TINY = {"algorithm": "apex", "num_workers": 2, "num_envs_per_worker": 1,
             "rollout_fragment_length": 16, "learning_starts": 64, "buffer_size": 4000,
             "train_batch_size": 32, "min_iter_time_s": 0.5}


class BenchCluster:
    """A coordinator and one node agent on ``node_host``, plus a client."""

    def __init__(self, root: str, keys: str | None, node_host: str) -> None:
        self.root = root
        self.keys = keys
        os.makedirs(root, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        read_fd, write_fd = os.pipe()
        args = ["coordinator", "start", "--bind", "tcp://127.0.0.1:0", "--state-dir",
                os.path.join(root, "state"), "--ready-fd", str(write_fd)]
        # The plain cluster is the keyless reference: tcp on loopback, allowed explicitly.
        args += ["--keys", keys] if keys else ["--insecure-loopback"]
        self.procs.append(self._spawn(args, "coordinator.log", (write_fd,)))
        os.close(write_fd)
        ready, _, _ = select.select([read_fd], [], [], 60)
        line = os.read(read_fd, 4096).decode() if ready else ""
        os.close(read_fd)
        if not line.startswith("READY "):
            raise RuntimeError(f"coordinator did not start: {line!r}")
        self.address = line.split()[1]
        self.client = Client(self.address, keys_dir=keys, insecure_loopback=not keys)
        self.session = tempfile.mkdtemp(prefix="arl-bench-")
        started = time.perf_counter()
        node_args = ["node", "join", self.address, "--host", node_host, "--name", "remote",
                     "--cpus", "4", "--gpus", "0", "--session-dir", self.session]
        node_args += ["--keys", keys] if keys else ["--insecure-loopback"]
        self.procs.append(self._spawn(node_args, "node.log"))
        if self.client.wait_for_nodes(1, 60) < 1:
            raise RuntimeError("the node did not join")
        self.node_join_s = time.perf_counter() - started

    def _spawn(self, args: list[str], log: str, fds: tuple[int, ...] = ()) -> subprocess.Popen:
        with open(os.path.join(self.root, log), "ab") as f:
            return subprocess.Popen([*CLI, *args], cwd=REPO, stdin=subprocess.DEVNULL,
                                    stdout=f, stderr=subprocess.STDOUT, pass_fds=fds)

    def close(self) -> None:
        try:
            self.client.call("coord.shutdown", [True], timeout_s=10)
        except Exception:
            pass
        self.client.close()
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.session, ignore_errors=True)


def rtt_us(cluster: BenchCluster, actor: ActorHandle, calls: int) -> list[float]:
    """Per-call round trips (us) of sequential no-op calls from the client's loop."""
    runtime = cluster.client.runtime

    async def measure() -> list[float]:
        out = []
        for _ in range(calls):
            start = time.perf_counter()
            # runtime.submit: this client's runtime (``.remote()`` uses the process's
            # current one, i.e. the client opened last).
            await runtime.get_async(runtime.submit(actor, "noop", (), {}))
            out.append((time.perf_counter() - start) * 1e6)
        return out

    return cluster.client.run(measure(), 300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    rounds, calls, starts = (3, 300, 3) if args.quick else (6, 1500, 7)
    root = tempfile.mkdtemp(prefix="actorrl-bench-cluster-")
    keys = os.path.join(root, "keys")
    generate_keys(keys)
    out: dict[str, Any] = {"quick": args.quick, "machine": platform.machine(),
                           "cpus": os.cpu_count()}
    curve = plain = None
    try:
        curve = BenchCluster(os.path.join(root, "curve"), keys, "127.0.0.2")
        plain = BenchCluster(os.path.join(root, "plain"), None, "127.0.0.3")
        out["node_join_s"] = round(statistics.median([curve.node_join_s,
                                                      plain.node_join_s]), 3)

        times = []
        for _ in range(starts):
            start = time.perf_counter()
            handle = curve.client.create_actor("tests.actors.basic:Counter", num_cpus=0,
                                               node="remote")
            times.append(time.perf_counter() - start)
            curve.client.kill_actor(handle)
        out["actor_start_s"] = round(statistics.median(times), 3)

        echo = {c: c.client.create_actor("tests.actors.basic:Counter", num_cpus=0,
                                         node="remote") for c in (curve, plain)}
        samples: dict[str, list[float]] = {"curve": [], "plain": []}
        for c in (curve, plain):  # warm-up: connections, handshakes, first-call paths
            rtt_us(c, echo[c], 50)
        for _ in range(rounds):
            samples["curve"] += rtt_us(curve, echo[curve], calls)
            samples["plain"] += rtt_us(plain, echo[plain], calls)
        curve_us = statistics.median(samples["curve"])
        plain_us = statistics.median(samples["plain"])
        out["call_rtt_us_median_curve"] = round(curve_us, 1)
        out["call_rtt_us_median_plain"] = round(plain_us, 1)
        out["call_rtt_us_median"] = {"curve": round(curve_us, 1), "plain": round(plain_us, 1)}
        out["curve_rtt_ratio"] = round(curve_us / plain_us, 3)
        for c in (curve, plain):
            c.client.kill_actor(echo[c])
        plain.close()  # the job below runs on the CURVE cluster alone
        plain = None

        client = curve.client
        start = time.perf_counter()
        job = client.submit({**APEX_TINY})
        results = job.results(timeout_s=300)
        next(results)
        out["job_submit_to_first_result_s"] = round(time.perf_counter() - start, 3)
        owner = f"job:{job.id}"
        worker = client.wait_for_actor("worker-1", owner=owner, timeout_s=10)
        assert worker is not None
        killed = time.perf_counter()
        os.kill(worker["pid"], signal.SIGKILL)
        new = client.wait_for_actor("worker-1", exclude=[worker["actor_id"]], owner=owner,
                                    timeout_s=120)
        assert new is not None, "no replacement worker"
        out["worker_replaced_s"] = round(time.perf_counter() - killed, 3)
        handle = ActorHandle(new["actor_id"], new["endpoint"])
        client.get(client.runtime.submit(handle, "sample", (), {}), timeout=120)
        out["worker_recovery_s"] = round(time.perf_counter() - killed, 3)
        for result in results:
            if result["info"]["num_worker_restarts"] >= 1:
                break
        out["worker_recovery_to_result_s"] = round(time.perf_counter() - killed, 3)
        job.stop()
    finally:
        for c in (curve, plain):
            if c is not None:
                c.close()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
