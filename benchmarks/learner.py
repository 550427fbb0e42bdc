"""Learner throughput: IMPALA's learner thread with 1, 2 and 4 towers at one train_batch_size.

Prints one JSON object. ``samples_per_s[n]`` is rows learned per second by a
MultiTowerLearnerThread with ``n`` fake (CPU) towers, its in-queue kept full with the same
800-row CartPole batch; ``plain_samples_per_s`` is the single-device LearnerThread on the
same batch. The tower counts are measured in interleaved rounds (median per count) so
background load hits them alike. ``tower_overhead`` = 1-tower / 2-tower samples/s: on a CPU
towers cannot help, so this shows what splitting costs (target <= 1.15).

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
from actorrl.batch import SampleBatch  # noqa: E402
from actorrl.learner.config import LearnerConfig  # noqa: E402
from actorrl.learner.thread import LearnerThread, make_learner_thread  # noqa: E402
from actorrl.rollout import RolloutWorker  # noqa: E402

POLICY = "actorrl.policy.impala:ImpalaPolicy"
TRAIN_BATCH = 800
FRAGMENT = 50


def make_batch(config: dict) -> SampleBatch:
    """One 800-row batch of 16 envs x 50 steps from a real rollout worker."""
    worker = RolloutWorker("CartPole-v1", POLICY, config)
    batch = worker.sample()
    return batch.slice(0, TRAIN_BATCH)


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
    worker = RolloutWorker("CartPole-v1", POLICY, config)
    learner_config = LearnerConfig(
        train_batch_size=TRAIN_BATCH, num_gpus=float(towers), _fake_gpus=not cuda,
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


def main() -> None:
    """Run the benchmark and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (< 40 s)")
    parser.add_argument("--cuda", action="store_true", help="real CUDA towers")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.cuda and not torch.cuda.is_available():
        sys.exit("--cuda given but no CUDA device is visible")
    config = {**ImpalaConfig(num_envs_per_worker=16, rollout_fragment_length=FRAGMENT,
                             train_batch_size=TRAIN_BATCH).to_dict(), "seed": 0}
    batch = make_batch(config)
    tower_counts = [1, 2] if args.cuda and torch.cuda.device_count() < 4 else [1, 2, 4]
    if args.cuda:
        tower_counts = [n for n in tower_counts if n <= torch.cuda.device_count()]
    rounds, slice_s = (3, 1.5) if args.quick else (5, 4.0)
    results: dict[str, list[float]] = {str(n): [] for n in tower_counts}
    results["plain"] = []
    started = time.perf_counter()
    for _ in range(rounds):
        for key in results:
            thread = build(config, 0 if key == "plain" else int(key), args.cuda)
            results[key].append(measure(thread, batch, slice_s))
            thread.stop()
    median = {k: statistics.median(v) for k, v in results.items()}
    overhead = median["1"] / median["2"] if "2" in median else None
    print(json.dumps({
        "benchmark": "learner",
        "quick": args.quick,
        "device": torch.cuda.get_device_name(0) if args.cuda else "cpu (fake towers)",
        "policy": "IMPALA (V-trace), CartPole MLP [64, 64]",
        "train_batch_size": TRAIN_BATCH,
        "samples_per_s": {k: round(v, 1) for k, v in median.items() if k != "plain"},
        "plain_samples_per_s": round(median["plain"], 1),
        "tower_overhead": round(overhead, 3) if overhead else None,
        "target_tower_overhead": 1.15,
        "targets_met": {"tower_overhead_le_1_15": bool(overhead and overhead <= 1.15)},
        "rounds": rounds,
        "slice_s": slice_s,
        "cpu_count": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "elapsed_s": round(time.perf_counter() - started, 1),
    }))


if __name__ == "__main__":
    main()
