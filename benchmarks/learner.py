"""Learner throughput: IMPALA's learner thread with 1, 2 and 4 towers at one train_batch_size.

Prints one JSON object. ``samples_per_s[n]`` is rows learned per second by a
MultiTowerLearnerThread with ``n`` fake (CPU) towers, its in-queue kept full with the same
CartPole batch; ``plain_samples_per_s`` is the single-device LearnerThread on that batch.
Tower counts are measured in interleaved rounds (median per count) so background load hits
them alike. ``tower_overhead`` = 1-tower / 2-tower samples/s: on a CPU towers cannot help,
so this shows what splitting costs (target <= 1.15).

Two workloads: a 256x256 MLP on 3200-row batches (the headline figures: a model big enough
that its arithmetic, not Python's per-op dispatch, sets the cost) and CartPole's own 64x64
MLP on 800 rows (``tower_overhead_small_model``), where each tower's ~3 ms of fixed V-trace
loss dispatch is most of the step, so splitting costs more.

With ``--cuda`` (a machine with a GPU), towers are real CUDA devices instead.

    python benchmarks/learner.py [--quick] [--cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from actorrl.algorithms.impala import ImpalaConfig  # noqa: E402
from actorrl.config.algorithm import load_config  # noqa: E402
from actorrl.data.batch import SampleBatch  # noqa: E402
from actorrl.learner.config import LearnerConfig  # noqa: E402
from actorrl.learner.thread import LearnerThread, make_learner_thread  # noqa: E402
from actorrl.rollout import RolloutWorker  # noqa: E402

POLICY = "actorrl.policy.impala:ImpalaPolicy"
FRAGMENT = 50
WORKLOADS = {
    # name: (env, model config, train_batch_size)
    "cartpole_64x64_800": ("CartPole-v1", {"fcnet_hiddens": [64, 64]}, 800),
    "mlp_256x256_3200": ("CartPole-v1", {"fcnet_hiddens": [256, 256]}, 3200),
}
# With --pong: examples/pong-impala.yaml's conv stack on real 84x84x4 Pong batches of 500.
PONG_WORKLOAD = ("PongNoFrameskip-v4",
                 {"conv_filters": "rllib", "vf_share_layers": True}, 500)


def workload_config(env: str, model: dict, train_batch: int) -> dict:
    """IMPALA config for one workload (one sample() gives exactly one train batch)."""
    return {**load_config(ImpalaConfig, {
        "env": env, "env_config": {} if env == "CartPole-v1" else {"frame_stack": 4},
        "num_envs_per_worker": train_batch // FRAGMENT,
        "rollout_fragment_length": FRAGMENT, "train_batch_size": train_batch,
        "model": model}).to_dict(), "seed": 0}


def make_batch(config: dict) -> SampleBatch:
    """One train batch of ``num_envs`` x 50 steps from a real rollout worker."""
    return RolloutWorker(config["env"], POLICY, config).sample()


class Feeder(threading.Thread):
    """Keeps a learner's in-queue full with the same batch until stopped."""

    def __init__(self, learner: LearnerThread, batch: SampleBatch) -> None:
        super().__init__(daemon=True)
        self.learner, self.batch, self.stopped = learner, batch, False

    def run(self) -> None:
        while not self.stopped:
            try:
                self.learner.inqueue.put((None, self.batch), timeout=0.1)
            except Exception:  # queue.Full: try again unless stopped
                continue


def build(config: dict, towers: int, cuda: bool) -> LearnerThread:
    """A started learner thread with ``towers`` towers (0: the plain single-device one)."""
    worker = RolloutWorker(config["env"], POLICY, config)
    learner_config = LearnerConfig(
        train_batch_size=config["train_batch_size"], num_gpus=float(towers), _fake_gpus=not cuda,
        learner_queue_size=4, learner_queue_timeout=60, tower_rows_multiple=FRAGMENT,
        num_multi_gpu_tower_stacks=2 if towers else 1)
    thread = make_learner_thread(worker, learner_config)
    thread.start()
    return thread


def measure(thread: LearnerThread, batch: SampleBatch, seconds: float) -> float:
    """Rows learned per second over ``seconds`` (after one warm-up step)."""
    feeder = Feeder(thread, batch)
    feeder.start()
    thread.outqueue.get(timeout=60)
    while not thread.outqueue.empty():
        thread.outqueue.get_nowait()
    start, rows = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        rows += thread.outqueue.get(timeout=60).env_steps
    elapsed = time.perf_counter() - start
    feeder.stopped = True
    feeder.join()
    return rows / elapsed


def run_workload(config: dict, tower_counts: list[int], rounds: int, slice_s: float,
                 cuda: bool) -> dict:
    """Interleaved rounds over the tower counts; medians and the last timing breakdown."""
    batch = make_batch(config)
    results: dict[str, list[float]] = {str(n): [] for n in tower_counts}
    results["plain"] = []
    timings: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for key in results:
            thread = build(config, 0 if key == "plain" else int(key), cuda)
            results[key].append(measure(thread, batch, slice_s))
            thread.stop()
            thread.join(timeout=60)
            timings[key] = thread.timing_breakdown()
    median = {k: statistics.median(v) for k, v in results.items()}
    overhead = median["1"] / median["2"] if "2" in median else None
    return {
        "train_batch_size": config["train_batch_size"],
        "env": config["env"],
        "model": config["policy"]["model"],
        "samples_per_s": {k: round(v, 1) for k, v in median.items() if k != "plain"},
        "plain_samples_per_s": round(median["plain"], 1),
        "tower_overhead": round(overhead, 3) if overhead else None,
        "timing_breakdown_last_round": timings,
    }


def main() -> None:
    """Run the benchmark and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (< 40 s)")
    parser.add_argument("--cuda", action="store_true", help="real CUDA towers")
    parser.add_argument("--pong", action="store_true",
                        help="add a Pong conv workload (needs the atari extra)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.cuda and not torch.cuda.is_available():
        sys.exit("--cuda given but no CUDA device is visible")
    tower_counts = [1, 2, 4]
    if args.cuda:
        tower_counts = [n for n in tower_counts if n <= torch.cuda.device_count()]
    started = time.perf_counter()
    workloads = {}
    chosen = dict(WORKLOADS, **({"pong_conv_500": PONG_WORKLOAD} if args.pong else {}))
    for name, (env, model, train_batch) in chosen.items():
        large = train_batch > 1000 or env != "CartPole-v1"
        rounds = 2 if args.quick else 4
        slice_s = (2.0 if large else 1.0) if args.quick else (5.0 if large else 3.0)
        workloads[name] = run_workload(workload_config(env, model, train_batch), tower_counts,
                                       rounds, slice_s, args.cuda)
    main_workload = workloads["mlp_256x256_3200"]
    overhead = main_workload["tower_overhead"]
    print(json.dumps({
        "benchmark": "learner",
        "quick": args.quick,
        "device": torch.cuda.get_device_name(0) if args.cuda else "cpu (fake towers)",
        "policy": "IMPALA (V-trace) on CartPole batches",
        "samples_per_s": main_workload["samples_per_s"],
        "plain_samples_per_s": main_workload["plain_samples_per_s"],
        "tower_overhead": overhead,
        "tower_overhead_small_model": workloads["cartpole_64x64_800"]["tower_overhead"],
        "target_tower_overhead": 1.15,
        "targets_met": {"tower_overhead_le_1_15": bool(overhead and overhead <= 1.15)},
        "workloads": workloads,
        "cpu_count": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "elapsed_s": round(time.perf_counter() - started, 1),
    }))


if __name__ == "__main__":
    main()
