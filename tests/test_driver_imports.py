"""The driver process stays light: training through it never imports torch (only the actor
processes that run policies do), so a job's driver costs no torch memory or import time."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from actorrl.algorithms import Trainer, get_algorithm
    from actorrl.config.algorithm import load_config
    from actorrl.runtime import Driver

    async def main():
        async with Driver.start() as driver:
            for algo in ("apex", "a2c"):
                spec = get_algorithm(algo)
                config = load_config(spec.config_cls, {
                    "num_workers": 1, "min_iter_time_s": 0.2, "seed": 0})
                trainer = await Trainer.create(spec, config, driver)
                try:
                    result = await trainer.train()
                finally:
                    await trainer.stop()
                print(algo, result["timesteps_total"] > 0, "torch" in sys.modules, flush=True)

    asyncio.run(main())
""")


def test_training_never_imports_torch_in_the_driver() -> None:
    """Two algorithms (a replay pipeline and a synchronous one) train an iteration each in
    a driver process that has never imported torch, and it still has not afterwards."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert "apex True False" in lines, out.stdout
    assert "a2c True False" in lines, out.stdout


GRADIENT_WORKER = textwrap.dedent("""
    import sys
    from actorrl.algorithms import get_algorithm
    from actorrl.config.algorithm import load_config
    from actorrl.rollout.worker import RolloutWorker

    spec = get_algorithm("a3c")
    config = load_config(spec.config_cls, {"rollout_fragment_length": 20, "seed": 0})
    worker = RolloutWorker("CartPole-v1", spec.policy, config.worker_config())
    grads, info = worker.compute_gradients(worker.sample())
    print(len(grads) > 0, "torch._dynamo" in sys.modules, flush=True)
""")


def test_a_gradient_worker_never_imports_the_compiler_stack() -> None:
    """An A3C worker samples and computes gradients without building an optimizer, so it
    never imports ``torch._dynamo`` (seconds of CPU and ~70 MB per worker); only the
    process that applies gradients steps an optimizer."""
    out = subprocess.run([sys.executable, "-c", GRADIENT_WORKER], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False"], out.stdout
