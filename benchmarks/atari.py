"""Atari throughput: IMPALA, APPO or Ape-X on Pong (DeepMind preprocessing), 2 workers,
against the compute ceiling measured in the same run.

    python benchmarks/atari.py [--quick] [--algo impala|appo|apex[,...]] [--env ID]
                               [--config FILE] [--set KEY=VALUE ...]

Settings come from ``examples/pong-<algo>.yaml`` (read through the code path of
``actorrl train --config``), then ``--env`` and ``--set``; ``num_workers`` is 2. Several
algorithms (``--algo impala,appo``) are measured one after the other in the same run, each
from its own example file (``--config`` then applies to none), and the JSON holds one
object per algorithm under ``runs`` with ``env_steps_per_s`` and ``compute_efficiency``
ratios of each to the first. With
``--quick`` (under ~2 minutes) Ape-X's replay shard holds at most 20k rows and learns from
2k steps so training starts within the run.

Phases, one after the other in this process:

1. **Ceiling**, in-process with one torch thread, nothing else running in this process:
   - ``sampler_steps_per_core_s``: a :class:`~actorrl.rollout.RolloutWorker` (worker 1 of 2,
     the algorithm's policy and env settings) calling ``sample()`` in a loop: env steps per
     CPU-second of this process;
   - ``learner_rows_per_core_s``: the learner-side worker (index 0) calling
     ``learn_on_batch`` on one train batch built from those samples (IMPALA: fragments
     concatenated to ``train_batch_size``; Ape-X: ``train_batch_size`` rows drawn from a
     prioritized replay buffer, importance weights included): rows per CPU-second.
2. **Pipeline**: a local cluster (coordinator here, 2 worker processes, a learner process and
   Ape-X's replay shards) trains; after a warm-up (until rows are trained), ``timed``
   iterations give ``env_steps_per_s`` and ``trained_steps_per_s`` from the pipeline's
   counters. ``peak_pss_mb`` is the largest summed PSS of this process and all its
   descendants during this phase (sampled every 0.5 s); ``cores_by_role`` is the CPU each
   kind of process used per second of the timed window.

Derived figures:

- ``compute_efficiency`` = ``env_steps_per_s / ideal_env_steps_per_s`` with
  ``ideal_env_steps_per_s = cores / (1 / sampler_steps_per_core_s + r / learner_rows_per_core_s)``
  where ``r = trained_steps_per_s / env_steps_per_s`` (rows trained per env step, as
  measured) and ``cores`` the CPUs this process may run on. Equivalently: the fraction of
  the machine's cores spent sampling and training at the ceiling's speed; the rest goes to
  the runtime, replay, weight syncs, the coordinator, idle time and contention.
- ``useful_cores`` = ``env_steps_per_s / sampler + trained_steps_per_s / learner`` (cores'
  worth of ceiling-speed work done per second), ``cores_obtained`` = the CPU all processes
  of the run used per second (``cores_by_role`` summed) and
  ``efficiency_of_cores_obtained`` = their ratio: how well the CPU the run did get was
  spent, apart from CPU other programs on a shared machine took (or cores left idle).
- ``wire_bytes_per_env_step``: bytes of batch data moved between processes per env step,
  from the encoded sizes of the measured batches (frame stacks travel each frame once):
  each sample batch row once (worker ->
  learner for IMPALA, worker -> replay shard for Ape-X; the coordinator passes references),
  plus for Ape-X each replayed row once (shard -> learner), counted at ``r`` replayed rows per
  env step (a lower bound: replays the learner drops are not counted). Weight broadcasts
  are not included.

The machine may be shared: compare figures of one run (the ratios) rather than runs taken
under different load; ``loadavg_1m`` before and after is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from actorrl.algorithms import AlgorithmSpec, Trainer, get_algorithm  # noqa: E402
from actorrl.config.algorithm import AlgorithmConfig  # noqa: E402
from actorrl.config.files import parse_override  # noqa: E402
from actorrl.data.batch import SampleBatch  # noqa: E402
from actorrl.experiment.train import (  # noqa: E402
    ConfigFile,
    read_config_file_sections,
    resolve_config,
)
from actorrl.replay import FrameStackStorage, PrioritizedSampler, ReplayBuffer  # noqa: E402
from actorrl.rollout import RolloutWorker  # noqa: E402
from actorrl.runtime import Driver  # noqa: E402
from benchmarks.end_to_end import MemorySampler, finite  # noqa: E402
from benchmarks.pipeline import cpu_seconds  # noqa: E402
from transport.codec import decode, encode  # noqa: E402

NUM_WORKERS = 2
QUICK_APEX = {"buffer_size": 20_000, "learning_starts": 2_000}
"""Ape-X settings ``--quick`` caps so that training starts within the run."""


ALGOS = ("impala", "appo", "apex")
"""Algorithms this benchmark measures (the asynchronous pipelines with a learner thread)."""


def load_settings(algo: str, config_file: str | None, env: str | None,
                  overrides: list[str], quick: bool) -> tuple[AlgorithmSpec, AlgorithmConfig]:
    """The benchmark's config: the example file, then ``--env``/``--set``, 2 workers."""
    path = config_file or os.path.join(ROOT, "examples", f"pong-{algo}.yaml")
    file: ConfigFile = read_config_file_sections(path)
    spec = get_algorithm(algo)
    extra: list[str] = []
    if quick and spec.name == "apex":
        extra = [f"{k}={v}" for k, v in QUICK_APEX.items()]
    config = resolve_config(spec, config_file=file, overrides=[*extra, *overrides],
                            explicit={"env": env, "num_workers": NUM_WORKERS, "seed": 0})
    if quick and spec.name == "apex":  # an explicit --set still wins over the quick cap
        given = {parse_override(text)[0] for text in overrides}
        assert all(getattr(config, k) == v for k, v in QUICK_APEX.items() if k not in given)
    return spec, config


def wire_nbytes(batch: SampleBatch) -> int:
    """Bytes a batch takes on the wire: its encoded frames (frame stacks each frame
    once, see actorrl/data/frames.py)."""
    return sum(memoryview(frame).nbytes for frame in encode(batch))


def measure_ceiling(spec: AlgorithmSpec, config: AlgorithmConfig, probe_s: float
                    ) -> dict[str, float]:
    """Sampler and learner alone in this process on one torch thread (see the module
    docstring); also the bytes per row of a sample batch and of a replayed batch."""
    torch.set_num_threads(1)
    settings = config.to_dict()
    sampler = RolloutWorker(config.env, spec.policy, settings, worker_index=1,
                            num_workers=NUM_WORKERS, seed=0)
    learner = RolloutWorker(config.env, spec.policy, settings, worker_index=0,
                            num_workers=NUM_WORKERS, seed=0)
    try:
        batches = [sampler.sample()]  # warm-up
        steps, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - wall0 < probe_s:
            batch = sampler.sample()
            steps += batch.count
            if sum(b.count for b in batches) < max(config.train_batch_size, 2_000):
                batches.append(batch)
        sampler_per_core = steps / (time.process_time() - cpu0)
        samples = SampleBatch.concat_samples(batches)
        sample_row_bytes = sum(wire_nbytes(b) for b in batches) / samples.count
        if spec.name == "apex":  # the shard's buffer, fed fragments as they arrive
            buffer = ReplayBuffer(samples.count, sampler=PrioritizedSampler(0.6, 0.4),
                                  storage=FrameStackStorage(unpack=False), seed=0)
            for fragment in batches:
                buffer.add_batch(decode(encode(fragment)))
            train_batch = decode(encode(buffer.sample(config.train_batch_size)))
            replay_row_bytes = wire_nbytes(
                buffer.sample(config.train_batch_size)) / train_batch.count
        else:
            while samples.count < config.train_batch_size:
                samples = SampleBatch.concat_samples([samples, sampler.sample()])
            train_batch = samples.slice(0, config.train_batch_size)
            replay_row_bytes = wire_nbytes(train_batch) / train_batch.count
        learner.learn_on_batch(train_batch)  # warm-up
        rows, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - wall0 < probe_s:
            learner.learn_on_batch(train_batch)
            rows += train_batch.count
        learner_per_core = rows / (time.process_time() - cpu0)
    finally:
        sampler.stop()
        learner.stop()
    return {"sampler_steps_per_core_s": sampler_per_core,
            "learner_rows_per_core_s": learner_per_core,
            "sample_row_bytes": sample_row_bytes, "replay_row_bytes": replay_row_bytes}


def _role(name: str) -> str:
    return name.rstrip("0123456789").rstrip("-_") or name


def _actor_pids(driver: Driver) -> dict[int, str]:
    return {r.process.pid: _role(r.spec.name) for r in driver.node.actors.values()
            if getattr(r, "process", None) is not None}


async def measure_pipeline(spec: AlgorithmSpec, config: AlgorithmConfig, warmup_cap_s: float,
                           timed_iterations: int) -> dict[str, Any]:
    """The full pipeline's throughput after a warm-up, with CPU by role and peak PSS."""
    memory = MemorySampler(os.getpid(), 0.5)
    memory.start()
    try:
        async with Driver.start() as driver:
            trainer = await Trainer.create(spec, config, driver)
            try:
                started = time.perf_counter()
                await trainer.train()
                pipeline = trainer.pipeline
                assert pipeline is not None
                while (pipeline.num_steps_trained == 0
                       and time.perf_counter() - started < warmup_cap_s):
                    await trainer.train()
                warmup_s = time.perf_counter() - started
                pids = _actor_pids(driver)
                pids[os.getpid()] = "coordinator"
                cpu0 = {pid: cpu_seconds(pid) for pid in pids}
                sampled0, trained0 = pipeline.num_steps_sampled, pipeline.num_steps_trained
                wall0 = time.perf_counter()
                result: dict[str, Any] = {}
                for _ in range(timed_iterations):
                    result = await trainer.train()
                elapsed = time.perf_counter() - wall0
                sampled = pipeline.num_steps_sampled - sampled0
                trained = pipeline.num_steps_trained - trained0
                cores: dict[str, float] = {}
                for pid, role in pids.items():
                    try:
                        used = cpu_seconds(pid) - cpu0[pid]
                    except OSError:
                        continue
                    cores[role] = cores.get(role, 0.0) + used / elapsed
            finally:
                await trainer.stop()
    finally:
        memory.stop()
    return {"env_steps_per_s": sampled / elapsed, "trained_steps_per_s": trained / elapsed,
            "timed_s": elapsed, "warmup_s": warmup_s,
            "cores_by_role": {k: round(v, 2) for k, v in sorted(cores.items())},
            "peak_pss_mb": memory.peak_pss_kb / 1024,
            "peak_processes": memory.peak_processes,
            "episode_reward_mean": finite(result.get("episode_reward_mean"))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One algorithm (the JSON object of :func:`run_one`) or several, one after the other
    (``runs`` plus ratios to the first)."""
    algos = [a.strip() for a in args.algo.split(",") if a.strip()]
    unknown = [a for a in algos if a not in ALGOS]
    if not algos or unknown:
        raise SystemExit(f"--algo takes one or more of {', '.join(ALGOS)} (comma-separated), "
                         f"got {args.algo!r}")
    if len(algos) == 1:
        return run_one(algos[0], args.config, args)
    if args.config:
        raise SystemExit("--config names one algorithm's file: with several --algo values "
                         "each reads examples/pong-ALGO.yaml (drop --config)")
    runs = {algo: run_one(algo, None, args) for algo in algos}
    first = runs[algos[0]]
    return {
        "benchmark": "atari",
        "algos": algos,
        "runs": runs,
        "env_steps_per_s_vs_first": {
            a: round(r["env_steps_per_s"] / first["env_steps_per_s"], 3)
            for a, r in runs.items() if first["env_steps_per_s"]},
        "compute_efficiency_vs_first": {
            a: round(r["compute_efficiency"] / first["compute_efficiency"], 3)
            for a, r in runs.items()
            if first["compute_efficiency"] and r["compute_efficiency"]},
    }


def run_one(algo: str, config_file: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """Ceiling, then pipeline, for one algorithm; its JSON object."""
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    spec, config = load_settings(algo, config_file, args.env, args.overrides, args.quick)
    probe_s = 6.0 if args.quick else 20.0
    ceiling = measure_ceiling(spec, config, probe_s)
    gc.collect()
    iter_s = 5.0 if args.quick else 15.0
    timed = 5 if args.quick else 8
    config = config.replace(min_iter_time_s=iter_s)
    measured = asyncio.run(measure_pipeline(spec, config, 60.0 if args.quick else 300.0,
                                            timed))
    cores = len(os.sched_getaffinity(0))
    sampler, learner = ceiling["sampler_steps_per_core_s"], ceiling["learner_rows_per_core_s"]
    env_rate, train_rate = measured["env_steps_per_s"], measured["trained_steps_per_s"]
    intensity = train_rate / env_rate if env_rate else 0.0
    ideal = cores / (1.0 / sampler + intensity / learner)
    useful = env_rate / sampler + train_rate / learner
    obtained = sum(measured["cores_by_role"].values())
    wire = ceiling["sample_row_bytes"] + (
        intensity * ceiling["replay_row_bytes"] if spec.name == "apex" else 0.0)
    settings = {k: getattr(config, k) for k in (
        "env", "num_workers", "num_envs_per_worker", "rollout_fragment_length",
        "train_batch_size", "lr")}
    settings["frame_size"] = (config.env_config or {}).get("frame_size", 84)
    if spec.name == "appo":
        settings.update({k: getattr(config, k) for k in ("num_sgd_iter",
                                                          "minibatch_buffer_size")})
    if spec.name == "apex":
        settings.update({k: getattr(config, k) for k in (
            "training_intensity", "buffer_size", "learning_starts",
            "num_replay_buffer_shards", "target_network_update_freq")})
    return {
        "benchmark": "atari",
        "algo": spec.name,
        "quick": args.quick,
        "settings": settings,
        "env_steps_per_s": round(env_rate, 1),
        "trained_steps_per_s": round(train_rate, 1),
        "sampler_steps_per_core_s": round(sampler, 1),
        "learner_rows_per_core_s": round(learner, 1),
        "trained_rows_per_env_step": round(intensity, 3),
        "ideal_env_steps_per_s": round(ideal, 1),
        "compute_efficiency": round(env_rate / ideal, 3) if ideal else None,
        "useful_cores": round(useful, 2),
        "cores_obtained": round(obtained, 2),
        "efficiency_of_cores_obtained": round(useful / obtained, 3) if obtained else None,
        "wire_bytes_per_env_step": round(wire),
        "sample_row_bytes": round(ceiling["sample_row_bytes"]),
        "replay_row_bytes": round(ceiling["replay_row_bytes"]),
        "peak_pss_mb": round(measured["peak_pss_mb"], 1),
        "peak_processes": measured["peak_processes"],
        "cores_by_role": measured["cores_by_role"],
        "cores": cores,
        "warmup_s": round(measured["warmup_s"], 1),
        "timed_s": round(measured["timed_s"], 1),
        "episode_reward_mean_at_end": measured["episode_reward_mean"],
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    """Parse the arguments, run, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="under ~2 minutes")
    parser.add_argument("--algo", default="impala",
                        help=f"one or more of {', '.join(ALGOS)}, comma-separated")
    parser.add_argument("--env", help="ALE id (default: the example file's, "
                                      "PongNoFrameskip-v4)")
    parser.add_argument("--config", help="settings file (default: examples/pong-ALGO.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config key (repeatable)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
