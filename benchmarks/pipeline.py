"""Pipeline efficiency: env steps/s sampled through a whole pipeline vs. the same workers
sampling with nothing around them, measured in one run.

    python benchmarks/pipeline.py --algo apex|a3c|impala [--quick]

Prints one JSON object:
- ``ceiling_env_steps_per_s``: 2 rollout worker processes with the algorithm's config, each
  running ``sample()`` in a loop inside its own process (no coordinator, learner or replay);
  measured before and after the pipeline run, averaged.
- ``env_steps_per_s`` / ``trained_per_s``: steps sampled / trained per second by the full
  pipeline (coordinator + 2 workers + learner [+ replay shard]) after a warm-up iteration.
- ``pipeline_efficiency`` = env_steps_per_s / ceiling_env_steps_per_s (goal >= 0.7).
- ``worker_cores_pipeline`` / ``worker_cores_ceiling``: CPU cores the two workers got in each
  phase (from /proc), and ``per_core_efficiency``: env steps per worker CPU-second in the
  pipeline over the same in the ceiling, i.e. what the runtime costs the workers
  themselves, apart from the cores the learner, shard and coordinator take (target >= 0.85).
- ``cores_by_role``: CPU cores each kind of process used during the measured pipeline
  iterations (workers, learner, replay shards, the coordinator = this driver process, where
  the pipeline's event loop runs, on the loop ``actorrl train`` uses: uvloop where
  installed), and ``coordinator_cpu_share``: the coordinator's share of
  all the CPU the run used.

Ape-X runs with ``training_intensity=None`` (RLlib's original free-running sampling) so the
figure measures the pipeline's cost, not a deliberate throttle. On a 2-core machine the
learner, replay shard and coordinator compete with the two workers for the same cores, so
the efficiency is bounded by how much CPU learning takes, not only by messaging overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, ROOT)

from actorrl.algorithms import Trainer, get_algorithm  # noqa: E402
from actorrl.algorithms.trainer import WORKER_CLASS  # noqa: E402
from actorrl.config.algorithm import load_config  # noqa: E402
from actorrl.runtime import Driver  # noqa: E402

OVERRIDES = {"apex": {"training_intensity": None}, "a3c": {}, "impala": {}}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def actor_pids_by_role(driver: Driver) -> dict[str, list[int]]:
    """Pids of the driver's actors grouped by their name's role (``worker-3`` -> worker)."""
    roles: dict[str, list[int]] = {}
    for r in driver.node.actors.values():
        role = r.spec.name.split("-", 1)[0] if r.spec.name else "other"
        roles.setdefault(role, []).append(r.process.pid)
    return roles


def worker_pids(driver: Driver, prefix: str) -> list[int]:
    """Pids of the actors whose name starts with ``prefix``."""
    return [r.process.pid for r in driver.node.actors.values()
            if r.spec.name.startswith(prefix)]


async def ceiling(driver: Driver, spec, config, seconds: float) -> tuple[float, float]:
    """Env steps/s of 2 workers sampling in their own processes with nothing around them,
    and the CPU cores those workers used meanwhile."""
    worker_config = config.to_dict()
    workers = [await driver.create_actor(
        WORKER_CLASS, args=(config.env, spec.policy, worker_config),
        kwargs={"worker_index": i, "num_workers": 2}, name=f"probe-{i}") for i in (1, 2)]
    await driver.get([w.sample_for.remote(0.5) for w in workers], timeout_s=120)  # warm up
    pids = worker_pids(driver, "probe-")
    cpu_before = sum(cpu_seconds(p) for p in pids)
    start = time.perf_counter()
    steps = await driver.get([w.sample_for.remote(seconds) for w in workers], timeout_s=300)
    elapsed = time.perf_counter() - start
    cores = (sum(cpu_seconds(p) for p in pids) - cpu_before) / elapsed
    for worker in workers:
        await driver.kill_actor(worker)
    return sum(steps) / seconds, cores


async def pipeline(driver: Driver, spec, config, iterations: int) -> dict[str, float]:
    """Env steps and trained steps per second of the full pipeline after one warm-up
    iteration."""
    trainer = await Trainer.create(spec, config, driver)
    try:
        await trainer.train()
        first_sampled = trainer.pipeline.num_steps_sampled
        first_trained = trainer.pipeline.num_steps_trained
        pids = worker_pids(driver, "worker-")
        roles = {**actor_pids_by_role(driver), "coordinator": [os.getpid()]}
        cpu_before = sum(cpu_seconds(p) for p in pids)
        role_before = {role: sum(cpu_seconds(p) for p in ps) for role, ps in roles.items()}
        start = time.perf_counter()
        for _ in range(iterations):
            result = await trainer.train()
        elapsed = time.perf_counter() - start
        role_cores = {role: (sum(cpu_seconds(p) for p in ps) - role_before[role]) / elapsed
                      for role, ps in roles.items()}
        return {
            "cores_by_role": role_cores,
            "env_steps_per_s": (trainer.pipeline.num_steps_sampled - first_sampled) / elapsed,
            "trained_per_s": (trainer.pipeline.num_steps_trained - first_trained) / elapsed,
            "worker_cores": (sum(cpu_seconds(p) for p in pids) - cpu_before) / elapsed,
            "episode_reward_mean": result["episode_reward_mean"],
        }
    finally:
        await trainer.stop()


async def run(algo: str, quick: bool) -> dict:
    """Measure ceiling, pipeline, ceiling again."""
    spec = get_algorithm(algo)
    iter_s = 2.0 if quick else 5.0
    config = load_config(spec.config_cls, {"num_workers": 2, "seed": 0,
                                           "min_iter_time_s": iter_s, **OVERRIDES[algo]})
    probe_s = 3.0 if quick else 8.0
    iterations = 4 if quick else 6
    started = time.perf_counter()
    async with Driver.start() as driver:
        before, before_cores = await ceiling(driver, spec, config, probe_s)
        measured = await pipeline(driver, spec, config, iterations)
        after, after_cores = await ceiling(driver, spec, config, probe_s)
    ceiling_steps = (before + after) / 2
    ceiling_cores = (before_cores + after_cores) / 2
    efficiency = measured["env_steps_per_s"] / ceiling_steps
    per_core = (measured["env_steps_per_s"] / measured["worker_cores"]) / (
        ceiling_steps / ceiling_cores)
    return {
        "benchmark": "pipeline",
        "algo": algo,
        "quick": quick,
        "num_workers": 2,
        "overrides": OVERRIDES[algo],
        "env_steps_per_s": round(measured["env_steps_per_s"], 1),
        "trained_per_s": round(measured["trained_per_s"], 1),
        "ceiling_env_steps_per_s": round(ceiling_steps, 1),
        "ceiling_before_after": [round(before, 1), round(after, 1)],
        "pipeline_efficiency": round(efficiency, 3),
        "worker_cores_pipeline": round(measured["worker_cores"], 2),
        "worker_cores_ceiling": round(ceiling_cores, 2),
        "per_core_efficiency": round(per_core, 3),
        "cores_by_role": {k: round(v, 2) for k, v in measured["cores_by_role"].items()},
        "coordinator_cpu_share": round(
            measured["cores_by_role"]["coordinator"] / sum(measured["cores_by_role"].values()),
            3),
        "target_pipeline_efficiency": 0.7,
        "targets_met": {"pipeline_efficiency_ge_0_7": efficiency >= 0.7,
                        "per_core_efficiency_ge_0_85": per_core >= 0.85},
        "episode_reward_mean_at_end": measured["episode_reward_mean"],
        "cpu_count": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    """Parse arguments, run, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=sorted(OVERRIDES), default="apex")
    parser.add_argument("--quick", action="store_true", help="short run (< 50 s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    from transport.sockets import new_event_loop

    # The coordinator's loop is the one `actorrl train` runs (uvloop where installed).
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        print(json.dumps(runner.run(run(args.algo, args.quick))))


if __name__ == "__main__":
    main()
