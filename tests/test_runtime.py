"""The actor runtime with real spawned processes on loopback (ipc)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import actorrl.runtime as rt
from actorrl.runtime import Driver
from actorrl.runtime.sessions import remove_stale_session_dirs
from tests.helpers.procs import pids_alive
from tests.helpers.waiting import wait_until
from transport.codec import EncodeError

pytestmark = pytest.mark.usefixtures("light_fork_server")  # test actors need no torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def runtime():
    """A started sync runtime, shut down after the test."""
    rt.init()
    yield rt.driver()
    rt.shutdown()





def test_calls_run_in_submission_order(runtime):
    """Calls from one caller to one actor execute in the order they were submitted."""
    counter = rt.create_actor("tests.actors.basic:Counter", args=(0,))
    refs = [counter.add.remote(i) for i in range(200)]
    totals = rt.get(refs, timeout=30)
    assert rt.get(counter.history.remote(), timeout=30) == list(range(200))
    assert totals == list(np.cumsum(range(200)))


def test_wait_returns_in_first_ready_order(runtime):
    """wait() lists ready refs in the order they completed, not the order given."""
    gates = [rt.create_actor("tests.actors.basic:Gate") for _ in range(3)]
    refs = [g.wait_for.remote("go", i) for i, g in enumerate(gates)]
    ready, not_ready = rt.wait(refs, num_returns=1, timeout=0.2)
    assert ready == [] and not_ready == refs
    order = [2, 0, 1]
    for step, i in enumerate(order):
        rt.get(gates[i].open.remote("go"), timeout=30)
        ready, _ = rt.wait(refs, num_returns=step + 1, timeout=30)
        assert [refs.index(r) for r in ready] == order[: step + 1]
    ready, not_ready = rt.wait(refs, num_returns=3, timeout=30)
    assert [refs.index(r) for r in ready] == [2, 0, 1]
    assert not_ready == []
    assert rt.get(ready, timeout=30) == [2, 0, 1]


def test_ref_moves_from_owner_to_consumer_not_through_holder(runtime):
    """A 64 MB result passed by ref goes from its producer straight to the consumer: the
    driver (which holds the ref) and a relay actor (which passes it on) receive almost
    nothing."""
    size = 64 * 1024 * 1024
    producer = rt.create_actor("tests.actors.basic:Store")
    consumer = rt.create_actor("tests.actors.basic:Store")
    relay = rt.create_actor("tests.actors.basic:Relay")
    runtime_ = rt.driver().runtime
    before = runtime_.bytes_received
    consumer_before = rt.get(consumer.bytes_received.remote(), timeout=30)

    ref = producer.make.remote(size)
    total = rt.get(relay.forward.remote(consumer, [ref]), timeout=60)
    assert total == size // 8

    after = runtime_.bytes_received
    assert after - before < 64 * 1024, "the driver received the bulk data"
    assert rt.get(relay.bytes_received.remote(), timeout=30) < 64 * 1024
    consumer_after = rt.get(consumer.bytes_received.remote(), timeout=30)
    assert consumer_after - consumer_before >= size


def test_ref_passed_back_to_owner_resolves_locally_without_copy(runtime):
    """A ref given back to the actor that owns it resolves to the very same object."""
    store = rt.create_actor("tests.actors.basic:Store")
    ref = store.make.remote(1024 * 1024)
    rt.get(store.remember.remote(ref), timeout=30)
    assert rt.get(store.is_kept.remote(ref), timeout=30) is True
    # A value sent from elsewhere is a different object.
    other = rt.put({"a": np.ones(4)})
    rt.get(store.remember.remote(other), timeout=30)
    assert rt.get(store.is_kept.remote(rt.put({"a": np.ones(4)})), timeout=30) is False


def test_put_get_free(runtime):
    """put() stores locally; actors fetch it; after free() the object is gone."""
    store = rt.create_actor("tests.actors.basic:Store")
    value = {"x": np.arange(100_000, dtype=np.float64)}
    ref = rt.put(value)
    assert rt.get(ref) is value
    assert rt.get(store.consume.remote(ref), timeout=30) == float(value["x"].sum())
    made = store.make.remote(800)
    assert rt.get_and_free(made, timeout=30)["a"].shape == (100,)
    with pytest.raises(rt.ObjectLostError, match="does not exist at its owner"):
        rt.get(rt.ObjectRef(made.id, made.owner), timeout=30)


def test_remote_exception_carries_type_message_and_traceback(runtime):
    """An exception inside a method raises RemoteError at get with the remote details."""
    counter = rt.create_actor("tests.actors.basic:Counter")
    with pytest.raises(rt.RemoteError) as info:
        rt.get(counter.fail.remote("it broke"), timeout=30)
    assert info.value.type_name == "ValueError"
    assert info.value.message == "it broke"
    assert "in fail" in info.value.remote_traceback
    with pytest.raises(rt.RemoteError, match="no public method 'nope'"):
        rt.get(counter.nope.remote(), timeout=30)
    # The actor still serves after errors.
    assert rt.get(counter.add.remote(1), timeout=30) == 1


def test_remote_errors_are_caught_by_their_original_class(runtime):
    """A remote failure is a RemoteError (type name, message, remote traceback) and also
    an instance of its class: ValueError from a method; ObjectLostError and ActorDiedError
    raised in one actor and forwarded through another keep their first type and traceback,
    and differ from a local ActorDiedError (the callee itself died) by being RemoteErrors."""
    counter = rt.create_actor("tests.actors.basic:Counter")
    with pytest.raises(ValueError) as value_error:
        rt.get(counter.fail.remote("it broke"), timeout=30)
    assert isinstance(value_error.value, rt.RemoteError)
    assert value_error.value.type_name == "ValueError"
    assert "in fail" in value_error.value.remote_traceback

    store = rt.create_actor("tests.actors.basic:Store")
    relay = rt.create_actor("tests.actors.basic:Relay")
    lost = rt.put({"a": np.ones(4)})
    rt.free(lost)
    with pytest.raises(rt.ObjectLostError) as lost_error:
        rt.get(relay.forward.remote(store, [lost]), timeout=60)
    err = lost_error.value
    assert isinstance(err, rt.RemoteError) and isinstance(err, rt.ActorDiedError)
    assert err.type_name == "actorrl.runtime.errors.ObjectLostError"
    assert "does not exist at its owner" in err.message
    assert "ObjectLostError" in err.remote_traceback  # the store's, where it was raised

    gate = rt.create_actor("tests.actors.basic:Gate")
    waiting = relay.call.remote(gate, "wait_for", ["never", 1])  # the relay waits on gate
    ready, _ = rt.wait([waiting], timeout=0.5)
    assert ready == []
    gate_process = rt.driver().node.process_of(gate)
    assert gate_process is not None
    os.kill(gate_process.pid, signal.SIGKILL)
    with pytest.raises(rt.ActorDiedError) as died_error:
        rt.get(waiting, timeout=60)
    err = died_error.value
    assert isinstance(err, rt.RemoteError) and not isinstance(err, rt.ObjectLostError)
    assert err.type_name == "actorrl.runtime.errors.ActorDiedError"
    assert "in call" in err.remote_traceback  # raised in the relay, at its get
    assert rt.get(counter.add.remote(1), timeout=30) == 1  # the callers still serve


def test_unencodable_argument_fails_at_the_sender(runtime):
    """An argument the codec cannot carry raises at .remote(), naming its type."""
    counter = rt.create_actor("tests.actors.basic:Counter")
    with pytest.raises(EncodeError, match="object"):
        counter.echo.remote(object())


def test_constructor_failure_is_reported(runtime):
    """A failing constructor raises ActorCreationError with the remote message."""
    with pytest.raises(rt.ActorCreationError, match="constructor exploded"):
        rt.create_actor("tests.actors.basic:Broken")
    with pytest.raises(rt.ActorCreationError, match="No module named"):
        rt.create_actor("tests.actors.no_such_module:X")


def test_killed_actor_gives_actor_died_and_restart_works(runtime):
    """SIGKILL of an actor fails its pending refs with ActorDiedError; new calls on the
    dead handle fail at once; restart builds a fresh actor from the creation spec."""
    gate = rt.create_actor("tests.actors.basic:Gate")
    pending = gate.wait_for.remote("never", 1)
    counter = rt.create_actor("tests.actors.basic:Counter", args=(5,))
    pid = rt.get(counter.pid.remote(), timeout=30)
    blocked = counter.echo.remote(1)
    rt.get(blocked, timeout=30)
    os.kill(pid, signal.SIGKILL)
    # Whichever notices first names the death: the node (SIGKILL), the dropped connection
    # (lost), or a reconnect the dead process reset (gone).
    with pytest.raises(rt.ActorDiedError, match="SIGKILL|lost|gone"):
        rt.get(counter.add.remote(1), timeout=30)
    with pytest.raises(rt.ActorDiedError, match="SIGKILL|lost|gone"):
        rt.get(counter.add.remote(1), timeout=30)
    restarted = rt.restart_actor(counter)
    assert rt.get(restarted.add.remote(1), timeout=30) == 6
    assert rt.get(restarted.pid.remote(), timeout=30) != pid
    gate_pid_ref = rt.driver().node.process_of(gate)
    assert gate_pid_ref is not None
    os.kill(gate_pid_ref.pid, signal.SIGKILL)
    with pytest.raises(rt.ActorDiedError, match=" died: "):
        rt.get(pending, timeout=30)


def test_shutdown_leaves_no_process():
    """shutdown() reaps every actor process."""
    rt.init()
    actors = [rt.create_actor("tests.actors.basic:Counter") for _ in range(3)]
    pids = rt.get([a.pid.remote() for a in actors], timeout=30)
    rt.shutdown()
    assert pids_alive(pids, timeout_s=10) == []


def test_children_exit_when_parent_is_sigkilled(tmp_path):
    """Actors notice their parent's SIGKILL (lifeline pipe EOF) and exit."""
    script = textwrap.dedent("""
        import sys, actorrl.runtime as rt
        rt.init()
        actors = [rt.create_actor("tests.actors.basic:Counter") for _ in range(2)]
        print(*rt.get([a.pid.remote() for a in actors], timeout=60), flush=True)
        sys.stdin.read()
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2
        parent.kill()
        parent.wait(timeout=10)
        assert pids_alive(pids, timeout_s=10) == []
        # The killed driver could not remove its session folder; the next session started
        # on this host removes it (here, not left to whichever test starts one next).
        owned = [str(path.parent) for path in Path(tempfile.gettempdir()).glob(
            "actorrl-*/owner.pid") if path.read_text().strip() == str(parent.pid)]
        assert len(owned) == 1, owned
        assert owned[0] in remove_stale_session_dirs() and not os.path.exists(owned[0])
    finally:
        parent.kill()
        parent.wait(timeout=10)


async def test_async_api_driver(tmp_path):
    """The native async API: create, call, wait and get on the driver's loop."""
    async with Driver.start(session_dir=str(tmp_path / "session")) as driver:
        counter = await driver.create_actor("tests.actors.basic:Counter", args=(1,))
        refs = [counter.add.remote(i) for i in range(10)]
        ready, not_ready = await driver.wait(refs, num_returns=10, timeout_s=30)
        assert len(ready) == 10 and not not_ready
        assert await driver.get(refs[-1], timeout_s=30) == 1 + sum(range(10))
        ref = driver.put(np.arange(5))
        assert (await driver.get(counter.echo.remote(ref), timeout_s=30)).tolist() == list(
            range(5))


async def test_calls_pending_on_a_killed_actor_leave_no_unretrieved_errors(tmp_path, caplog):
    """Calls still pending when their actor is SIGKILLed fail with ActorDiedError; those
    whose refs nobody gets are dropped without asyncio's "exception was never retrieved"
    error reaching the log."""
    import gc

    async with Driver.start(str(tmp_path / "s")) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate")
        pid = await driver.get(gate.pid.remote(), timeout_s=30)
        refs = [gate.wait_for.remote("never", i) for i in range(5)]
        watched = gate.wait_for.remote("never", "watched")
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(rt.ActorDiedError, match=" died: "):
            await driver.get(watched, timeout_s=30)
        ready, _ = await driver.wait(refs, num_returns=len(refs), timeout_s=30)
        assert len(ready) == len(refs)
        del refs, ready
        gc.collect()
    assert "never retrieved" not in caplog.text


async def test_repeated_wait_leaves_nothing_behind_on_pending_refs(tmp_path):
    """200 waits over a ref that stays pending leave its call future with no extra
    callbacks (wait() removes its hooks from refs that did not become ready)."""
    async with Driver.start(session_dir=str(tmp_path / "s")) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate", timeout_s=60)
        ready = gate.open.remote("other")
        await driver.get(ready, timeout_s=30)
        pending = gate.wait_for.remote("k", 1)
        before = pending.call_hooks
        for _ in range(200):
            done, _ = await driver.wait([ready, pending], num_returns=1, timeout_s=10)
            assert done == [ready]
        after = pending.call_hooks
        await driver.get(gate.open.remote("k"), timeout_s=30)
        assert await driver.get(pending, timeout_s=30) == 1
        assert after == before, f"{after - before} callbacks left by 200 waits"


def test_object_put_inside_a_method_is_fetchable_before_the_method_returns(runtime):
    """An actor method can put a value and have another actor fetch it while the method
    is still running (puts are stored before any request leaves the method)."""
    putter = rt.create_actor("tests.actors.basic:Putter")
    store = rt.create_actor("tests.actors.basic:Store")
    assert rt.get(putter.roundtrip.remote(store, 800_000), timeout=60) == 100_000.0


async def test_a_timed_out_get_leaves_the_ref_usable(tmp_path):
    """A get that times out (or is cancelled) does not cancel the call: the same ref
    resolves later, from the async Driver and from the sync API alike."""
    async with Driver.start(str(tmp_path / "s")) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate")
        ref = gate.wait_for.remote("k", 42)
        with pytest.raises(rt.GetTimeoutError, match="get timed out after 0.2 s"):
            await driver.get(ref, timeout_s=0.2)
        with pytest.raises(rt.GetTimeoutError, match="get timed out after 0.1 s"):
            await driver.get([ref], timeout_s=0.1)
        await driver.get(gate.open.remote("k"), timeout_s=10)
        assert await driver.get(ref, timeout_s=10) == 42


def test_a_timed_out_sync_get_leaves_the_ref_usable(runtime):
    gate = rt.create_actor("tests.actors.basic:Gate")
    ref = gate.wait_for.remote("k", 7)
    with pytest.raises(rt.GetTimeoutError, match="timed out after 0.2 s"):
        rt.get(ref, timeout=0.2)
    rt.get(gate.open.remote("k"), timeout=10)
    assert rt.get(ref, timeout=10) == 7


async def test_every_waiter_of_a_call_still_being_sent_wakes(tmp_path):
    """A call submitted from another thread has its future from the submit on, before the
    loop sends it: a readiness hook made in that window, a get and a wait on it at the
    same time all see it resolve."""
    import threading

    async with Driver.start(str(tmp_path / "s")) as driver:
        counter = await driver.create_actor("tests.actors.basic:Counter")
        refs = []
        thread = threading.Thread(target=lambda: refs.append(counter.add.remote(5)))
        thread.start()
        thread.join()  # the send is queued on the loop, not made yet
        hooked = asyncio.Event()
        driver.runtime.on_ready(refs[0], hooked.set)
        got = asyncio.ensure_future(driver.get(refs[0], timeout_s=30))
        waited = asyncio.ensure_future(driver.wait(refs, timeout_s=30))
        await asyncio.wait_for(hooked.wait(), 30)
        assert await got == 5
        assert (await waited)[0] == refs


async def test_bad_arguments_to_an_async_method_do_not_stall_the_actor(tmp_path):
    """The TypeError of a bad call is the caller's error; the next call still runs."""
    async with Driver.start(str(tmp_path / "s")) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate")
        with pytest.raises(rt.RemoteError, match="TypeError"):
            await driver.get(gate.open.remote(), timeout_s=10)
        await driver.get(gate.open.remote("k"), timeout_s=10)
        assert await driver.get(gate.wait_for.remote("k", 5), timeout_s=10) == 5


async def test_a_cancelled_wait_leaves_no_hooks(tmp_path):
    async with Driver.start(str(tmp_path / "s")) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate")
        ref = gate.wait_for.remote("k", 1)
        await driver.wait([ref], timeout_s=0.01)
        hooks = ref.call_hooks
        for _ in range(20):
            task = asyncio.ensure_future(driver.wait([ref]))
            await asyncio.sleep(0)  # one loop pass: the wait hooks itself up
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert ref.call_hooks == hooks


async def test_timed_out_gets_of_a_received_ref_share_one_fetch(tmp_path):
    """Polling get(timeout) on a ref received from elsewhere keeps one fetch in flight (the
    owner sends the value once), and the value still arrives."""
    async with Driver.start(str(tmp_path / "s")) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate")
        ref = gate.wait_for.remote("k", 3)
        received = rt.ObjectRef(ref.id, ref.owner)  # as if it came inside a value
        client = driver.runtime.client(ref.owner)
        await driver.wait([ref], timeout_s=0.05)
        before = client.in_flight
        for _ in range(10):
            with pytest.raises(rt.GetTimeoutError, match="get timed out after 0.01 s"):
                await driver.get(received, timeout_s=0.01)
        assert client.in_flight == before + 1
        await driver.get(gate.open.remote("k"), timeout_s=10)
        assert await driver.get(received, timeout_s=10) == 3


async def test_wait_on_a_received_ref_of_a_dead_owner_is_ready_at_once(tmp_path):
    async with Driver.start(str(tmp_path / "s")) as driver:
        counter = await driver.create_actor("tests.actors.basic:Counter")
        ref = counter.add.remote(1)
        assert await driver.get(ref, timeout_s=10) == 1
        received = rt.ObjectRef(ref.id, ref.owner)
        await driver.kill_actor(counter)
        ready, _ = await driver.wait([received], timeout_s=5)
        assert ready == [received]
        with pytest.raises(rt.ObjectLostError, match="owner of ObjectRef.* died: "):
            await driver.get(received, timeout_s=5)


async def test_a_call_whose_send_fails_fails_its_ref(tmp_path):
    """A call submitted from another thread whose send raises (a full send queue) fails
    its ref instead of leaving it pending forever, and leaves no reply slot behind."""
    import threading

    import zmq

    from actorrl.runtime.process.handles import ActorHandle

    async with Driver.start(str(tmp_path / "s")) as driver:
        handle = ActorHandle("x" * 32, "ipc://" + str(tmp_path / "nobody.sock"))
        client = driver.runtime.client(handle.endpoint)

        def full(frames):
            raise zmq.Again("send queue full")

        # Private: a full send queue cannot be produced on demand over ipc (the runtime
        # sets no send HWM), so the socket's send is made to raise as a full one does.
        client._async.send = full
        refs = []
        thread = threading.Thread(
            target=lambda: refs.append(driver.runtime.submit(handle, "noop", [], {})))
        thread.start()
        thread.join()
        with pytest.raises(zmq.Again, match="Resource temporarily unavailable"):
            await driver.get(refs[0], timeout_s=10)
        assert client.in_flight == 0


async def test_an_id_asked_for_early_waits_as_long_as_its_call_runs():
    """A fetch that overtook the call producing the object starts the unknown-id timer;
    once the call is announced the waiter waits for the value, however long it takes."""
    from actorrl.runtime.process.store import STATUS_OK, ObjectStore

    store = ObjectStore(asyncio.get_running_loop(), unknown_wait_s=0.05)
    got = []
    store.when_ready(b"x" * 16, lambda status, value: got.append((status, value)))
    store.add_pending(b"x" * 16)
    await asyncio.sleep(0.15)  # past the unknown-id wait: the timer must not fire
    assert got == []
    store.set(b"x" * 16, STATUS_OK, 42)
    assert got == [(STATUS_OK, 42)]


async def test_puts_of_a_method_are_stored_before_its_reply(tmp_path):
    """A sync method that puts and returns the ref just as the loop delivers an earlier
    result: its put is stored before its reply leaves (else a fetch would find nothing).
    The second method's finish is handed back exactly as the executor thread would do it,
    inside the delivery of the first (the executor's ``after_flush_puts`` test hook)."""
    # HostedCall is how a served call is handed to the executor; the race needs one
    # made by hand (finished through the public hand_back).
    from actorrl.runtime.process.hosting import HostedCall
    from actorrl.runtime.process.refs import new_object_id
    from actorrl.runtime.process.runtime import Runtime
    from actorrl.runtime.process.store import STATUS_OK

    late_put = new_object_id()
    replied = asyncio.Event()
    runtime = Runtime.start(str(tmp_path), "t")

    class Request:
        """Records its replies, and whether the late put was stored at reply time."""

        def __init__(self) -> None:
            self.replies: list = []
            self.put_stored: list[bool] = []

        def reply(self, value) -> None:
            self.replies.append(value)
            self.put_stored.append(runtime.store.lookup(late_put) is not None)
            replied.set()

    class Maker:
        def make(self) -> int:
            return 0

    try:
        runtime.host_actor(Maker())
        executor = runtime.executor
        late = Request()

        def another_method_finishes() -> None:
            if late.put_stored or executor.after_flush_puts is None:
                return
            executor.after_flush_puts = None  # once
            executor.pending_puts.append((late_put, "value"))
            executor.hand_back(HostedCall(late, new_object_id(), "make", [], {}), STATUS_OK,
                               [rt.ObjectRef(late_put, runtime.address)])

        executor.after_flush_puts = another_method_finishes
        first = Request()
        executor.submit(HostedCall(first, new_object_id(), "make", [], {}), runtime.actor.make)
        await asyncio.wait_for(replied.wait(), 10)
        await wait_until(lambda: bool(late.replies), 10, "the late method replies")
        assert first.replies and late.put_stored == [True]
    finally:
        runtime.close()


async def test_an_actor_given_up_on_at_start_is_not_reported_dead(tmp_path):
    """A creation that times out kills the process; that exit is no actor's death (nobody
    ever got a handle), and the node forgets it."""
    async with Driver.start(str(tmp_path / "s")) as driver:
        deaths = []
        driver.node.on_death.append(lambda actor_id, reason: deaths.append(actor_id))
        with pytest.raises(rt.ActorCreationError, match="did not start"):
            await driver.create_actor("tests.actors.basic:NeverBuilt", timeout_s=0.5)
        given_up = [r.process for r in driver.node.actors.values()]
        assert len(given_up) == 1
        assert await given_up[0].wait(30) is not None
        assert deaths == []
        assert driver.node.actors == {}
        counter = await driver.create_actor("tests.actors.basic:Counter")
        assert await driver.get(counter.add.remote(2), timeout_s=30) == 2


async def test_one_failing_waiter_does_not_starve_the_others():
    from actorrl.runtime.process.store import STATUS_OK, ObjectStore

    store = ObjectStore(asyncio.get_running_loop())
    store.add_pending(b"y" * 16)
    got = []

    def broken(status, value):
        raise RecursionError("a reply that cannot be encoded")

    store.when_ready(b"y" * 16, broken)
    store.when_ready(b"y" * 16, lambda status, value: got.append(value))
    store.set(b"y" * 16, STATUS_OK, 9)
    assert got == [9]
    assert store.lookup(b"y" * 16) == (STATUS_OK, 9)


async def test_frees_of_collected_refs_travel_with_the_next_call(tmp_path):
    """The frees of collected refs wait for the next request to their owner and go in the
    same message, before it (so that call already sees them freed), once there are many
    (or they waited FREE_RIDE_AGE_S); with no request they go on their own within
    FREE_DELAY_S."""
    import gc

    from actorrl.runtime.process.frees import FREE_BATCH, FREE_DELAY_S

    many = FREE_BATCH // 16
    async with Driver.start(str(tmp_path / "s")) as driver:
        counter = await driver.create_actor("tests.actors.basic:Counter", timeout_s=60)
        refs = [counter.noop.remote() for _ in range(many)]
        await driver.get(refs, timeout_s=30)
        before = await driver.get(counter.stored.remote(), timeout_s=30)
        del refs
        gc.collect()
        assert driver.runtime.pending_frees >= many, "the frees wait"
        # The previous `stored` result is freed along too, and this one is stored after.
        assert await driver.get(counter.stored.remote(), timeout_s=30) == before - many
        refs = [counter.noop.remote() for _ in range(3)]
        await driver.get(refs, timeout_s=30)
        del refs
        gc.collect()
        await wait_until(lambda: not driver.runtime.pending_frees, 100 * FREE_DELAY_S,
                         "the frees are sent on their own")


async def test_a_get_that_gives_up_leaves_the_call_running(tmp_path):
    """A get that times out (or is cancelled) while the call runs does not cancel the
    call: a later get of the same ref returns its value."""
    async with Driver.start(str(tmp_path / "s")) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate", timeout_s=60)
        ref = gate.wait_for.remote("k", 7)
        with pytest.raises(rt.GetTimeoutError, match="get timed out after 0.2 s"):
            await driver.get(ref, timeout_s=0.2)
        waiter = asyncio.ensure_future(driver.get(ref))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await driver.get(gate.open.remote("k"), timeout_s=30)
        assert await driver.get(ref, timeout_s=30) == 7
