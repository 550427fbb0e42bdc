"""The learner process: an actor that owns the trainable policies and learns in a thread.

It holds a local :class:`RolloutWorker` (RLlib's "local worker") whose policies it trains.
Batches arrive as refs resolved straight from their owners (workers or replay shards), go
into the learner thread's bounded in-queue, and results (counts, stats, per-sample outputs
such as ``td_error``) are pushed to the coordinator: it keeps one :meth:`wait_trained` call
outstanding, which answers as soon as the thread has trained a batch. The event loop stays
free while the thread learns, so ``get_weights`` and ``stats`` answer at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from actorrl.config.loading import load_worker_config
from actorrl.config.rollout import WorkerConfig
from actorrl.data.batch import MultiAgentBatch, SampleBatch, as_multi_agent
from actorrl.envs import EpisodeMetrics
from actorrl.learner.config import LearnerConfig
from actorrl.learner.thread import LearnerResult, make_learner_thread
from actorrl.learner.towers import TowerSet, epoch_minibatches, move_policy_to
from actorrl.messages import (
    EnqueueReply,
    GradientsApplied,
    SampleReply,
    TrainedBatch,
    TrainedNotice,
)
from actorrl.policy.config import PolicyConfig
from actorrl.rollout import RolloutWorker
from actorrl.runtime import ObjectRef, Runtime
from actorrl.util.classpath import resolve_callable
from transport.error_types import register_error
from transport.timeouts import wait_for

STOP_JOIN_TIMEOUT_S = 30.0
"""How long :meth:`LearnerActor.stop` waits for the learner thread's step in progress."""


@register_error  # reaches the pipeline (and its caller) as a LearnerError
class LearnerError(RuntimeError):
    """The learner thread (or one of its loader threads) stopped with an error; the message
    names the thread and the error and carries its traceback."""


class _NotifyingQueue(queue.Queue):
    """The learner thread's out-queue: each put also calls ``on_put`` (from the thread), so
    the event loop learns of a trained batch when it happens instead of polling."""

    def __init__(self) -> None:
        super().__init__()
        self.on_put: Callable[[], None] | None = None

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Queue ``item`` and notify."""
        super().put(item, block, timeout)
        if self.on_put is not None:
            self.on_put()


def _policy_device(worker: RolloutWorker) -> torch.device:
    """The device the worker's policies compute on (all of a learner's share one)."""
    devices = worker.foreach_policy(lambda policy, _pid: policy.device)
    return devices[0] if devices else torch.device("cpu")


class LearnerActor:
    """Actor wrapper of the learner. Construct with the same env / policy / worker config as
    the rollout workers, plus the learner's own settings (see :class:`LearnerConfig`).
    ``sampling``: the local worker also samples (A2C and PPO with ``num_workers: 0``;
    :meth:`sample_ref`, :meth:`get_metrics`, :meth:`pop_custom_metrics` and the
    observation-filter methods, as a rollout worker's)."""

    FORK_PRELOAD: ClassVar[tuple[str, ...]] = ("torch._dynamo",)
    """Imported by the fork server before it forks a learner: the policy's optimizer
    imports torch's compiler stack (~1.5 s of CPU, ~70 MB), so a restarted learner, or
    the next run of a process that keeps its fork server, shares it instead."""

    def __init__(self, env: str, policy: str, worker_config: WorkerConfig | Mapping[str, Any],
                 learner_config: LearnerConfig | Mapping[str, Any],
                 start_thread: bool = True, sampling: bool = False) -> None:
        policy_cls = resolve_callable(policy, "policy class")
        config = load_worker_config(worker_config, getattr(policy_cls, "config_class",
                                                           PolicyConfig))
        if not sampling:  # only a sampling local worker needs more than one env
            config = config.replace(rollout=config.rollout.replace(num_envs_per_worker=1))
        self.worker = RolloutWorker(env, policy_cls, config, worker_index=0,
                                    num_workers=int(getattr(config.policy, "num_workers", 0)))
        self.config = (learner_config if isinstance(learner_config, LearnerConfig)
                       else LearnerConfig.load(learner_config))
        if not self.config.multi_tower and torch.cuda.is_available():
            # A learner only sees CUDA when its node gave it a GPU: learn there.
            self.worker.foreach_policy(lambda p, _pid: move_policy_to(p, torch.device("cuda")))
        self.thread = make_learner_thread(self.worker, self.config)
        self.thread.outqueue = _NotifyingQueue()
        self._trained = asyncio.Event()
        self._room = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Multi-tower threads name their tower devices; a plain thread learns wherever the
        # policies are (CUDA when moved there above).
        devices = getattr(self.thread, "devices", None)
        self.device = str(devices[0] if devices else _policy_device(self.worker))
        self.weights_version = 0
        self.num_steps_trained = 0
        self._seen_steps = 0
        self._stopped = False
        self.puts_waiting = 0
        """Puts waiting on the loop for room in the full in-queue."""
        self._accumulated: dict[str, tuple[list[Any] | None, int]] = {}
        self._sgd_towers: dict[str, TowerSet] = {}
        """Single-device towers of :meth:`learn_on_train_batch` (multi-tower: the thread's)."""
        self._sgd_rng = np.random.default_rng(torch.initial_seed() % 2**32)
        """Shuffles :meth:`learn_on_train_batch`'s minibatches (seeded with the job)."""
        if start_thread:
            self.thread.start()

    # ---- sampling with the local worker (no remote workers) -----------------------------
    def sample_ref(self) -> SampleReply:
        """Sample with the local worker and keep the batch here (as a rollout worker's
        ``sample_ref``): the reply carries its ref and counts."""
        with self.thread.update_lock:
            batch = self.worker.sample()
        agent_steps = batch.agent_steps() if isinstance(batch, MultiAgentBatch) else batch.count
        return SampleReply(batch=Runtime.current().put(batch), count=batch.count,
                           agent_steps=agent_steps, worker_index=0)

    def get_metrics(self) -> EpisodeMetrics:
        """Episodes the local worker finished since the last call."""
        return self.worker.get_metrics()

    def pop_custom_metrics(self) -> list[dict[str, float]]:
        """Callbacks' ``custom_metrics`` of the local worker's episodes ended since the
        last call (as a rollout worker's)."""
        return self.worker.pop_custom_metrics()

    def get_filters(self, flush_after: bool = False) -> dict[str, Any]:
        """The local worker's observation-filter deltas since the last flush (as a rollout
        worker's)."""
        return self.worker.get_filters(flush_after)

    def sync_filters(self, new_filters: Mapping[str, Any]) -> None:
        """Take the driver's merged observation-filter statistics (local worker)."""
        self.worker.sync_filters(new_filters)

    def filter_state(self) -> dict[str, Any] | None:
        """The local worker's observation-filter statistics (None without one)."""
        return self.worker.filter_state()

    # ---- feeding ----------------------------------------------------------------------
    def _check(self) -> None:
        if self.thread.error is not None:
            source = self.thread.error_source
            where = (f"the learner's loader thread {source!r}" if "loader" in source
                     else "the learner thread")
            raise LearnerError(f"{where} failed: {self.thread.error!r}\n"
                               f"{self.thread.error_traceback}")

    def enqueue(self, tag: Any, batch: SampleBatch) -> bool:
        """Put ``(tag, batch)`` in the in-queue if there is room; False when full (the
        caller counts a drop)."""
        self._check()
        try:
            self.thread.inqueue.put_nowait((tag, batch))
        except queue.Full:
            return False
        return True

    async def enqueue_wait(self, tag: Any, batch: SampleBatch, timeout_s: float = 600.0
                           ) -> int:
        """Put ``(tag, batch)`` in the in-queue, waiting (off the loop) while it is full.
        Returns the queue size after the put."""
        self._check()
        await self._put_when_room((tag, batch), timeout_s)
        return self.thread.inqueue.qsize()

    async def enqueue_refs(self, tag: Any, refs: list[ObjectRef], block: bool = True,
                           timeout_s: float = 600.0) -> EnqueueReply:
        """Fetch sample batches straight from their owners (and free them there), join them
        into one train batch, and enqueue it (waiting for room when ``block``, else dropping
        it unfetched when the queue is full). ``None`` batches (a shard not replaying yet)
        are skipped. Raises ``ObjectLostError`` when a batch's owner died."""
        self._check()
        runtime = Runtime.current()
        if not block and self.thread.inqueue.full():
            runtime.free(refs)  # dropped before fetching: no bandwidth spent on it
            return EnqueueReply(queued=False, dropped=True, count=0,
                                queue_size=self.queue_size())
        started = time.perf_counter()
        batches = [b for b in await runtime.get_and_free_async(refs) if b is not None]
        fetch_time_s = time.perf_counter() - started
        if not batches:  # e.g. a replay shard before learning_starts
            return EnqueueReply(queued=False, dropped=False, count=0,
                                queue_size=self.queue_size(), fetch_time_s=fetch_time_s)
        batch = await asyncio.to_thread(self._join, batches)
        if block:
            await self._put_when_room((tag, batch), timeout_s)
            queued = True
        else:
            queued = self.enqueue(tag, batch)
        return EnqueueReply(queued=queued, dropped=not queued, count=batch.count,
                            queue_size=self.queue_size(), fetch_time_s=fetch_time_s)

    async def owners_died(self, endpoints: list[str], reason: str) -> None:
        """Told by the pipeline that the processes at ``endpoints`` died: batches being
        fetched from them fail now (``ObjectLostError`` to the pipeline) instead of after the
        connect timeout, so the train batches they held give their enqueue credit back."""
        runtime = Runtime.current()
        for endpoint in endpoints:
            runtime.mark_dead(endpoint, reason)

    async def _put_when_room(self, item: tuple[Any, Any], timeout_s: float) -> None:
        """Put ``item`` in the in-queue, waiting on this loop while it is full (woken when
        the learner takes an item; no thread is held, so a cancelled call or a stopped
        actor leaves nothing blocked). Once the learner is stopped the item is dropped.
        Raises ``queue.Full`` after ``timeout_s``."""
        self._hook_loop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.thread.stopped:
            self._room.clear()
            try:
                self.thread.inqueue.put_nowait(item)
                return
            except queue.Full:
                self._check()  # a failed learner never makes room
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise queue.Full(f"the learner's in-queue stayed full for {timeout_s:g} s")
            self.puts_waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._room.wait(), remaining)
            finally:
                self.puts_waiting -= 1

    def _join(self, batches: list[Any]) -> Any:
        batch = SampleBatch.concat_samples(batches)
        unit = self.config.num_towers * self.config.tower_rows_multiple
        # Sequenced batches (recurrent policies) need no trim: towers split them at
        # sequence boundaries and weight their gradients by rows.
        if self.config.multi_tower and isinstance(batch, SampleBatch) \
                and not batch.is_sequenced and batch.count % unit:
            # Towers need equal shards of whole sequences: drop the ragged tail.
            batch = batch.slice(0, batch.count - batch.count % unit)
        return batch

    def queue_size(self) -> int:
        """Batches waiting in the in-queue."""
        return self.thread.inqueue.qsize()

    def queue_full(self) -> bool:
        """True when :meth:`enqueue` would drop."""
        return self.thread.inqueue.full()

    # ---- results ----------------------------------------------------------------------
    async def wait_trained(self, timeout_s: float = 30.0) -> TrainedNotice:
        """Answer as soon as the learner thread has trained at least one batch since the
        last call: a :class:`TrainedNotice` with those batches (tag, env_steps, agent_steps,
        per_sample). The coordinator keeps one call outstanding, so results arrive when
        they happen. Answers with no results after ``timeout_s``, or when the thread
        stopped; raises :class:`LearnerError` when it failed."""
        self._check()
        self._hook_loop()
        finished = self._drain_results()
        if not finished and not self._thread_ended():
            with contextlib.suppress(TimeoutError):
                finished = await wait_for(self._next_results(), timeout_s)
            self._check()
        return TrainedNotice(results=tuple(finished), weights_version=self.current_version(),
                             num_steps_trained=self.num_steps_trained)

    async def _next_results(self) -> list[TrainedBatch]:
        while True:
            await self._trained.wait()
            self._trained.clear()
            finished = self._drain_results()
            if finished or self._thread_ended():
                return finished

    def _drain_results(self) -> list[TrainedBatch]:
        out = []
        while True:
            try:
                result: LearnerResult = self.thread.outqueue.get_nowait()
            except queue.Empty:
                return out
            self.num_steps_trained += result.env_steps
            out.append(TrainedBatch(tag=result.tag, env_steps=result.env_steps,
                                    agent_steps=result.agent_steps,
                                    per_sample=result.per_sample))

    def _thread_ended(self) -> bool:
        """The thread ran and ended, or the learner was stopped before it ever started."""
        return not self.thread.is_alive() and (self.thread.ident is not None or self._stopped)

    def _hook_loop(self) -> None:
        """On the first wait: the thread's puts, the room it makes in its in-queue, and its
        end wake this loop's waiters."""
        if self._loop is not None:
            return
        self._loop = loop = asyncio.get_running_loop()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._trained.set)

        self.thread.outqueue.on_put = wake

        def room() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._room.set)

        self.thread.inqueue.on_take = room

        def watch() -> None:
            if self.thread.ident is not None:
                self.thread.join()
            wake()
            room()  # a put waiting for room sees the failure (or the closed queue)

        threading.Thread(target=watch, name="learner-watch", daemon=True).start()

    def current_version(self) -> int:
        """Increases with every update applied to the weights."""
        return self.thread.num_steps + self.weights_version

    # ---- weights ----------------------------------------------------------------------
    def get_weights(self) -> dict[str, Any]:
        """``{"version": v, "weights": {policy_id: {name: array}}}`` read consistently
        between two updates: the weights rollout workers act with (each policy's
        ``acting_weight_names``; SAC's and DDPG's actor without their Q networks)."""
        with self.thread.update_lock:
            return {"version": self.current_version(),
                    "weights": self.worker.get_weights(acting_only=True)}

    def set_weights(self, weights: Mapping[str, Any]) -> int:
        """Load weights (``{policy_id: {name: array}}``); returns the new version."""
        with self.thread.update_lock:
            self.worker.set_weights(weights)
            self.weights_version += 1
        return self.current_version()

    def apply_gradients(self, grads: Any) -> int:
        """Apply gradients computed by a rollout worker (A3C); returns the new version."""
        with self.thread.update_lock:
            self.worker.apply_gradients(grads)
            self.weights_version += 1
        return self.current_version()

    async def apply_gradients_refs(self, refs: list[ObjectRef]) -> GradientsApplied:
        """Fetch gradients straight from the worker that computed them (freeing them
        there) and apply them; returns the new weights version and the apply's duration."""
        grads = await Runtime.current().get_and_free_async(refs[0])
        return await asyncio.to_thread(self._apply_timed, grads)

    def _apply_timed(self, grads: Any) -> GradientsApplied:
        started = time.perf_counter()
        version = self.apply_gradients(grads)
        return GradientsApplied(version=version, apply_time_s=time.perf_counter() - started)

    async def get_weights_after(self, applies: list[ObjectRef]) -> dict[str, Any]:
        """The weights once the gradient apply ``applies[0]`` (a call on this learner) has
        finished, whether it succeeded or not: what A3C sends back to the worker whose
        gradient it was. A plain ``get_weights`` could run before that apply, which is
        async (it first fetches the gradient)."""
        with contextlib.suppress(Exception):
            await Runtime.current().get_async(applies[0])
        return await asyncio.to_thread(self.get_weights)

    async def accumulate_gradients_refs(self, refs: list[ObjectRef]) -> dict[str, Any]:
        """Microbatch step: fetch sample batches from their owners, compute gradients per
        trainable policy on their concatenation, and add ``count * grad`` to the
        accumulator. Returns the microbatch's row count and learner stats. A batch whose
        owner died raises ``ObjectLostError`` and frees none of them: the pipeline keeps
        the others and samples the lost share again."""
        batches = await _get_then_free(refs)
        return await asyncio.to_thread(self.accumulate_gradients, batches)

    def _trainable_batches(self, batch: MultiAgentBatch) -> list[tuple[str, SampleBatch]]:
        """``(policy id, rows)`` of each trainable policy with rows in ``batch``."""
        trainable = set(self.worker.policies_to_train)
        return [(pid, rows) for pid, rows in batch.policy_batches.items()
                if pid in trainable and rows.count > 0]

    def accumulate_gradients(self, batches: list[Any]) -> dict[str, Any]:
        """Compute gradients per trainable policy on the concatenation of ``batches`` and
        add ``count * grad`` to the accumulator (what :meth:`accumulate_gradients_refs`
        does with fetched batches). Returns the row count and learner stats."""
        batch = as_multi_agent(SampleBatch.concat_samples(batches))
        stats: dict[str, Any] = {}
        with self.thread.update_lock:
            for pid, policy_batch in self._trainable_batches(batch):
                grads, info = self.worker.get_policy(pid).compute_gradients(policy_batch)
                total, rows = self._accumulated.get(pid, (None, 0))
                scaled = [g * policy_batch.count for g in grads]
                total = scaled if total is None else [a + b for a, b in zip(total, scaled)]
                self._accumulated[pid] = (total, rows + policy_batch.count)
                stats[pid] = info.get("learner_stats", {})
        return {"count": batch.count, "learner_stats": stats}

    def apply_accumulated_gradients(self) -> dict[str, Any]:
        """Apply the count-weighted mean of the accumulated gradients (equal to the
        full-batch gradient of a mean loss) once per policy, then reset."""
        applied = {}
        with self.thread.update_lock:
            for pid, (total, rows) in self._accumulated.items():
                self.worker.get_policy(pid).apply_gradients([g / rows for g in total])
                applied[pid] = rows
            self._accumulated = {}
            self.weights_version += 1
        return {"rows": applied, "version": self.current_version()}

    async def learn_on_train_batch_refs(self, refs: list[ObjectRef]) -> dict[str, Any]:
        """PPO's synchronous learner step: fetch the sample batches straight from their
        owners (freeing them there), then :meth:`learn_on_train_batch` off the event loop.
        Returns the rows trained, the fetch time and the learner stats per policy. A batch
        whose owner died raises ``ObjectLostError`` and frees none of them: the pipeline
        keeps the others and samples the lost share again."""
        started = time.perf_counter()
        batches = await _get_then_free(refs)
        fetch_time_s = time.perf_counter() - started
        result = await asyncio.to_thread(self.learn_on_train_batch, batches)
        return {**result, "fetch_time_s": fetch_time_s}

    def learn_on_train_batch(self, batches: list[Any]) -> dict[str, Any]:
        """Minibatch SGD epochs on the concatenation of ``batches`` (RLlib's PPO step),
        under the update lock. Per trainable policy: ``advantages`` standardised over its
        whole train batch (mean 0, std 1), the batch pre-loaded once on the tower devices
        (:meth:`TowerSet.preload`), then ``num_sgd_iter`` epochs of
        :func:`~actorrl.learner.towers.epoch_minibatches` (``sgd_minibatch_size`` rows,
        ``shuffle_sequences``), one SGD step on the towers each; the stats are the means
        over the step's minibatches, and a policy with ``update_kl`` (PPO) adapts its KL
        coefficient from their mean ``kl`` (``cur_kl_coeff`` reports the new value)."""
        batch = as_multi_agent(SampleBatch.concat_samples(batches))
        config = self.config
        num_sgd_iter = int(config.num_sgd_iter)
        minibatch_size = int(getattr(config, "sgd_minibatch_size", config.train_batch_size))
        shuffle = bool(getattr(config, "shuffle_sequences", True))
        towers_of: dict[str, TowerSet] = getattr(self.thread, "towers", None) or \
            self._sgd_towers
        rng = self._sgd_rng
        stats: dict[str, Any] = {}
        with self.thread.update_lock:
            for pid, policy_batch in self._trainable_batches(batch):
                policy = self.worker.get_policy(pid)
                towers = towers_of.get(pid)
                if towers is None:
                    towers = towers_of[pid] = TowerSet(policy, [policy.device])
                policy_batch = SampleBatch(dict(policy_batch))
                advantages = policy_batch[SampleBatch.ADVANTAGES].astype(np.float64)
                policy_batch[SampleBatch.ADVANTAGES] = (
                    (advantages - advantages.mean()) / max(1e-4, float(advantages.std()))
                ).astype(np.float32)
                towers.preload(policy_batch)
                seq_lens = (policy_batch[SampleBatch.SEQ_LENS] if policy_batch.is_sequenced
                            else None)
                results = []
                try:
                    for _ in range(num_sgd_iter):
                        for indices in epoch_minibatches(policy_batch.count, minibatch_size,
                                                         rng, shuffle=shuffle,
                                                         seq_lens=seq_lens):
                            results.append(towers.learn_on_minibatch(indices)["learner_stats"])
                finally:
                    towers.release_preloaded()
                means = {key: float(np.mean([r[key] for r in results])) for key in results[0]}
                update_kl = getattr(policy, "update_kl", None)
                if update_kl is not None and "kl" in means:
                    means["cur_kl_coeff"] = float(update_kl(means["kl"]))
                means["num_sgd_steps"] = len(results)
                stats[pid] = means
            self.weights_version += 1
        self.num_steps_trained += batch.count
        return {"count": batch.count, "learner_stats": stats}

    def set_global_timestep(self, timestep: int) -> None:
        """Tell the policies the global env-step count (schedules)."""
        self.worker.set_global_timestep(timestep)

    # ---- stats and state --------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """learner_queue window stats, last learner info, timing_breakdown, counters."""
        self._check()
        return {
            "learner_queue": self.thread.learner_queue_size.stats(),
            "learner": self.thread.learner_info,
            "timing_breakdown": self.thread.timing_breakdown(),
            "num_steps": self.thread.num_steps,
            "weights_updated": self.thread.weights_updated,
            "device": self.device,
            "num_towers": self.config.num_towers,
        }

    def get_state(self) -> dict[str, Any]:
        """Policy weights and optimizer states plus counters, for checkpoints."""
        with self.thread.update_lock:
            return {"policies": self.worker.get_state(), "version": self.current_version(),
                    "num_steps_trained": self.num_steps_trained}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state` output."""
        with self.thread.update_lock:
            self.worker.set_state(state["policies"])
            self.weights_version = int(state.get("version", 0)) - self.thread.num_steps
            self.num_steps_trained = int(state.get("num_steps_trained", 0))

    def stop(self) -> None:
        """Stop the learner thread (a put waiting for room returns, dropping its batch; a
        :meth:`wait_trained` call returns, also when the thread never started)."""
        self._stopped = True
        self.thread.stop()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._room.set)
                loop.call_soon_threadsafe(self._trained.set)
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            # Wait out the step in progress: a learner thread still inside torch when the
            # interpreter exits aborts the process ("terminate called without an active
            # exception"; serial mode, where the learner lives in the driver's process).
            self.thread.join(timeout=STOP_JOIN_TIMEOUT_S)


async def _get_then_free(refs: list[ObjectRef]) -> list[Any]:
    """Fetch ``refs`` from their owners, then free them there; when one is lost (its
    owner died) the error is raised and nothing is freed, so the caller can send the live
    ones again with samples replacing the lost one."""
    runtime = Runtime.current()
    batches = await runtime.get_async(refs)
    runtime.free(refs, soon=False)
    return list(batches)
