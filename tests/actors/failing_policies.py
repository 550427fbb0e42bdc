"""Policies that fail on purpose inside the learner process, for the failure paths: the
learner thread's update raises, or a multi-tower loader thread's batch loading raises."""

from __future__ import annotations

import threading
from typing import Any

import torch

from actorrl.data.batch import SampleBatch
from actorrl.policy.dqn import DQNPolicy
from actorrl.policy.impala import ImpalaPolicy

FAIL_AFTER = 3


class InjectedFailure(RuntimeError):
    """The error these policies raise."""


class FailingLearnDQNPolicy(DQNPolicy):
    """A DQN policy whose ``FAIL_AFTER + 1``-th ``learn_on_batch`` raises (in the learner
    thread: rollout workers never learn)."""

    learned = 0

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, Any]:
        self.learned += 1
        if self.learned > FAIL_AFTER:
            raise InjectedFailure(f"injected failure in update {self.learned}")
        return super().learn_on_batch(batch)


class FailingLoaderImpalaPolicy(ImpalaPolicy):
    """An IMPALA policy whose batch loading fails in a multi-tower loader thread after
    ``FAIL_AFTER`` loads (towers load through ``batch_to_tensors``)."""

    loads = 0

    def batch_to_tensors(self, batch: SampleBatch, device: torch.device | None = None
                         ) -> dict[str, torch.Tensor]:
        if threading.current_thread().name.startswith("learner-loader"):
            self.loads += 1
            if self.loads > FAIL_AFTER:
                raise InjectedFailure(f"injected failure in tower load {self.loads}")
        return super().batch_to_tensors(batch, device)
