"""How long training stalls per checkpoint (issue 45 item 2).

Runs a local ``actorrl train`` in this process with a checkpoint after every iteration
and times each checkpoint call of the training loop (the loop waits for it: the stall),
then prints the stalls and the run's pace. The timing wraps
:class:`~actorrl.algorithms.run_loop.CheckpointPolicy` as ``actorrl.experiment.train`` uses
it, so the same script measures an older checkout (run it with that checkout first on
``PYTHONPATH``) for a before/after comparison.

    python -m benchmarks.checkpoint_pause                       # Ape-X on CartPole-v1
    python -m benchmarks.checkpoint_pause --algorithm appo --env MinAtar/Breakout-v1 \\
        --iterations 12
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import statistics
import sys
import tempfile
import time
from typing import Any

import actorrl.experiment.train as train_module
from actorrl.experiment.progress import PlainProgress
from actorrl.experiment.results import RunDirectory
from actorrl.experiment.train import ConfigFile, LocalRun, plan_training


def main(argv: list[str] | None = None) -> int:
    """Run the measurement; print one line per checkpoint and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="apex")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--hiddens", default="256,256",
                        help="fcnet_hiddens (the state's size: weights and optimizer)")
    args = parser.parse_args(argv)
    pauses: list[float] = []
    real_policy = train_module.checkpoint_policy if hasattr(
        train_module, "checkpoint_policy") else None
    real_class = train_module.CheckpointPolicy

    def timed(save: Any) -> Any:
        async def wrapped(final: bool) -> Any:
            started = time.perf_counter()
            try:
                return await save(final)
            finally:
                if not final:
                    pauses.append(time.perf_counter() - started)
        return wrapped

    if real_policy is not None:  # this checkout: checkpoint_policy(plan, save)
        train_module.checkpoint_policy = (  # type: ignore[attr-defined]
            lambda plan, save: real_policy(plan, timed(save)))
    else:  # an older checkout builds CheckpointPolicy(save=..., every_iterations=...)
        def make(**kwargs: Any) -> Any:
            return real_class(**{**kwargs, "save": timed(kwargs["save"])})
        train_module.CheckpointPolicy = make  # type: ignore[assignment, misc]

    hiddens = [int(h) for h in args.hiddens.split(",")]
    file = ConfigFile(path="checkpoint-pause", algorithm=args.algorithm, values={
        "env": args.env, "num_workers": args.workers, "min_iter_time_s": 1,
        "model": {"fcnet_hiddens": hiddens}}, stop={"training_iteration": args.iterations})
    with tempfile.TemporaryDirectory() as out:
        plan = plan_training(None, config_file=file, output_dir=out, checkpoint_every=1)
        plan = dataclasses.replace(plan, retention=dataclasses.replace(plan.retention, keep=2))
        run_dir = RunDirectory.create(out, plan.spec.name, plan.config.env)
        started = time.perf_counter()
        summary = asyncio.run(LocalRun(plan, run_dir, PlainProgress(io.StringIO())).run())
        wall = time.perf_counter() - started
        sizes = [sum(f.stat().st_size for f in c.iterdir())
                 for c in run_dir.checkpoints_dir.iterdir() if c.name.startswith("checkpoint_")]
    if summary.status != "finished" or not pauses:
        print(f"run {summary.status}: {summary.error or summary.stop_reason}", file=sys.stderr)
        return 1
    ms = [1000 * p for p in pauses]
    print(f"{args.algorithm} on {args.env}, fcnet_hiddens {hiddens}: {len(pauses)} "
          f"checkpoints of {max(sizes) / 1e6:.2f} MB; {summary.timesteps_total:,} env steps "
          f"in {wall:.1f} s")
    print("stall per checkpoint (ms): " + ", ".join(f"{m:.1f}" for m in ms))
    print(f"median {statistics.median(ms):.1f} ms, mean {statistics.mean(ms):.1f} ms, "
          f"max {max(ms):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
