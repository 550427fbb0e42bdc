"""Serial mode: every actor in the driver's process and event loop, with the semantics of
actor processes (refs, get/wait, typed errors, death), a stack that spans the pipeline
step, and no child process at all (``actorrl train a2c --serial``)."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

import actorrl.runtime as rt
from actorrl.pipelines.apex import AsyncReplayOptimizer
from actorrl.replay.config import ReplayConfig
from actorrl.runtime import ActorDiedError, Driver, DriverLike, ObjectLostError, Runtime
from actorrl.runtime.cluster.coordinator import Coordinator
from actorrl.runtime.cluster.driver import ClusterDriver
from tests.actors.failing import SampleFailure
from tests.helpers.procs import descendants

DQN = "actorrl.policy.dqn:DQNPolicy"


class Probe:
    """A serial-test actor: reports the stack its methods run on, raises, puts."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def stack(self) -> list[str]:
        """The names of the functions on the stack while this method runs (what a
        breakpoint here would show)."""
        return [frame.function for frame in inspect.stack()]

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def record(self, tag: str) -> list[str]:
        self.calls.append(tag)
        return list(self.calls)

    def big(self, n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float64)

    def put_big(self, n: int) -> rt.ObjectRef:
        """Put an array in this actor's store and return its ref (as workers do)."""
        return Runtime.current().put(np.ones(n, dtype=np.float64))

    def mutate(self, array: np.ndarray) -> bool:
        """Whether an array argument can be written (it cannot over the wire)."""
        return bool(array.flags.writeable)

    def pid(self) -> int:
        return os.getpid()

    async def later(self, event_key: str) -> str:
        await asyncio.sleep(0)
        return event_key


async def test_calls_refs_and_order(tmp_path):
    """Method calls return refs, get/wait resolve them, one caller's calls run in order,
    and the actor runs in this process (no process is started: fork servers an earlier
    test's runtime left idle for reuse are all that may run below this one)."""
    before = descendants(os.getpid())
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        probe = await driver.create_actor("tests.test_serial:Probe")
        refs = [probe.record.remote(str(i)) for i in range(4)]
        ready, not_ready = await driver.wait(refs, num_returns=4, timeout_s=5)
        assert not_ready == [] and len(ready) == 4
        assert await driver.get(refs[-1]) == ["0", "1", "2", "3"]
        assert await driver.get(probe.pid.remote()) == os.getpid()
        assert await driver.get(probe.later.remote("x")) == "x"
        # Arguments cross the codec: the actor gets a read-only copy, like over the wire.
        assert await driver.get(probe.mutate.remote(np.zeros(100_000))) is False
        assert descendants(os.getpid()) == before


async def test_a_pending_ref_argument_holds_back_the_calls_behind_it(tmp_path):
    """A call whose ref argument is not ready waits, and so do later calls to the same
    actor (submission order), as in an actor process."""
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate")
        counter = await driver.create_actor("tests.actors.basic:Counter", args=(0,))
        value = gate.wait_for.remote("k", 5)
        first = counter.add.remote(value)
        second = counter.add.remote(100)
        ready, _ = await driver.wait([first, second], num_returns=1, timeout_s=0.2)
        assert ready == []
        await driver.get(gate.open.remote("k"))
        assert await driver.get([first, second], timeout_s=5) == [5, 105]


async def test_an_error_keeps_its_type_and_its_traceback_spans_the_caller(tmp_path):
    """The error a method raises is raised by get with its type; its traceback runs from
    the code that made the call down to the raise, and the original is the cause."""
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        probe = await driver.create_actor("tests.test_serial:Probe")

        def pipeline_step() -> rt.ObjectRef:
            return probe.fail.remote("boom")

        with pytest.raises(ValueError, match="boom") as info:
            await driver.get(pipeline_step())
        error = info.value
        assert isinstance(error, rt.RemoteError)
        trace = error.remote_traceback
        assert trace.index("pipeline_step") < trace.index("in fail"), trace
        assert isinstance(error.__cause__, ValueError)


def test_an_off_loop_call_error_traces_from_the_method_only(tmp_path):
    """A call submitted from another thread (the synchronous API) runs later, from a loop
    callback, with no caller on the stack: its error's traceback starts at the actor's
    method, naming no frame of the loop's thread as the caller."""
    rt.init(str(tmp_path / "s"), serial=True)
    try:
        probe = rt.create_actor("tests.test_serial:Probe")
        with pytest.raises(ValueError, match="boom") as info:
            rt.get(probe.fail.remote("boom"), timeout=10)
        trace = info.value.remote_traceback
        assert "in fail" in trace and "threading.py" not in trace, trace
    finally:
        rt.shutdown()


async def test_a_breakpoint_in_an_actor_sees_the_pipeline_step(tmp_path):
    """A synchronous method runs inline, so its stack holds the caller's frames."""
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        probe = await driver.create_actor("tests.test_serial:Probe")

        def pipeline_step() -> rt.ObjectRef:
            return probe.stack.remote()

        stack = await driver.get(pipeline_step())
        assert stack.index("stack") < stack.index("pipeline_step")


async def test_an_apex_step_error_traces_from_the_pipeline_to_the_worker(tmp_path):
    """A worker's sample error raised by an Ape-X step carries one traceback from the
    pipeline's dispatch through the worker's method."""
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        raising = await driver.create_actor("tests.actors.failing:RaisingWorker",
                                            args=(64, 1, 1))
        shard = await driver.create_actor("tests.actors.scripted:RecordingReplayActor",
                                          args=(ReplayConfig(learning_starts=10**9,
                                                             buffer_size=10_000).to_dict(),),
                                          kwargs={"seed": 0})
        config = {"model": {"fcnet_hiddens": [16]}, "hiddens": [16], "train_batch_size": 32}
        learner = await driver.create_actor(
            "actorrl.learner.actor:LearnerActor",
            args=("CartPole-v1", DQN, config, {"train_batch_size": 32}))
        pipeline = AsyncReplayOptimizer(driver.runtime, [raising], [shard], learner,
                                        learner_queue_size=16, max_weight_sync_delay=400)
        with pytest.raises(SampleFailure) as info:
            for _ in range(10):
                await pipeline.step(timeout_s=0.2)
        trace = info.value.remote_traceback
        assert "pipelines/" in trace and "failing.py" in trace, trace
        await pipeline.stop()


async def test_killed_actor_semantics(tmp_path):
    """Killing a serial actor: its pending calls fail with ActorDiedError, the objects it
    owned are lost, later calls fail at once, the death is reported, and it can be
    restarted from its spec."""
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        deaths: list[str] = []
        driver.node.on_death.append(lambda actor_id, reason: deaths.append(actor_id))
        gate = await driver.create_actor("tests.actors.basic:Gate")
        probe = await driver.create_actor("tests.test_serial:Probe")
        pending = gate.wait_for.remote("never", 1)
        big = probe.big.remote(100_000)  # too large to travel inline with the reply
        put = await driver.get(probe.put_big.remote(100_000))
        assert (await driver.get(big)).shape == (100_000,)
        driver.node.kill_actor(gate)
        driver.node.kill_actor(probe)
        with pytest.raises(ActorDiedError, match=re.escape("died: killed (serial mode)")):
            await driver.get(pending, timeout_s=5)
        with pytest.raises(ObjectLostError, match=re.escape("died: killed (serial mode)")):
            await driver.get(put, timeout_s=5)
        with pytest.raises(ActorDiedError, match=re.escape("died: killed (serial mode)")):
            await driver.get(probe.pid.remote(), timeout_s=5)
        assert deaths == [gate.actor_id, probe.actor_id]
        fresh = await driver.restart_actor(probe)
        assert await driver.get(fresh.record.remote("a")) == ["a"]


def test_sync_api_in_serial_mode(tmp_path):
    """``init(serial=True)``: the synchronous API drives serial actors from this thread."""
    before = descendants(os.getpid())
    rt.init(str(tmp_path / "s"), serial=True)
    try:
        counter = rt.create_actor("tests.actors.basic:Counter", args=(1,))
        assert rt.get([counter.add.remote(2), counter.add.remote(3)], timeout=10) == [3, 6]
        ref = rt.put({"x": 1})
        assert rt.get(counter.echo.remote(ref), timeout=10) == {"x": 1}
        assert rt.driver().serial and descendants(os.getpid()) == before
    finally:
        rt.shutdown()


async def test_both_drivers_are_driver_like(tmp_path):
    """Driver (local and serial) and ClusterDriver satisfy the protocol the Trainer is
    typed for."""
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        coordinator = cast(Coordinator, SimpleNamespace(runtime=driver.runtime))
        cluster = ClusterDriver(coordinator, "job:x")
        for candidate in (driver, cluster):
            assert isinstance(candidate, DriverLike)
        assert driver.local_gpus == driver.node.num_gpus and cluster.local_gpus == 0.0


SPAWN_GUARD = textwrap.dedent("""
    import _posixsubprocess, os, sys

    def refuse(*args, **kwargs):
        raise AssertionError("serial mode started a child process")

    _posixsubprocess.fork_exec = refuse  # subprocess, multiprocessing's spawn
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            setattr(os, name, refuse)

    from actorrl.cli.main import main

    code = main(sys.argv[1:])
    children = []
    for path in __import__("glob").glob(f"/proc/{os.getpid()}/task/*/children"):
        children += open(path).read().split()
    assert children == [], children
    sys.exit(code)
""")


def test_serial_training_starts_no_child_process(tmp_path):
    """``actorrl train a2c --serial --stop-timesteps 4000`` (0.5 s iterations) runs to
    completion while every way of starting a process is refused, and leaves no child
    behind."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-c", SPAWN_GUARD, "train", "a2c", "--serial", "--stop-timesteps",
         "4000", "--set", "min_iter_time_s=0.5", "--stop-time", "300",
         "--output", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "finished: timesteps_total" in done.stdout + done.stderr


@pytest.mark.learning
@pytest.mark.parametrize("algorithm", ["apex", "a3c", "a2c", "impala"])
async def test_algorithm_learns_cartpole_serially(algorithm, tmp_path):
    """The same pipelines, serially: each algorithm reaches a mean return of 150 on
    CartPole-v1 with 2 workers, without a child process of its own."""
    from actorrl.algorithms import Trainer, get_algorithm
    from actorrl.config.algorithm import load_config

    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {"num_workers": 2, "seed": 0,
                                           "min_iter_time_s": 1.0})
    before = descendants(os.getpid())
    best, history = float("-inf"), []
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        trainer = await Trainer.create(spec, config, driver)
        start = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - start < 120 and best < 150:
            result = await trainer.train()
            history.append((result["timesteps_total"], round(result["episode_reward_mean"], 1)))
            if result["episode_reward_mean"] == result["episode_reward_mean"]:  # not NaN
                best = max(best, result["episode_reward_mean"])
        assert descendants(os.getpid()) == before
        await trainer.stop()
    assert best >= 150, f"{algorithm} reached only {best}: {history}"
