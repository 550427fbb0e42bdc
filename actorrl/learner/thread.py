"""The learner threads: learn on batches from a bounded in-queue, off the event loop.

:class:`LearnerThread` (one device): a minibatch buffer serves each in-queue item
``num_sgd_iter`` times to the local worker's ``learn_on_batch``.

:class:`MultiTowerLearnerThread` (``num_gpus`` towers, real or fake): loader threads move
in-queue batches into idle tower stacks; the learner pulls ready stacks through a minibatch
buffer (``num_sgd_iter`` passes each), learns on every trainable policy's towers, and
returns a stack to the idle queue once its passes are done.

In-queue items are ``(tag, batch)``; ``tag`` is opaque (Ape-X uses the replay shard index)
and comes back with the results. Out-queue items are :class:`LearnerResult`.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actorrl.data.batch import MultiAgentBatch, SampleBatch, as_multi_agent
from actorrl.learner.config import LearnerConfig
from actorrl.learner.minibatch_buffer import MinibatchBuffer
from actorrl.learner.towers import TowerSet, tower_devices
from actorrl.util.stats import TimerStat, WindowStat


class InQueue(queue.Queue):
    """The learner's bounded in-queue; ``on_take`` (if set) is called whenever an item is
    taken, i.e. room was made, from the taking thread under the queue's lock (keep it
    short): the learner actor waits for room on its event loop, holding no thread."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.on_take: Callable[[], None] | None = None

    def _get(self) -> Any:
        item = super()._get()
        if self.on_take is not None:
            self.on_take()
        return item


@dataclass
class LearnerResult:
    """What one learning step produced."""

    tag: Any
    env_steps: int
    agent_steps: int
    learner_info: dict[str, Any]
    per_sample: dict[str, dict[str, Any]] = field(default_factory=dict)
    """policy id -> per-row outputs (``td_error``) and the batch's ``batch_indexes``."""


def _per_sample(batch: MultiAgentBatch, results: dict[str, dict[str, Any]]
                ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    info: dict[str, Any] = {}
    per_sample: dict[str, dict[str, Any]] = {}
    for pid, result in results.items():
        info[pid] = result.get("learner_stats", {})
        rows = {k: v for k, v in result.items() if k != "learner_stats"}
        pb = batch.policy_batches.get(pid)
        if pb is not None and SampleBatch.BATCH_INDEXES in pb:
            rows["batch_indexes"] = pb[SampleBatch.BATCH_INDEXES]
        if rows:
            per_sample[pid] = rows
    return info, per_sample


class LearnerThread(threading.Thread):
    """Single-device learner thread (RLlib LearnerThread semantics).

    ``local_worker`` is anything with ``learn_on_batch(batch) -> {policy_id: info}``
    (a RolloutWorker). ``error`` holds the exception that stopped the thread, if any, and
    ``error_source`` the thread it happened in (``learner``, ``learner-loader-0``...).
    """

    def __init__(self, local_worker: Any, config: LearnerConfig) -> None:
        super().__init__(name="learner", daemon=True)
        self.local_worker = local_worker
        self.config = config
        self.inqueue = InQueue(config.learner_queue_size)
        self.outqueue: queue.Queue = queue.Queue()
        self.learner_queue_size = WindowStat("size", 50)
        self.queue_timer = TimerStat()
        self.grad_timer = TimerStat()
        self.load_timer = TimerStat()
        self.load_wait_timer = TimerStat()
        self.weights_updated = False
        self.learner_info: dict[str, Any] = {}
        self.stopped = False
        self.num_steps = 0
        self.error: BaseException | None = None
        self.error_traceback = ""
        self.error_source = ""
        self.update_lock = threading.Lock()
        self.minibatch_buffer = MinibatchBuffer(
            self.inqueue, config.minibatch_buffer_size, config.learner_queue_timeout,
            config.num_sgd_iter, init_num_passes=config.num_sgd_iter,
            wait_for_first=config.wait_for_first_batch)

    def run(self) -> None:
        try:
            while not self.stopped:
                self.step()
        except BaseException as exc:
            self._record_error(exc)

    def _record_error(self, exc: BaseException) -> None:
        """Keep the first error and the thread it happened in (a loader's error, re-raised
        by the learner thread, stays the loader's)."""
        if self.error is None:
            self.error_traceback = traceback.format_exc()
            self.error_source = threading.current_thread().name
            self.error = exc

    def step(self) -> None:
        """Learn on the next (tag, batch) from the minibatch buffer."""
        with self.queue_timer:
            (tag, batch), _released = self.minibatch_buffer.get()
        if batch is None:  # stop sentinel
            return
        ma = as_multi_agent(batch)
        with self.grad_timer, self.update_lock:
            results = self.local_worker.learn_on_batch(batch)
            self.grad_timer.push_units_processed(batch.count)
        info, per_sample = _per_sample(ma, results)
        self._finish(tag, ma, info, per_sample)

    def _finish(self, tag: Any, batch: MultiAgentBatch, info: dict[str, Any],
                per_sample: dict[str, dict[str, Any]]) -> None:
        self.weights_updated = True
        self.learner_info = info
        self.num_steps += 1
        self.outqueue.put(LearnerResult(tag, batch.count, batch.agent_steps(), info,
                                        per_sample))
        self.learner_queue_size.push(self.inqueue.qsize())

    def stop(self) -> None:
        """Ask the thread to stop after its current step."""
        self.stopped = True
        try:
            self.inqueue.put_nowait((None, None))
        except queue.Full:
            pass

    def timing_breakdown(self) -> dict[str, float]:
        """RLlib's learner timing keys, in milliseconds."""
        def ms(timer: TimerStat) -> float:
            return round(1000 * timer.mean, 3)

        return {
            "learner_grad_time_ms": ms(self.grad_timer),
            "learner_load_time_ms": ms(self.load_timer),
            "learner_load_wait_time_ms": ms(self.load_wait_timer),
            "learner_dequeue_time_ms": ms(self.queue_timer),
        }


class MultiTowerLearnerThread(LearnerThread):
    """Multi-tower learner (RLlib MultiGPULearnerThread semantics); see the module doc."""

    def __init__(self, local_worker: Any, config: LearnerConfig) -> None:
        super().__init__(local_worker, config)
        devices = tower_devices(config.num_gpus, config._fake_gpus)
        self.towers: dict[str, TowerSet] = {}
        local_worker.foreach_trainable_policy(
            lambda policy, pid: self.towers.__setitem__(
                pid, TowerSet(policy, devices, config.num_multi_gpu_tower_stacks)))
        self.devices = devices
        self.idle_tower_stacks: queue.Queue = queue.Queue()
        self.ready_tower_stacks: queue.Queue = queue.Queue()
        for index in range(config.num_multi_gpu_tower_stacks):
            self.idle_tower_stacks.put(index)
        self.stack_tags: list[Any] = [None] * config.num_multi_gpu_tower_stacks
        self.stack_batches: list[MultiAgentBatch | None] = [None] * (
            config.num_multi_gpu_tower_stacks)
        self.minibatch_buffer = MinibatchBuffer(
            self.ready_tower_stacks, config.num_multi_gpu_tower_stacks,
            config.learner_queue_timeout, config.num_sgd_iter,
            init_num_passes=config.num_sgd_iter, wait_for_first=config.wait_for_first_batch)
        self.loader_threads = [
            threading.Thread(target=self._load_loop, args=(i,), name=f"learner-loader-{i}",
                             daemon=True)
            for i in range(config.num_data_load_threads)
        ]
        for thread in self.loader_threads:
            thread.start()

    def _load_loop(self, index: int) -> None:
        # Like RLlib, only the first loader reports into the learner's timers (a TimerStat
        # times one block at a time).
        queue_timer = self.queue_timer if index == 0 else TimerStat()
        load_timer = self.load_timer if index == 0 else TimerStat()
        try:
            while not self.stopped:
                with queue_timer:
                    tag, batch = self.inqueue.get()
                if batch is None:
                    self.ready_tower_stacks.put(None)
                    return
                stack = self.idle_tower_stacks.get()
                if stack < 0:  # stop
                    return
                with load_timer:
                    ma = as_multi_agent(batch)
                    for pid, towers in self.towers.items():
                        if pid in ma.policy_batches:
                            towers.load(ma.policy_batches[pid], stack)
                self.stack_tags[stack] = tag
                self.stack_batches[stack] = ma
                self.ready_tower_stacks.put(stack)
        except BaseException as exc:
            self._record_error(exc)
            self.ready_tower_stacks.put(None)

    def step(self) -> None:
        """Learn once on the next ready stack (a stack serves ``num_sgd_iter`` passes)."""
        if self.error is not None:
            raise self.error
        with self.load_wait_timer:
            stack, released = self.minibatch_buffer.get()
        if stack is None:
            if self.error is not None:
                raise self.error
            return
        batch = self.stack_batches[stack]
        tag = self.stack_tags[stack]
        assert batch is not None
        results: dict[str, dict[str, Any]] = {}
        with self.grad_timer, self.update_lock:
            for pid, towers in self.towers.items():
                if pid in batch.policy_batches:
                    results[pid] = towers.learn_on_loaded(stack)
            self.grad_timer.push_units_processed(batch.count)
        if released:
            for towers in self.towers.values():
                towers.release(stack)
            self.stack_batches[stack] = None
            self.idle_tower_stacks.put(stack)
        info, per_sample = _per_sample(batch, results)
        self._finish(tag, batch, info, per_sample)

    def stop(self) -> None:
        """Stop the learner and its loader threads (wherever each is blocked)."""
        self.stopped = True
        self.ready_tower_stacks.put(None)
        for _ in self.loader_threads:
            self.idle_tower_stacks.put(-1)
            try:
                self.inqueue.put_nowait((None, None))
            except queue.Full:
                pass

    def join(self, timeout: float | None = None) -> None:
        """Join the learner thread and its loaders."""
        super().join(timeout)
        for thread in self.loader_threads:
            thread.join(timeout)


def make_learner_thread(local_worker: Any, config: LearnerConfig) -> LearnerThread:
    """The single-device or multi-tower learner thread that ``config`` calls for."""
    if config.multi_tower:
        return MultiTowerLearnerThread(local_worker, config)
    return LearnerThread(local_worker, config)
