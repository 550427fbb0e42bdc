"""Shared memory for same-host bulk arrays (transport.shm): codec handles, pooled and
placed segments, lifetimes (calls, refs, kill -9 of owners, runtime close), hostile
handles, and the switch that turns it off."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import struct
import subprocess
import sys

import msgpack
import numpy as np
import pytest

import actorrl.runtime as rt
from actorrl.runtime import Driver
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.sessions import remove_stale_session_dirs
from transport import shm

# Private: _SHM_HEAD is the wire layout of a shared-memory handle; the hostile-handle
# tests forge handles byte for byte with it.
from transport.codec import _SHM_HEAD, EXT_SHM_ARRAY, Codec, DecodeError
from transport.rpc import LOCAL_ID_BIT, RpcClient, RpcServer
from transport.shm import segments as shm_segments_file
from transport.timeouts import wait_for

pytestmark = [pytest.mark.skipif(not shm.available(), reason="no writable /dev/shm"),
              pytest.mark.usefixtures("light_fork_server")]  # test actors need no torch

BIG = 2 * 2**20  # bytes per big array: above the 256 KiB threshold
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ShmPeer:
    """Test actor: keeps what it is sent, makes and puts big arrays, calls a peer."""

    def __init__(self) -> None:
        self.kept: object = None
        self.holds = 0
        self.changed = asyncio.Event()
        self.release = asyncio.Event()

    def make(self, nbytes: int) -> dict[str, np.ndarray]:
        return {"a": np.arange(nbytes // 8, dtype=np.float64)}

    def make_full(self, nbytes: int, fill: float) -> np.ndarray:
        return np.full(nbytes // 8, fill)

    def put_big(self, nbytes: int) -> list[rt.ObjectRef]:
        return [rt.Runtime.current().put(np.full(nbytes // 8, 7.0))]

    def keep(self, value: object) -> float:
        self.kept = value
        return float(sum(float(np.asarray(v).sum()) for v in _arrays(value)))

    def drop(self) -> None:
        self.kept = None
        gc.collect()

    def received_shm_bytes(self) -> int:
        runtime = rt.Runtime.current()
        return runtime.server.shm_bytes_received

    async def hold(self, value: object) -> None:
        """Keep ``value`` and never return (until released): a call in progress."""
        self.kept = value
        self.holds += 1
        self.changed.set()
        await self.release.wait()

    async def wait_holds(self, n: int) -> None:
        """Return once ``n`` calls of :meth:`hold` have started."""
        while self.holds < n:
            self.changed.clear()
            await self.changed.wait()

    async def send_and_hang(self, peer: rt.ActorHandle, nbytes: int) -> None:
        """Call ``peer.hold`` with a big array (its segments are this process's until the
        call is answered, which it never is)."""
        runtime = rt.Runtime.current()
        await runtime.get_async(peer.hold.remote({"x": np.ones(nbytes // 8)}))


def _arrays(value: object) -> list[np.ndarray]:
    if isinstance(value, dict):
        return [a for v in value.values() for a in _arrays(v)]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays(v)]
    return [value] if isinstance(value, np.ndarray) else []


def _owned_by(pid: int) -> list[str]:
    return [n for n in shm.list_segments() if n.split(".")[2] == str(pid)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(autouse=True)
def no_segments_left():
    """No test leaves a segment behind: none of this process, none of a dead process (its
    actors; other users of /dev/shm running beside the tests are not counted)."""
    before = set(shm.list_segments())
    yield
    gc.collect()
    left = [n for n in set(shm.list_segments()) - before
            if int(n.split(".")[2]) == os.getpid() or not _alive(int(n.split(".")[2]))]
    assert not left, f"segments left behind: {sorted(left)}"


# ---------------------------------------------------------------------------- codec level


def test_big_arrays_travel_as_handles_small_ones_inline() -> None:
    codec = Codec()
    pool = shm.SegmentPool()
    value = {"big": np.arange(BIG // 4, dtype=np.float32),
             "fortran": np.asfortranarray(np.ones((512, 300))),
             "small": np.arange(10), "text": "x"}
    placer = shm.CallPlacer(pool)
    frames = codec.encode(value, placer)
    assert len(frames) == 1 and len(frames[0]) < 1024, "only the header travels"
    assert len(placer.segments) == 2
    plain = codec.encode(value)
    assert len(plain) == 3, "without a placer the big arrays are frames"
    out = codec.decode(frames, allow_shm=True)
    for key in ("big", "fortran", "small"):
        assert np.array_equal(out[key], value[key])
    assert out["fortran"].flags.f_contiguous
    assert not out["big"].flags.writeable
    assert out["small"].flags.writeable  # inline arrays are copies, as before
    assert codec.take_shm_bytes() == value["big"].nbytes + value["fortran"].nbytes

    # The receiver holds the segments (lent) until its arrays are collected.
    assert all(seg.lent for seg in placer.segments)
    del out
    gc.collect()
    assert not any(seg.lent for seg in placer.segments)
    names = {seg.name for seg in placer.segments}
    placer.finish(True)
    again = shm.CallPlacer(pool)
    codec.encode(value, again)
    assert {seg.name for seg in again.segments} == names
    assert pool.reused == 2
    again.finish(False)  # a failed call unlinks (nobody knows whether it will be read)
    assert len(pool) == 0
    pool.close()
    assert _owned_by(os.getpid()) == []


def test_pool_trims_idle_segments_and_keeps_in_flight_ones() -> None:
    pool = shm.SegmentPool()
    busy, idle = pool.acquire(BIG), pool.acquire(BIG)
    pool.finish([idle], ok=True)
    assert pool.trim(max_idle_s=0.0) == 1
    assert idle.name not in shm.list_segments() and busy.name in shm.list_segments()
    pool.finish([busy], ok=True)
    assert pool.trim(max_idle_s=3600.0) == 1, "recently used: kept"
    pool.close()
    assert busy.name not in shm.list_segments()


def test_receivers_cache_mappings_of_pooled_segments() -> None:
    """A refilled pooled segment is read through the receiver's cached mapping (new data
    visible); mappings of segments since unlinked are dropped at the next miss."""
    codec = Codec()
    pool = shm.SegmentPool()
    shm.forget_mappings()
    placer = shm.CallPlacer(pool)
    first = codec.decode(codec.encode([np.zeros(BIG // 8)], placer), allow_shm=True)[0]
    address = first.__array_interface__["data"][0]
    del first
    placer.finish(True)
    placer = shm.CallPlacer(pool)
    second = codec.decode(codec.encode([np.ones(BIG // 8)], placer), allow_shm=True)[0]
    assert second.__array_interface__["data"][0] == address, "same mapping"
    assert (second == 1).all()
    del second
    placer.finish(True)
    assert shm.mapping_count() == 1
    pool.close()
    other = shm.SegmentPool()
    placer = shm.CallPlacer(other)
    codec.decode(codec.encode([np.ones(BIG // 8)], placer), allow_shm=True)
    assert shm.mapping_count() == 1, "the unlinked segment's mapping was dropped"
    placer.finish(True)
    other.close()
    shm.forget_mappings()


def test_a_full_dev_shm_falls_back_to_frames_with_one_warning(monkeypatch, caplog) -> None:
    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shm.Segment, "create", full)
    monkeypatch.setattr(shm.Segment, "from_array", full)
    # Private: the warning is once per process; reset so this test sees its own.
    monkeypatch.setattr(shm_segments_file, "_warned", False)
    codec = Codec()
    pool = shm.SegmentPool()
    value = [np.ones(BIG // 8), np.zeros(BIG // 8)]
    with caplog.at_level("WARNING", logger="transport.shm"):
        for placer in (shm.CallPlacer(pool), shm.StoredPlacer({})):
            frames = codec.encode(value, placer)
            assert len(frames) == 3, "both arrays went as frames"
            out = codec.decode(frames, allow_shm=True)
            assert np.array_equal(out[0], value[0]) and np.array_equal(out[1], value[1])
    assert len([r for r in caplog.records if "shared memory unavailable" in r.message]) == 1
    pool.close()


def test_handles_are_refused_unless_allowed() -> None:
    codec = Codec()
    pool = shm.SegmentPool()
    placer = shm.CallPlacer(pool)
    frames = codec.encode([np.ones(BIG // 8)], placer)
    with pytest.raises(DecodeError, match="only from processes of this host"):
        codec.decode(frames)
    placer.finish(False)
    pool.close()


def test_torch_tensors_through_shm() -> None:
    import torch  # a dependency of actorrl, never missing

    codec = Codec()
    pool = shm.SegmentPool()
    placer = shm.CallPlacer(pool)
    tensor = torch.arange(BIG // 4, dtype=torch.float32)
    out = codec.decode(codec.encode({"t": tensor}, placer), allow_shm=True)
    assert isinstance(out["t"], torch.Tensor) and torch.equal(out["t"], tensor)
    placer.finish(True)
    pool.close()


def test_allocated_arrays_are_sent_without_a_copy_and_unlinked_when_collected() -> None:
    codec = Codec()
    pool = shm.SegmentPool()
    arr = shm.empty((256, 1024), np.float64)
    arr[:] = 3.0
    name = shm.region_of(arr)[0].name
    assert name in shm.list_segments()
    placer = shm.CallPlacer(pool)
    frames = codec.encode({"a": arr, "tail": arr[128:]}, placer)
    assert placer.segments == [] and len(placer.keep) == 2, "nothing copied"
    out = codec.decode(frames, allow_shm=True)
    assert np.array_equal(out["a"], arr) and np.array_equal(out["tail"], arr[128:])
    arr[0, 0] = 5.0  # same memory: the receiver sees the producer's writes
    assert out["a"][0, 0] == 5.0
    placer.finish(True)
    del arr
    gc.collect()
    assert name not in shm.list_segments(), "unlinked once the producer's array is gone"
    assert out["a"][1, 0] == 3.0, "a receiver's mapping outlives the name"
    pool.close()


def test_stored_placer_places_each_array_once() -> None:
    codec = Codec()
    value = {"w": np.ones(BIG // 8), "b": np.zeros(10)}
    cache: dict = {}
    first = codec.encode(value, shm.StoredPlacer(cache))
    second = codec.encode(value, shm.StoredPlacer(cache))
    assert bytes(first[0]) == bytes(second[0]) and len(cache) == 1
    (_, seg), = cache.values()
    out = codec.decode(second, allow_shm=True)
    assert np.array_equal(out["w"], value["w"])
    shm.StoredPlacer.release(cache)
    assert seg.name not in shm.list_segments()
    assert out["w"].sum() == value["w"].size


def test_pooled_stored_object_lends_a_byte_per_fetcher() -> None:
    """Each fetch of a stored object holds a lent byte of its own: after the object is
    freed, its segment is reused only once every fetcher dropped what it read."""
    codec = Codec()
    pool = shm.SegmentPool()
    value = {"w": np.ones(BIG // 8)}
    cache: dict = {}
    first = codec.decode(codec.encode(value, shm.StoredPlacer(cache, pool=pool)),
                         allow_shm=True)
    second = codec.decode(codec.encode(value, shm.StoredPlacer(cache, pool=pool)),
                          allow_shm=True)
    (_, seg), = cache.values()
    assert pool.created == 1
    shm.StoredPlacer.release(cache, pool)
    assert not seg.in_flight and seg.lent
    del first
    gc.collect()
    assert seg.lent, "the second fetcher still reads it"
    assert pool.acquire(BIG) is not seg
    del second
    gc.collect()
    assert not seg.lent
    assert pool.acquire(BIG) is seg
    pool.close()


def _handle(name: str, offset: int = 0, shape: tuple[int, ...] = (16,),
            dtype: str = "<f8") -> bytes:
    record = (_SHM_HEAD.pack(len(dtype), len(shape), 0, 0, offset) + dtype.encode()
              + struct.pack(f"<{len(shape)}q", *shape) + name.encode())
    return msgpack.packb([msgpack.ExtType(EXT_SHM_ARRAY, record)])


def test_hostile_handles_are_decode_errors(tmp_path) -> None:
    codec = Codec()
    seg = shm.Segment.create(4096)
    me = seg.name.split(".")
    other_uid = ".".join([me[0], me[1], str(os.getuid() + 1), *me[3:]])
    link_name = f"{shm.PREFIX}{os.getuid()}.1.1.424242"
    os.symlink(os.path.join(shm.SHM_DIR, seg.name), os.path.join(shm.SHM_DIR, link_name))
    fake = f"{shm.PREFIX}{os.getuid()}.1.1.434343"  # right name, no header
    with open(os.path.join(shm.SHM_DIR, fake), "wb") as f:
        f.write(b"\0" * 4096)
    try:
        cases = {  # what -> (handle, the key part of its DecodeError)
            "wrong prefix": (_handle("psm_1234"), "not a shared-memory segment name"),
            "path traversal": (_handle(f"../../etc/{seg.name}"),
                               "not a shared-memory segment name"),
            "absolute path": (_handle(f"/dev/shm/{seg.name}"),
                              "not a shared-memory segment name"),
            "other uid": (_handle(other_uid), "cannot open segment"),
            "symlink": (_handle(link_name), "cannot open segment .*symbolic links"),
            "no header": (_handle(fake), "has no valid header"),
            "missing": (_handle(f"{shm.PREFIX}{os.getuid()}.1.1.999999"),
                        "cannot open segment .*No such file"),
            "too large shape": (_handle(seg.name, shape=(4096,)),
                                "handle names bytes 0..32768 of segment"),
            "offset past end": (_handle(seg.name, offset=4096),
                                "handle names bytes 4096..4224 of segment"),
            "huge offset": (_handle(seg.name, offset=2**63),
                            "handle names bytes 9223372036854775808.."),
            "negative dim": (_handle(seg.name, shape=(-1,)), "negative dimension"),
            "object dtype": (_handle(seg.name, dtype="|O"),
                             "object and structured arrays are never accepted"),
            "not ascii": (_handle(seg.name + "\xe9"), "malformed shared-memory array header"),
        }
        for what, (header, message) in cases.items():
            with pytest.raises(DecodeError, match=message):
                codec.decode([header], allow_shm=True)
                pytest.fail(what)
        assert codec.decode([_handle(seg.name, shape=(512,))], allow_shm=True)[0].size == 512
    finally:
        os.unlink(os.path.join(shm.SHM_DIR, link_name))
        os.unlink(os.path.join(shm.SHM_DIR, fake))
        seg.unlink()


def test_sweep_removes_segments_of_dead_owners_only() -> None:
    code = ("import os; from transport import shm; s = shm.Segment.create(4096); "
            "print(s.name, flush=True); os._exit(0)")  # no atexit: the segment stays
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=True)
    dead = out.stdout.strip()
    mine = shm.Segment.create(4096)
    parts = mine.name.split(".")
    reused_pid = ".".join([*parts[:3], str(int(parts[3]) + 1), "777"])  # other start time
    with open(os.path.join(shm.SHM_DIR, reused_pid), "wb") as f:
        f.write(shm.MAGIC)
    assert {dead, reused_pid} <= set(shm.list_segments())
    remove_stale_session_dirs()  # runs the sweep
    assert dead not in shm.list_segments()
    assert reused_pid not in shm.list_segments()
    assert mine.name in shm.list_segments()
    mine.unlink()


def test_env_switch(monkeypatch) -> None:
    monkeypatch.setenv("ACTORRL_SHM", "0")
    assert not shm.enabled_by_env()
    monkeypatch.setenv("ACTORRL_SHM", "1")
    assert shm.enabled_by_env()


# ---------------------------------------------------------------------------- rpc level


async def test_handles_over_tcp_are_refused(tmp_path) -> None:
    """Over tcp nothing changes: a client never marks its requests local, and a request
    marked local that arrives over tcp may not name segments."""
    def handler(request):
        request.reply([len(request.args), request.local])

    server = RpcServer(handler)
    tcp = server.bind("tcp://127.0.0.1:0")
    ipc = server.bind(f"ipc://{tmp_path}/s.sock")
    server.start()
    pool = shm.SegmentPool()
    tcp_client = RpcClient(tcp, shm=True)
    ipc_client = RpcClient(ipc, shm=True)
    try:
        assert not tcp_client.local and ipc_client.local
        assert await wait_for(tcp_client.call("m", [1]), 10) == [1, False]
        assert await wait_for(ipc_client.call("m", [1]), 10) == [1, True]
        placer = shm.CallPlacer(pool)
        frames = server.codec.encode(["m", [np.ones(BIG // 8)], {}], placer)
        # forge a local request id over tcp
        # Private: a hostile tcp peer forging the local-request bit in its request ids;
        # the client sets that bit only over ipc.
        tcp_client._id_flag = LOCAL_ID_BIT
        with pytest.raises(rt.RemoteError, match="only from processes of this host"):
            await wait_for(tcp_client.call_encoded(frames, placer=placer), 10)
        placer = shm.CallPlacer(pool)
        frames = server.codec.encode(["m", [np.ones(BIG // 8)], {}], placer)
        assert await wait_for(ipc_client.call_encoded(frames, placer=placer), 10) == [1, True]
        assert server.shm_bytes_received == BIG
    finally:
        tcp_client.close()
        ipc_client.close()
        server.close()
        pool.close()


# ---------------------------------------------------------------------------- runtime level


async def test_calls_and_fetches_through_shm_and_their_lifetimes(tmp_path) -> None:
    async with Driver.start(str(tmp_path / "s")) as driver:
        runtime = driver.runtime
        assert runtime.shm
        peer = await driver.create_actor("tests.test_shm:ShmPeer", timeout_s=60)
        value = {f"c{i}": np.random.default_rng(i).random(BIG // 8) for i in range(4)}
        client = runtime.client(peer.endpoint)
        sent = client.bytes_sent
        total = await driver.get(peer.keep.remote(value), timeout_s=30)
        assert total == pytest.approx(sum(v.sum() for v in value.values()))
        assert client.bytes_sent - sent < 4096, "the call carried handles, not the data"
        assert await driver.get(peer.received_shm_bytes.remote(), timeout_s=30) >= 4 * BIG
        pool = runtime.shm_pool
        assert len(pool) == 4 and pool.nbytes >= 4 * BIG

        # Small arrays are untouched by shm.
        assert await driver.get(peer.keep.remote({"s": np.ones(100)}), timeout_s=30) == 100
        # The actor dropped the big value: the next big call reuses the segments.
        await driver.get(peer.keep.remote(value), timeout_s=30)
        assert pool.reused == 4 and len(pool) == 4
        await driver.get(peer.drop.remote(), timeout_s=30)

        # A result kept by its owner and fetched through a segment of its pool.
        pid = driver.node.process_of(peer).pid
        ref = peer.make.remote(BIG)
        received = client.bytes_received
        got = await driver.get(ref, timeout_s=30)
        assert np.array_equal(got["a"], np.arange(BIG // 8, dtype=np.float64))
        assert client.bytes_received - client.shm_bytes_received - received < 4096
        assert len(_owned_by(pid)) == 1
        # What the actor put, fetched the same way.
        [put_ref] = await driver.get(peer.put_big.remote(BIG), timeout_s=30)
        assert (await driver.get(put_ref, timeout_s=30) == 7.0).all()
        assert len(_owned_by(pid)) == 2
        # Freed objects hand their segments back to the owner's pool (the free goes
        # before the next call); one whose data a fetcher still reads is not reused.
        driver.free([ref, put_ref])  # drops put_ref's cached value: that segment is free
        await asyncio.sleep(0)  # the batched free is sent (a queued callback) before...
        await driver.get(peer.drop.remote(), timeout_s=30)  # ...this call, on that socket
        third = await driver.get(peer.make_full.remote(BIG, 5.0), timeout_s=30)
        assert (third == 5.0).all()
        assert len(_owned_by(pid)) == 2, "the free segment was reused"
        assert got["a"][-1] == BIG // 8 - 1, "the held one was not overwritten"
        assert len(_owned_by(os.getpid())) == 4  # the driver's pool, until it closes
    assert _owned_by(os.getpid()) == []


async def test_shm_off(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ACTORRL_SHM", "0")
    async with Driver.start(str(tmp_path / "s")) as driver:
        assert not driver.runtime.shm and driver.runtime.shm_pool is None
        peer = await driver.create_actor("tests.test_shm:ShmPeer", timeout_s=60)
        value = {"a": np.ones(BIG // 8)}
        client = driver.runtime.client(peer.endpoint)
        sent = client.bytes_sent
        assert await driver.get(peer.keep.remote(value), timeout_s=30) == BIG // 8
        assert client.bytes_sent - sent >= BIG, "the data went as ZeroMQ frames"
        got = await driver.get(peer.make.remote(BIG), timeout_s=30)
        assert got["a"].nbytes == BIG and client.shm_bytes_received == 0
        assert _owned_by(os.getpid()) == []


async def test_runtime_parameters(tmp_path, monkeypatch) -> None:
    runtime = Runtime(asyncio.get_running_loop(), str(tmp_path), "x", shm=False)
    try:
        assert not runtime.shm and runtime.shm_pool is None
        assert not runtime.shm_to(runtime.address)
    finally:
        runtime.close()
    monkeypatch.setenv("ACTORRL_SHM_THRESHOLD", "1000000")
    runtime = Runtime(asyncio.get_running_loop(), str(tmp_path), "y")
    try:
        assert runtime.shm and runtime.shm_threshold == 1_000_000
        assert runtime.shm_to(runtime.address)
    finally:
        runtime.close()
    runtime = Runtime(asyncio.get_running_loop(), str(tmp_path), "z", shm_threshold=4096)
    assert runtime.shm_threshold == 4096
    runtime.close()


async def _death_reported(driver: Driver) -> asyncio.Event:
    died = asyncio.Event()
    driver.node.on_death.append(lambda _actor_id, _reason: died.set())
    return died


async def test_kill_9_of_owner_and_of_caller_mid_call_leaves_no_segment(tmp_path) -> None:
    async with Driver.start(str(tmp_path / "s")) as driver:
        owner, caller, callee = await asyncio.gather(*(
            driver.create_actor("tests.test_shm:ShmPeer", timeout_s=60) for _ in range(3)))
        # The owner keeps objects others fetched through its segments.
        ref = owner.make.remote(BIG)
        [put_ref] = await driver.get(owner.put_big.remote(BIG), timeout_s=30)
        await driver.get([ref, put_ref], timeout_s=30)
        owner_pid = driver.node.process_of(owner).pid
        assert len(_owned_by(owner_pid)) == 2
        died = await _death_reported(driver)
        os.kill(owner_pid, signal.SIGKILL)
        await wait_for(died.wait(), 30)
        assert _owned_by(owner_pid) == []

        # The caller is killed while its call (big arguments in its segments) runs.
        hang = caller.send_and_hang.remote(callee, BIG)
        await driver.get(callee.wait_holds.remote(1), timeout_s=30)
        caller_pid = driver.node.process_of(caller).pid
        assert len(_owned_by(caller_pid)) == 1
        died.clear()
        os.kill(caller_pid, signal.SIGKILL)
        await wait_for(died.wait(), 30)
        assert _owned_by(caller_pid) == []
        with pytest.raises(rt.ActorDiedError, match=" died: "):
            await driver.get(hang, timeout_s=30)

        # The callee is killed mid-call with the driver's segments: the driver unlinks
        # them when the call fails.
        hold = callee.hold.remote({"x": np.ones(BIG // 8)})
        await driver.get(callee.wait_holds.remote(2), timeout_s=30)
        assert len(_owned_by(os.getpid())) == 1
        died.clear()
        os.kill(driver.node.process_of(callee).pid, signal.SIGKILL)
        await wait_for(died.wait(), 30)
        with pytest.raises(rt.ActorDiedError, match=" died: "):
            await driver.get(hold, timeout_s=30)
        assert _owned_by(os.getpid()) == []
