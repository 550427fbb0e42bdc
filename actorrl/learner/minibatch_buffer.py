"""Serve each item of a queue several times (RLlib's MinibatchBuffer semantics).

The buffer has ``size`` slots visited round-robin. A slot that is empty (or whose item was
served ``num_passes`` times) is refilled from the in-queue, waiting at most ``timeout_s``;
the first item is served ``init_num_passes`` times, and each new item one pass more up to
``num_passes`` (so a fresh learner does not over-train on its very first batches). With
``wait_for_first`` the wait for the very first item has no limit (the seeds' Ape-X learner
waits for replay to reach ``learning_starts``, however long that takes); the timeout
applies from then on.
"""

from __future__ import annotations

import queue
from typing import Any


class LearnerStarvedError(queue.Empty):
    """No data reached the learner for ``learner_queue_timeout`` seconds."""


class MinibatchBuffer:
    """Round-robin slots over ``inqueue``; :meth:`get` returns ``(item, released)`` where
    ``released`` says this was the item's last pass."""

    def __init__(self, inqueue: queue.Queue, size: int, timeout_s: float, num_passes: int,
                 init_num_passes: int = 1, wait_for_first: bool = False) -> None:
        if size < 1:
            raise ValueError(f"minibatch_buffer_size must be >= 1, got {size}")
        if num_passes < 1:
            raise ValueError(f"num_sgd_iter must be >= 1, got {num_passes}")
        self.inqueue = inqueue
        self.timeout_s = timeout_s
        self.max_ttl = num_passes
        self.cur_max_ttl = max(1, min(init_num_passes, num_passes))
        self.buffers: list[Any] = [None] * size
        self.ttl = [0] * size
        self.idx = 0
        self.received_any = not wait_for_first

    def get(self) -> tuple[Any, bool]:
        """The next item to learn on and whether its slot is now released.

        Raises :class:`LearnerStarvedError` if the in-queue stays empty for ``timeout_s``
        (the first item, with ``wait_for_first``, is waited for without limit).
        """
        if self.ttl[self.idx] <= 0:
            try:
                self.buffers[self.idx] = self.inqueue.get(
                    timeout=self.timeout_s if self.received_any else None)
                self.received_any = True
            except queue.Empty:
                raise LearnerStarvedError(
                    f"the learner received no batch for {self.timeout_s:g} s "
                    "(learner_queue_timeout): are the rollout workers alive and sampling? "
                    "Raise learner_queue_timeout for slow environments") from None
            self.ttl[self.idx] = self.cur_max_ttl
            if self.cur_max_ttl < self.max_ttl:
                self.cur_max_ttl += 1
        item = self.buffers[self.idx]
        self.ttl[self.idx] -= 1
        released = self.ttl[self.idx] <= 0
        if released:
            self.buffers[self.idx] = None
        self.idx = (self.idx + 1) % len(self.buffers)
        return item, released
