"""Small pieces the pipelines share: in-flight task pools, step counters, and flow control
(a learner credit window, a sampling pacer, the replacement of failed actors)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from actorrl.messages import SampleReply
from actorrl.runtime import ActorDiedError, ActorHandle, ObjectRef, Runtime
from actorrl.util.failures import failure_line
from actorrl.util.forward import PartAttribute
from actorrl.util.stats import TimerStat
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

ReplaceWorker = Callable[[ActorHandle], Awaitable[ActorHandle | None]]
"""Starts a replacement for a failed actor (None: it could not be replaced)."""


class Wakeup:
    """An event several task pools set when any of their tasks finishes, so a pipeline
    step can sleep until there is something to do."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, timeout_s: float | None) -> None:
        """Wait until something finished (or ``timeout_s`` passed), then re-arm."""
        if not self.event.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_for(self.event.wait(), timeout_s)
        self.event.clear()


class TaskPool:
    """Calls in flight, each tagged with the actor running it (RLlib's TaskPool).

    Readiness is pushed by the runtime (no polling): :meth:`completed` returns the finished
    ``(actor, ref)`` pairs in the order they finished.
    """

    def __init__(self, runtime: Runtime, wakeup: Wakeup | None = None) -> None:
        self._runtime = runtime
        self._wakeup = wakeup
        self._tasks: dict[ObjectRef, ActorHandle] = {}
        self._ready: deque[ObjectRef] = deque()
        self._event = asyncio.Event()

    def add(self, actor: ActorHandle, ref: ObjectRef) -> None:
        """Track ``ref``, the result of a call on ``actor``."""
        self._tasks[ref] = actor
        self._runtime.on_ready(ref, lambda r=ref: self._on_ready(r))

    def _on_ready(self, ref: ObjectRef) -> None:
        if ref in self._tasks:
            self._ready.append(ref)
            self._event.set()
            if self._wakeup is not None:
                self._wakeup.event.set()

    async def completed(self, timeout_s: float | None = None
                        ) -> list[tuple[ActorHandle, ObjectRef]]:
        """Every finished task, waiting up to ``timeout_s`` for the first (None: forever,
        0: don't wait)."""
        if not self._ready and timeout_s != 0 and self._tasks:
            try:
                await wait_for(self._event.wait(), timeout_s)
            except TimeoutError:
                pass
        out = []
        while self._ready:
            ref = self._ready.popleft()
            actor = self._tasks.pop(ref, None)
            if actor is not None:
                out.append((actor, ref))
        self._event.clear()
        return out

    def reset_workers(self, workers: Iterable[ActorHandle]) -> None:
        """Forget tasks of actors not in ``workers``."""
        keep = set(workers)
        for ref, actor in list(self._tasks.items()):
            if actor not in keep:
                del self._tasks[ref]

    def remove_actor(self, actor: ActorHandle) -> None:
        """Forget every task of ``actor``."""
        for ref, owner in list(self._tasks.items()):
            if owner == actor:
                del self._tasks[ref]

    def count_for(self, actor: ActorHandle) -> int:
        """Tasks in flight on ``actor``."""
        return sum(1 for a in self._tasks.values() if a == actor)

    @property
    def count(self) -> int:
        """Tasks in flight."""
        return len(self._tasks)


@dataclass
class StepCounters:
    """Steps sampled and trained, shared by every pipeline (RLlib's PolicyOptimizer
    counters)."""

    num_steps_sampled: int = 0
    num_steps_trained: int = 0
    started_s: float = field(default_factory=time.perf_counter)
    sampled_offset: int = 0
    """Env steps of earlier runs (a restored checkpoint's ``timesteps_total``), set by the
    trainer: part of :attr:`global_timestep`, not of this pipeline's own counts."""

    @property
    def global_timestep(self) -> int:
        """The run's env-step count, restored steps included: what workers' schedules
        (epsilon, lr) follow."""
        return self.num_steps_sampled + self.sampled_offset

    def stats(self) -> dict[str, Any]:
        """RLlib's base optimizer stats."""
        return {"num_steps_sampled": self.num_steps_sampled,
                "num_steps_trained": self.num_steps_trained}


class RateWindow:
    """Units per second of wall-clock time over the last ``window_s`` seconds, idle time
    included: the rate an outside observer measures (a step timer that starts after the
    wait for work overstates it)."""

    def __init__(self, window_s: float = 10.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.window_s = window_s
        self._clock = clock
        self._total = 0.0
        self._points: deque[tuple[float, float]] = deque([(clock(), 0.0)])

    def add(self, units: float) -> None:
        """Record ``units`` done since the previous call."""
        now = self._clock()
        self._total += units
        self._points.append((now, self._total))
        # Keep one point at or before the window's start, as the base of the rate.
        while len(self._points) > 2 and self._points[1][0] <= now - self.window_s:
            self._points.popleft()

    @property
    def rate(self) -> float:
        """Units per second from the window's first point to the latest one."""
        (t0, u0), (t1, u1) = self._points[0], self._points[-1]
        return (u1 - u0) / (t1 - t0) if t1 > t0 else 0.0


class StepCountersMixin:
    """The PolicyOptimizer step-count surface, read from a pipeline's ``counters``."""

    counters: StepCounters

    num_steps_sampled = PartAttribute[int]("counters")
    """Env steps sampled so far."""

    num_steps_trained = PartAttribute[int]("counters")
    """Env steps trained on so far (for A3C: whose gradients were applied)."""


class CreditWindow:
    """How many batches may be on their way to (or waiting in) the learner.

    A credit is taken before a batch is requested (a replay from a shard) and given back
    when the learner reports it trained, refuses it, or it is lost: so no more is produced
    than the learner has room for, and a full learner costs no replay work at all.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a credit window needs at least 1 credit, got {size}")
        self.size = size
        self.in_use = 0
        self.held = 0
        """Credits of batches the learner refused: kept until it trains again."""

    @property
    def available(self) -> int:
        """Credits free now."""
        return self.size - self.in_use

    def take(self) -> bool:
        """Take one credit; False (and nothing taken) when none is free."""
        if self.in_use >= self.size:
            return False
        self.in_use += 1
        return True

    def give_back(self, n: int = 1) -> None:
        """Return ``n`` credits (never more than were taken: a learner that reports one
        batch several times, as with ``num_sgd_iter`` > 1, cannot inflate the window)."""
        self.in_use = max(0, self.in_use - n)

    def refused(self) -> None:
        """The learner refused a batch (its queue was fuller than the window assumed): the
        credit stays in use until the learner trains again, so nothing is re-requested
        just to be refused."""
        self.held += 1

    def trained(self, n: int) -> None:
        """The learner trained ``n`` batches: their credits and any held ones come back."""
        if n > 0:
            self.give_back(n + self.held)
            self.held = 0


class SamplingPacer:
    """Parks samplers while sampling runs ahead of what consumes it.

    ``ahead(extra_env_steps)`` says whether sampling is ahead once ``extra_env_steps``
    more (sampled but not yet counted) are added. A worker whose sample came back is
    :meth:`admit`-ted to sample again, or parked until :meth:`release` frees it.
    """

    def __init__(self, ahead: Callable[[int], bool]) -> None:
        self._ahead = ahead
        self.parked: list[ActorHandle] = []

    def admit(self, worker: ActorHandle, extra_env_steps: int = 0) -> bool:
        """True when ``worker`` may sample again now; else it is parked."""
        if self._ahead(extra_env_steps):
            self.parked.append(worker)
            return False
        return True

    def release(self) -> list[ActorHandle]:
        """The parked workers that may sample again (in the order they were parked)."""
        out = []
        while self.parked and not self._ahead(0):
            out.append(self.parked.pop(0))
        return out

    def dead(self, runtime: Runtime) -> list[tuple[ActorHandle, BaseException]]:
        """Parked workers this process already knows are dead (a lost node's, marked by
        the coordinator), with the error to handle them by. A parked worker has no call in
        flight whose failure would tell the pipeline, so without this a lost node's
        parked workers were noticed only when released."""
        found = {w for w in self.parked if runtime.connection_lost(w.endpoint)}
        return [(w, ActorDiedError(f"{w!r} died while parked (its node or process is gone)"))
                for w in found]

    def keep(self, workers: Iterable[ActorHandle]) -> None:
        """Forget parked workers not in ``workers``."""
        live = set(workers)
        self.parked = [w for w in self.parked if w in live]


class TrainingIntensity:
    """RLlib's ``training_intensity``: sampling is ahead while the learner has trained on
    fewer than ``intensity`` rows per env step sampled beyond ``learning_starts``, counted
    from the last :meth:`restart` (None: never ahead)."""

    def __init__(self, counters: StepCounters, intensity: float | None,
                 learning_starts: int = 0) -> None:
        self.counters = counters
        self.intensity = intensity
        self.learning_starts = learning_starts
        self._sampled0 = 0
        self._trained0 = 0

    def restart(self) -> None:
        """Count from now: sampling runs unpaced for another ``learning_starts`` steps
        (after a replay shard was replaced, so the empty one refills)."""
        self._sampled0 = self.counters.num_steps_sampled
        self._trained0 = self.counters.num_steps_trained

    def ahead(self, extra_env_steps: int = 0) -> bool:
        """Whether sampling ``extra_env_steps`` more would run ahead of the learner."""
        if self.intensity is None:
            return False
        sampled = (self.counters.num_steps_sampled + extra_env_steps - self._sampled0
                   - self.learning_starts)
        trained = self.counters.num_steps_trained - self._trained0
        return trained < self.intensity * sampled

    def learner_room(self, rows_in_flight: int, slack_rows: int) -> bool:
        """Whether the learner may take another batch: the rows trained plus
        ``rows_in_flight`` (requested, not yet trained) stay below ``intensity`` rows per env
        step sampled beyond ``learning_starts`` plus ``slack_rows``. With :meth:`ahead`
        pacing the sampler, the replay ratio is then exact to within the slack (RLlib's
        synchronous loop), not only a floor. Always true without an intensity."""
        if self.intensity is None:
            return True
        sampled = self.counters.num_steps_sampled - self._sampled0 - self.learning_starts
        trained = self.counters.num_steps_trained - self._trained0
        return trained + rows_in_flight < self.intensity * sampled + slack_rows


def require_at_least_one(name: str, value: int) -> None:
    """Refuse a count setting below 1, naming it."""
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


REPLACE_ATTEMPTS = 5
"""Tries to start one replacement before its slot is given up (:meth:`Fleet.failed`)."""
REPLACE_BACKOFF_S = 1.0
"""The wait after a replacement's first failed start, doubling after each more."""
REPLACE_BACKOFF_MAX_S = 30.0
"""The longest wait between two tries of one replacement."""


class NoWorkersError(RuntimeError):
    """Every actor of a fleet died and none could be replaced: the pipeline cannot go on."""


class Fleet:
    """The live actors of one role (rollout workers, replay shards). A failed actor is
    counted, logged and replaced in its slot (or its slot removed). A replacement whose
    start fails (no room on any node, a node lost meanwhile) is tried again after a
    backoff (:data:`REPLACE_ATTEMPTS` tries, :data:`REPLACE_BACKOFF_S` doubling up to
    :data:`REPLACE_BACKOFF_MAX_S`), each failed try one log line; several failed actors
    are replaced concurrently (:meth:`failed_all`). :meth:`require` tells a fleet that is
    empty for good (:class:`NoWorkersError`) from one waiting for replacements."""

    def __init__(self, actors: Iterable[ActorHandle], replace: ReplaceWorker | None,
                 role: str) -> None:
        self.actors = list(actors)
        self.replace = replace
        self.role = role
        self.num_failures = 0
        self.last_replace_error: BaseException | None = None
        """Why the latest replacement that gave up could not be started."""
        self._replacing: set[ActorHandle] = set()
        self._background: set[asyncio.Future[None]] = set()
        self._changed = asyncio.Event()

    @property
    def replacing(self) -> int:
        """Replacements still being started."""
        return len(self._replacing)

    def require(self) -> None:
        """Raise :class:`NoWorkersError` when the fleet is empty and nothing is being
        started to fill it (every actor died and its replacement gave up)."""
        if self.actors or self._replacing:
            return
        why = (f" (the last try: {failure_line(self.last_replace_error)})"
               if self.last_replace_error is not None else "")
        raise NoWorkersError(
            f"every {self.role} died and none could be replaced after {REPLACE_ATTEMPTS} "
            f"tries each{why}; the pipeline has nothing to sample with. Check that the "
            "cluster still has nodes with free CPUs (actorrl nodes) or lower num_workers / "
            "num_cpus_per_worker")

    async def wait_changed(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until a replacement finished, started or not."""
        with contextlib.suppress(TimeoutError):
            await wait_for(self._changed.wait(), timeout_s)

    async def _replace(self, actor: ActorHandle) -> ActorHandle | None:
        """Start ``actor``'s replacement, trying again after a backoff while its start
        fails; None when there is no ``replace`` or every try failed."""
        if self.replace is None:
            return None
        name = getattr(actor, "name", None) or repr(actor)
        for attempt in range(1, REPLACE_ATTEMPTS + 1):
            try:
                return await self.replace(actor)
            except Exception as exc:  # noqa: BLE001 - no room, a node lost meanwhile, ...
                self.last_replace_error = exc
                if attempt == REPLACE_ATTEMPTS:
                    log.warning("%s %s: replacement failed %d times (%s); its slot is given "
                                "up", self.role, name, attempt, failure_line(exc))
                    return None
                delay = min(REPLACE_BACKOFF_S * 2.0 ** (attempt - 1), REPLACE_BACKOFF_MAX_S)
                log.warning("%s %s: replacement failed (try %d of %d: %s); trying again in "
                            "%g s", self.role, name, attempt, REPLACE_ATTEMPTS,
                            failure_line(exc), delay)
                await asyncio.sleep(delay)  # the backoff, not a synchronisation
        return None

    def __iter__(self) -> Iterator[ActorHandle]:
        return iter(self.actors)

    def __len__(self) -> int:
        return len(self.actors)

    def __contains__(self, actor: object) -> bool:
        return actor in self.actors

    async def failed(self, actor: ActorHandle, exc: BaseException,
                     forget: Callable[[ActorHandle], None]) -> ActorHandle | None:
        """Handle ``actor``'s failure once: ``forget(actor)`` drops the caller's state for
        it, then a replacement takes its slot. Returns the replacement (None: already
        handled, or none could be started)."""
        if actor not in self.actors or actor in self._replacing:
            return None  # already handled (it had several calls in flight)
        self._replacing.add(actor)
        self.num_failures += 1
        log.debug("%s %r failed: %s", self.role, actor, exc)
        forget(actor)
        try:
            new = await self._replace(actor)
        finally:
            self._replacing.discard(actor)
            self._changed.set()
            self._changed = asyncio.Event()
        index = self.actors.index(actor)
        if new is None:
            self.actors.pop(index)
        else:
            self.actors[index] = new
        # One line per failure (the full error is at debug level): what died, why, and
        # what was done about it.
        outcome = ("replaced" if new is not None
                   else f"not replaced, {len(self.actors)} left")
        name = getattr(actor, "name", None) or repr(actor)  # test doubles are plain values
        log.warning("%s %s failed (%s); %s", self.role, name,
                    failure_line(exc), outcome)
        return new

    def replace_in_background(self, failures: Iterable[tuple[ActorHandle, BaseException]],
                              forget: Callable[[ActorHandle], None],
                              started: Callable[[list[ActorHandle]], None]) -> None:
        """:meth:`failed_all` without waiting for the replacements: ``forget`` runs now for
        each failed actor, the replacements start in a task and ``started(replacements)``
        runs once they are up. The pipeline carries on with the survivors meanwhile: the
        workers of a lost node may wait minutes for room on the others or for a new node.
        A replacement error surfaces at the next :meth:`check`."""
        failures = list(failures)
        for actor, _exc in failures:
            if actor in self.actors and actor not in self._replacing:
                forget(actor)
        task = asyncio.ensure_future(self._replace_all(failures, forget, started))
        self._background.add(task)

    async def _replace_all(self, failures: list[tuple[ActorHandle, BaseException]],
                           forget: Callable[[ActorHandle], None],
                           started: Callable[[list[ActorHandle]], None]) -> None:
        started(await self.failed_all(failures, forget))

    def check(self) -> None:
        """Raise the error of a background replacement that failed."""
        for task in [t for t in self._background if t.done()]:
            self._background.discard(task)
            task.result()

    async def cancel_replacements(self) -> None:
        """Stop replacements still starting (the pipeline stops)."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background.clear()

    async def failed_all(self, failures: Iterable[tuple[ActorHandle, BaseException]],
                         forget: Callable[[ActorHandle], None]) -> list[ActorHandle]:
        """:meth:`failed` for several actors at once, their replacements started
        concurrently (one at a time, recovery took as many start times as failures).
        Returns the replacements started."""
        first: dict[ActorHandle, BaseException] = {}
        for actor, exc in failures:  # an actor with several calls in flight fails each
            first.setdefault(actor, exc)
        news = await asyncio.gather(*(self.failed(actor, exc, forget)
                                      for actor, exc in first.items()))
        return [new for new in news if new is not None]


LOST_SAMPLE_TRIES = 3
"""Learner calls one synchronous step makes while workers die after their samples were
taken (each time their share is sampled again)."""
PING_TIMEOUT_S = 10.0
"""How long a ping may take to tell a live actor from a dead one."""
SYNC_CALL_TIMEOUT_S = 600.0
"""Longest wait for one round of calls on every worker (a round of samples, a weight
broadcast: :meth:`FleetMixin._on_each_worker`) or one learner step of a synchronous
pipeline."""


class FleetMixin:
    """Actors of one role held as a :class:`Fleet` (a pipeline's rollout workers, the
    evaluation workers): the live ones, how many died, and rounds of calls on all of
    them in which a dead one is replaced."""

    runtime: Runtime
    worker_fleet: Fleet

    workers = PartAttribute[list[ActorHandle]]("worker_fleet", "actors")
    """The live workers."""

    num_worker_failures = PartAttribute[int]("worker_fleet", "num_failures")
    """Workers that died."""

    async def _on_each_worker(self, call: Callable[[ActorHandle], ObjectRef]) -> list[Any]:
        """``call(worker)`` on every live worker at once; the results of those that
        answered. A worker that died is counted and replaced in its slot (the fleet's
        ``replace`` starts the new one, ready to take part from the next round on); with
        no worker left and none to replace it, this fails naming the error."""
        workers = list(self.workers)
        results = await asyncio.gather(
            *(self.runtime.get_async(call(w), timeout_s=SYNC_CALL_TIMEOUT_S)
              for w in workers),
            return_exceptions=True)
        answered = []
        died: list[tuple[ActorHandle, BaseException]] = []
        for worker, result in zip(workers, results):
            if isinstance(result, ActorDiedError):
                died.append((worker, result))
            elif isinstance(result, BaseException):
                raise result
            else:
                answered.append(result)
        if died:  # all at once: the workers of a lost node cost one start time, not N
            await self.worker_fleet.failed_all(died, lambda _w: None)
        self.worker_fleet.require()
        return answered


class LearnerFleetMixin(FleetMixin, StepCountersMixin):
    """A :class:`Fleet` of rollout workers beside one learner actor, with step counters:
    what every pipeline over workers and a learner holds."""

    learner: ActorHandle
    counters: StepCounters

    def _attach(self, runtime: Runtime, workers: list[ActorHandle], learner: ActorHandle,
                replace_worker: ReplaceWorker | None, *, no_workers: str,
                sample_locally: bool = False) -> None:
        """Hold the runtime, the workers (as a fleet) and the learner, with fresh step
        counters; ``no_workers`` is the error when there is no remote worker (and the
        learner's local worker does not sample: ``sample_locally``)."""
        if not workers and not sample_locally:
            raise ValueError(no_workers)
        self.runtime = runtime
        self.worker_fleet = Fleet(workers, replace_worker, "rollout worker")
        self.learner = learner
        self.counters = StepCounters()


class SyncFleetMixin(LearnerFleetMixin):
    """What the synchronous pipelines (PPO's sync samples, A2C's microbatches) share: each
    round calls every live worker at once and waits for all of them
    (:meth:`~FleetMixin._on_each_worker`); a worker that died in a round is counted and
    replaced in its slot (the trainer's ``replace_worker`` starts a new one with the
    learner's weights), the results of the others are kept and the replacement takes
    part from the next round on."""

    def _attach_sync(self, runtime: Runtime, workers: list[ActorHandle], learner: ActorHandle,
                     replace_worker: ReplaceWorker | None, *, sample_locally: bool,
                     no_workers: str) -> None:
        """:meth:`_attach`, plus the weights and sampling timers and no learner stats
        yet."""
        self._attach(runtime, workers, learner, replace_worker, no_workers=no_workers,
                     sample_locally=sample_locally)
        self.sample_locally = sample_locally
        self.num_samples_dropped = 0
        """Env steps sampled by workers that died before the learner fetched them (sampled
        again)."""
        self.update_weights_timer = TimerStat()
        self.sample_timer = TimerStat()
        self.learner_stats: dict[str, Any] = {}

    def reset(self, workers: list[ActorHandle]) -> None:
        """Swap the worker set (takes effect at the next step)."""
        self.worker_fleet.actors = list(workers)

    async def _sample_at_least(self, rows_wanted: int) -> tuple[list[ObjectRef], int]:
        """Sample rounds from every live worker (or the learner's local worker when there
        is none) until at least ``rows_wanted`` env steps are in hand: the samples' refs and
        their row count (timed by ``sample_timer``)."""
        samples = await self._sample_pairs(rows_wanted)
        return [ref for ref, _ in samples], sum(count for _, count in samples)

    async def _sample_pairs(self, rows_wanted: int) -> list[tuple[ObjectRef, int]]:
        """:meth:`_sample_at_least` as (ref, rows) per sample."""
        samples: list[tuple[ObjectRef, int]] = []
        rows = 0
        with self.sample_timer:
            while rows < rows_wanted:
                if self.workers:
                    replies: list[SampleReply] = await self._on_each_worker(
                        lambda w: w.sample_ref.remote())
                else:
                    replies = [await self.runtime.get_async(
                        self.learner.sample_ref.remote(), timeout_s=SYNC_CALL_TIMEOUT_S)]
                samples += [(reply.batch, reply.count) for reply in replies]
                rows += sum(reply.count for reply in replies)
            self.sample_timer.push_units_processed(rows)
        return samples

    async def _learn_on_samples(self, learn: Callable[[list[ObjectRef]], ObjectRef],
                                rows_wanted: int, timer: TimerStat | None = None
                                ) -> tuple[Any, int]:
        """Sample at least ``rows_wanted`` env steps and give their refs to the learner
        (``learn(refs)``, which fetches them from the workers; timed by ``timer``): its
        reply and the rows.
        A worker that died after its sample was taken, before the learner fetched it, costs
        only its share: its samples are dropped (counted in ``num_samples_dropped``), the
        worker is replaced and the missing rows are sampled again, and the learner is asked
        again with the kept samples (it frees nothing when a fetch fails). Before, the
        learner's ``ObjectLostError`` lost the whole iteration."""
        samples = await self._sample_pairs(rows_wanted)
        for attempt in range(1, LOST_SAMPLE_TRIES + 1):
            lost = self._lost_samples(samples)
            if not lost:
                try:
                    with timer if timer is not None else contextlib.nullcontext():
                        reply = await self.runtime.get_async(
                            learn([ref for ref, _ in samples]), timeout_s=SYNC_CALL_TIMEOUT_S)
                    return reply, sum(count for _, count in samples)
                except ActorDiedError as exc:
                    if attempt == LOST_SAMPLE_TRIES or not await self._learner_answers():
                        raise  # the learner itself died (or samples keep being lost)
                    lost = await self._dead_sample_owners(samples)
                    if not lost:
                        raise
                    log.debug("a sample was lost before the learner fetched it: %s", exc)
            dead = {w: ActorDiedError(f"{w.name or w!r} died after its sample was taken")
                    for w in self.workers if w.endpoint in lost}
            kept = [(ref, n) for ref, n in samples if ref.owner not in lost]
            missing = sum(n for ref, n in samples if ref.owner in lost)
            self.num_samples_dropped += missing
            if dead:
                await self.worker_fleet.failed_all(dead.items(), lambda _w: None)
                self.worker_fleet.require()
            samples = kept + await self._sample_pairs(missing)
        raise AssertionError("unreachable")  # the last try returns or raises

    def _lost_samples(self, samples: list[tuple[ObjectRef, int]]) -> set[str]:
        """Owners (endpoints) of ``samples`` this process already knows are dead."""
        return {ref.owner for ref, _ in samples if self.runtime.connection_lost(ref.owner)}

    async def _dead_sample_owners(self, samples: list[tuple[ObjectRef, int]]) -> set[str]:
        """Owners of ``samples`` among the workers that no longer answer a ping."""
        owners = {ref.owner for ref, _ in samples}
        workers = [w for w in self.workers if w.endpoint in owners]
        answers = await asyncio.gather(
            *(self.runtime.get_async(w.ping.remote(), timeout_s=PING_TIMEOUT_S)
              for w in workers), return_exceptions=True)
        return {w.endpoint for w, answer in zip(workers, answers)
                if isinstance(answer, BaseException)}

    async def _learner_answers(self) -> bool:
        """Whether the learner's process is alive and answers: its runtime's own
        ``__ping__``, answered by the process's event loop even while the learner works
        (the learner actor has no ``ping`` method: calling one failed, so a worker that
        died during the learner's fetch was taken for a dead learner and the iteration
        was lost). A learner in this process (serial mode) answers."""
        endpoint = self.learner.endpoint
        if endpoint in self.runtime.peers.in_process:
            return True
        if self.runtime.connection_lost(endpoint):
            return False
        try:
            await self.runtime.client(endpoint).call("__ping__", timeout_s=PING_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - dead or silent
            return False
        return True

    async def _broadcast_weights(self) -> None:
        """Give every live worker the learner's current weights (one ref, many
        ``set_weights``) and the run's env-step count (``global_timestep``, restored steps
        included), which their schedules follow. The weights call is waited on first (for
        its completion only, nothing is fetched here): a learner that died fails the step
        at once with its own error naming it, not with the workers' failure to fetch
        weights from a process that is gone."""
        weights = self.learner.get_weights.remote()
        await self.runtime.wait_async([weights], timeout_s=SYNC_CALL_TIMEOUT_S)
        error = self.runtime.call_error(weights)
        if error is not None:
            raise error
        timestep = self.counters.global_timestep
        await self._on_each_worker(lambda w: w.set_weights.remote(weights, timestep))


class FleetPipelineMixin(LearnerFleetMixin):
    """What the asynchronous pipelines over a :class:`Fleet` of rollout workers and a
    learner actor share: the live workers, their failure count and stopping the learner's
    thread."""

    async def stop(self) -> None:
        """Stop replacing workers and stop the learner's thread (the actors are stopped by
        their owner)."""
        await self.worker_fleet.cancel_replacements()
        try:
            await self.runtime.get_async(self.learner.stop.remote(), timeout_s=10)
        except (ActorDiedError, TimeoutError) as exc:
            log.debug("learner stop: %s", exc)
