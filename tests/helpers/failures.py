"""Failure scenarios shared by the algorithms' tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.runtime import ActorHandle, Driver


async def train_past_a_killed_worker(algorithm: str, values: dict[str, Any], tmp_path: Path
                                     ) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                ActorHandle, list[ActorHandle]]:
    """Train one iteration, SIGKILL the first rollout worker, train two more: the first
    result, the two after, the killed worker and the workers at the end."""
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, values)
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            first = await trainer.train()
            dead = trainer.workers[0]
            await driver.kill_actor(dead)
            results = [await trainer.train() for _ in range(2)]
            workers = list(trainer.workers)
        finally:
            await trainer.stop()
    return first, results, dead, workers
