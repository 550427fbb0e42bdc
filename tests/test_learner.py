"""The learner: minibatch buffer, learner threads, multi-tower equivalence, learner actor."""

from __future__ import annotations

import asyncio
import queue
import threading

import numpy as np
import pytest
import torch

from actorrl.data.batch import SampleBatch
from actorrl.learner.actor import LearnerActor
from actorrl.learner.config import LearnerConfig
from actorrl.learner.minibatch_buffer import LearnerStarvedError, MinibatchBuffer
from actorrl.learner.thread import LearnerThread, MultiTowerLearnerThread
from actorrl.learner.towers import TowerSet
from actorrl.rollout import RolloutWorker
from tests.helpers.waiting import wait_until
from transport.timeouts import wait_for

AC_POLICY = "actorrl.policy.actor_critic:ActorCriticPolicy"
WORKER_CONFIG = {
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 32,
    "lr": 1e-2,
    "grad_clip": 0.5,
    "gamma": 0.99,
    "lambda": 0.95,
    "model": {"fcnet_hiddens": [16, 16]},
    "seed": 3,
}


def _worker(seed: int = 3) -> RolloutWorker:
    return RolloutWorker("CartPole-v1", AC_POLICY, {**WORKER_CONFIG, "seed": seed})


def _batch(rows: int) -> SampleBatch:
    worker = _worker(seed=11)
    batches = []
    while sum(b.count for b in batches) < rows:
        batches.append(worker.sample())
    return SampleBatch.concat_samples(batches).slice(0, rows)


def _params(model: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().cpu().numpy().copy() for p in model.parameters()]


# ---- minibatch buffer ----------------------------------------------------------------

def test_minibatch_buffer_serves_each_item_num_passes_times():
    """Every item is served exactly num_passes times, round robin over the slots, and
    `released` is true on its last pass only."""
    q: queue.Queue = queue.Queue()
    for item in "abcd":
        q.put(item)
    buf = MinibatchBuffer(q, size=2, timeout_s=1.0, num_passes=3, init_num_passes=3)
    served = [buf.get() for _ in range(12)]
    assert [s[0] for s in served] == list("ababab") + list("cdcdcd")
    assert [s[1] for s in served] == [False] * 4 + [True] * 2 + [False] * 4 + [True] * 2


def test_minibatch_buffer_ramps_passes_from_init():
    """With init_num_passes=1 the first item is served once, the next twice, ..."""
    q: queue.Queue = queue.Queue()
    for item in "abc":
        q.put(item)
    buf = MinibatchBuffer(q, size=1, timeout_s=1.0, num_passes=3, init_num_passes=1)
    assert [buf.get()[0] for _ in range(6)] == ["a", "b", "b", "c", "c", "c"]


def test_minibatch_buffer_starvation_raises_clear_error():
    """An empty in-queue for longer than the timeout raises LearnerStarvedError."""
    buf = MinibatchBuffer(queue.Queue(), size=1, timeout_s=0.05, num_passes=1)
    with pytest.raises(LearnerStarvedError, match="learner_queue_timeout"):
        buf.get()


# ---- config ----------------------------------------------------------------------------

def test_learner_config_errors_are_clear():
    """Towers must split the batch evenly and be no more than its rows."""
    with pytest.raises(ValueError, match="divide evenly across 3 towers"):
        LearnerConfig(train_batch_size=100, num_gpus=3, _fake_gpus=True)
    with pytest.raises(ValueError, match="at least the number of towers"):
        LearnerConfig(train_batch_size=2, num_gpus=4, _fake_gpus=True)
    with pytest.raises(ValueError, match="num_sgd_iter must be >= 1"):
        LearnerConfig(num_sgd_iter=0)
    assert LearnerConfig(num_gpus=4, _fake_gpus=True, train_batch_size=64).num_towers == 4


# ---- towers ----------------------------------------------------------------------------

@pytest.mark.parametrize("num_towers", [1, 2, 4])
def test_towers_give_the_same_update_as_one_device(num_towers):
    """N CPU towers, each on 1/N of the batch with averaged gradients, end one update with
    the same parameters as a single-device update on the whole batch, and all replicas
    identical."""
    torch.manual_seed(0)
    batch = _batch(128)
    reference = _worker().get_policy()
    towered = _worker().get_policy()
    towered.set_weights(reference.get_weights())
    reference.learn_on_batch(batch)
    towers = TowerSet(towered, [torch.device("cpu")] * num_towers, num_stacks=1)
    towers.load(batch, 0)
    info = towers.learn_on_loaded(0)
    assert "policy_loss" in info["learner_stats"]
    for a, b in zip(_params(reference.model), _params(towered.model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for replica in towers.replicas[1:]:
        for a, b in zip(_params(towered.model), _params(replica)):
            np.testing.assert_array_equal(a, b)


def test_towers_refuse_uneven_batches():
    """A batch that does not split evenly across towers is refused with a clear error."""
    towers = TowerSet(_worker().get_policy(), [torch.device("cpu")] * 4)
    with pytest.raises(ValueError, match="split evenly across 4 towers"):
        towers.load(_batch(30), 0)


# ---- learner threads -----------------------------------------------------------------

class _RecordingWorker:
    """Wraps a RolloutWorker and records every batch learned on (thread-safe)."""

    def __init__(self) -> None:
        self.inner = _worker()
        self.learned: list[int] = []
        self.lock = threading.Lock()

    def learn_on_batch(self, batch):
        with self.lock:
            self.learned.append(int(batch["t"][0]) if "t" in batch else batch.count)
        return self.inner.learn_on_batch(batch)

    def foreach_trainable_policy(self, fn):
        return self.inner.foreach_trainable_policy(fn)


def test_learner_thread_learns_every_batch_num_sgd_iter_times():
    """The single-device learner thread learns on each queued batch num_sgd_iter times and
    reports (tag, env_steps) for each step, plus RLlib's timing keys."""
    worker = _RecordingWorker()
    config = LearnerConfig(train_batch_size=64, num_sgd_iter=2, learner_queue_timeout=30)
    thread = LearnerThread(worker, config)
    thread.start()
    for tag in range(3):
        thread.inqueue.put((tag, _batch(64)))
    results = [thread.outqueue.get(timeout=60) for _ in range(6)]
    thread.stop()
    thread.join(timeout=30)
    assert [r.tag for r in results] == [0, 0, 1, 1, 2, 2]
    assert all(r.env_steps == 64 for r in results)
    assert thread.num_steps == 6 and thread.weights_updated
    assert set(thread.timing_breakdown()) == {
        "learner_grad_time_ms", "learner_load_time_ms", "learner_load_wait_time_ms",
        "learner_dequeue_time_ms"}
    assert set(thread.learner_queue_size.stats()) >= {"size_count", "size_mean"}


def test_multi_tower_stacks_are_neither_lost_nor_served_twice():
    """With 2 stacks, 2 loader threads and num_sgd_iter=2, every batch is learned on exactly
    twice, and at the end every stack is idle again."""
    worker = _RecordingWorker()
    config = LearnerConfig(train_batch_size=64, num_gpus=2, _fake_gpus=True, num_sgd_iter=2,
                           num_multi_gpu_tower_stacks=2, num_data_load_threads=2,
                           learner_queue_timeout=30)
    thread = MultiTowerLearnerThread(worker.inner, config)
    thread.start()
    tags = list(range(6))
    for tag in tags:
        thread.inqueue.put((tag, _batch(64)))
    results = [thread.outqueue.get(timeout=60) for _ in range(12)]
    seen = sorted(r.tag for r in results)
    assert seen == sorted(tags * 2)
    assert all(r.env_steps == 64 for r in results)
    idle = sorted(thread.idle_tower_stacks.get(timeout=10) for _ in range(2))
    assert idle == [0, 1]
    assert thread.error is None
    thread.stop()


def test_learner_thread_reports_starvation():
    """A learner that gets no data for learner_queue_timeout stops with the clear error."""
    thread = LearnerThread(_worker(), LearnerConfig(learner_queue_timeout=0.1))
    thread.start()
    thread.join(timeout=30)
    assert isinstance(thread.error, LearnerStarvedError)


async def test_a_put_waiting_for_room_holds_no_thread_and_ends_when_the_learner_stops():
    """A batch waiting for room in the full in-queue waits on the event loop (no executor
    thread is held: a serial-mode IMPALA run once hung at loop shutdown on a thread
    blocked in such a put); it goes in as soon as the learner takes an item, and once the
    learner stops, a waiting put returns, dropping its batch."""
    learner = LearnerActor("CartPole-v1", AC_POLICY, WORKER_CONFIG,
                           {"train_batch_size": 8, "learner_queue_size": 1},
                           start_thread=False)  # nothing consumes: the queue stays full
    assert learner.enqueue("first", _batch(8))
    executor_threads = {t.name for t in threading.enumerate() if "asyncio" in t.name}
    waiting = asyncio.ensure_future(learner.enqueue_wait("second", _batch(8), timeout_s=60))
    await wait_until(lambda: learner.puts_waiting == 1, 10, "the put waits for room")
    assert not waiting.done()
    assert {t.name for t in threading.enumerate() if "asyncio" in t.name} == executor_threads
    assert learner.thread.inqueue.get_nowait()[0] == "first"  # room made: it goes in
    assert await wait_for(waiting, 10) == 1
    assert learner.thread.inqueue.queue[0][0] == "second"
    late = asyncio.ensure_future(learner.enqueue_wait("third", _batch(8), timeout_s=60))
    await wait_until(lambda: learner.puts_waiting == 1, 10, "the late put waits for room")
    learner.stop()
    assert await wait_for(late, 10) == 1  # returned; "third" was dropped
    assert learner.puts_waiting == 0
    assert [tag for tag, _ in learner.thread.inqueue.queue] == ["second"]


async def test_stopping_a_learner_that_never_started_wakes_its_waiters():
    """A ``wait_trained`` call on a learner whose thread never started returns when the
    learner is stopped (it used to wait out its whole timeout), and so does one made
    after the stop."""
    learner = LearnerActor("CartPole-v1", AC_POLICY, WORKER_CONFIG, {"train_batch_size": 8},
                           start_thread=False)
    waiting = asyncio.ensure_future(learner.wait_trained(timeout_s=300))
    await asyncio.sleep(0)  # the call starts and hooks the loop (either order must work)
    learner.stop()
    notice = await wait_for(waiting, 10)
    assert notice.results == () and notice.num_steps_trained == 0
    assert (await wait_for(learner.wait_trained(timeout_s=300), 10)).results == ()


async def test_learner_actor_stats_and_weights_versions():
    """The learner actor (in-process) learns, bumps its weights version, and reports the
    learner_queue, learner and timing_breakdown stats."""
    learner = LearnerActor("CartPole-v1", AC_POLICY, WORKER_CONFIG,
                           {"train_batch_size": 64, "learner_queue_timeout": 30})
    before = learner.get_weights()
    assert learner.enqueue("t0", _batch(64)) is True
    notice = await learner.wait_trained(timeout_s=30)
    assert [r.tag for r in notice.results] == ["t0"]
    assert notice.num_steps_trained == 64
    after = learner.get_weights()
    assert after["version"] > before["version"]
    stats = learner.stats()
    assert {"learner_queue", "learner", "timing_breakdown", "num_steps"} <= set(stats)
    assert "policy_loss" in stats["learner"]["default_policy"]
    learner.stop()


def test_a_plain_learner_reports_the_device_its_policies_were_moved_to(monkeypatch):
    """A learner process that sees CUDA moves its policies there and must say so in its stats
    (a lent H100 run once reported ``learner_device: cpu`` while learning on the GPU). The
    move is redirected to the ``meta`` device so this runs without a GPU."""
    import actorrl.learner.actor as learner_actor

    real_move = learner_actor.move_policy_to
    monkeypatch.setattr(learner_actor.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(learner_actor, "move_policy_to",
                        lambda policy, _device: real_move(policy, torch.device("meta")))
    learner = LearnerActor("CartPole-v1", AC_POLICY, WORKER_CONFIG, {"train_batch_size": 64},
                           start_thread=False)
    assert learner.device == "meta"
    assert learner.stats()["device"] == "meta"


async def test_a_fetch_from_a_dead_owner_fails_as_soon_as_the_learner_is_told(tmp_path):
    """The learner fetches train batches from the workers that own them. When a worker's
    process is gone before the learner ever reached it, the fetch would wait out the
    connect timeout (30 s) holding IMPALA's enqueue credit; told by the pipeline
    (``owners_died``), it fails at once with ObjectLostError."""
    from actorrl.runtime import Driver, ObjectLostError, ObjectRef

    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        learner = await driver.create_actor(
            "actorrl.learner.actor:LearnerActor",
            ["CartPole-v1", AC_POLICY, WORKER_CONFIG, {"train_batch_size": 64}])
        gone = f"ipc://{tmp_path}/no-such-worker"
        fetching = driver.runtime.get_async(
            learner.enqueue_refs.remote(None, [ObjectRef(b"\x01" * 16, gone)]))
        pending = asyncio.ensure_future(fetching)
        await driver.runtime.get_async(learner.owners_died.remote([gone], "killed"),
                                       timeout_s=10)
        with pytest.raises(ObjectLostError, match="killed"):
            await wait_for(pending, 10)  # far inside the 30 s connect timeout
