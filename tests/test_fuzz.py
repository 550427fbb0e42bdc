"""Fuzzing the wire as a hostile local peer would (issue #13): raw ZeroMQ sockets and raw TCP
against a keyless runtime server that also serves the ``coord.*`` protocol (a child
process running a :class:`~actorrl.runtime.Driver` and a
:class:`~actorrl.runtime.cluster.coordinator.Coordinator`) and against its actor (a grandchild).

Every phase is bounded in count and time (the module takes well under a minute on two busy
cores). After each one, a legitimate call to the server and to the actor must answer
within 1 s, both processes must be alive, and their fd counts and RSS must be back near
their baselines. A property test checks that mutated valid encodings make ``decode``
raise nothing but :class:`~transport.codec.DecodeError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorrl.runtime.process.runtime import check_request
from actorrl.runtime.wire_version import WIRE_VERSION
from tests.helpers.procs import NO_TORCH_PRELOAD, ready_line, start_python, terminate
from tests.helpers.wire import PREFIX, colliding_key_map
from tests.helpers.wire import collect_replies as raw_collect_replies
from transport.codec import EXT_ARRAY, EXT_TENSOR, Codec, DecodeError
from transport.errors import PeerLostError, RemoteError
from transport.rpc import KIND_ERROR, KIND_NOTIFY, KIND_OK, KIND_REQUEST, RpcClient, RpcServer

REPO = Path(__file__).resolve().parent.parent
LEGIT_S = 30.0
"""Deadline of a legitimate call after every phase: a stalled or dead server misses it
(a deadline, not a speed check: speed is measured in benchmarks/)."""
REPLY_S = 10.0  # bound on waiting for the reply to a hostile request
FD_SLACK = 16  # fds above baseline tolerated once settled
RSS_SLACK = 96 << 20  # bytes of RSS above baseline tolerated
SETTLE_S = 10.0  # bound on waiting for fds/RSS to come back
NO_TORCH = NO_TORCH_PRELOAD  # the targets' only actor is a test Counter

TARGET_SRC = r"""
import asyncio, json, os, sys
from actorrl.runtime import Driver
from actorrl.runtime.cluster.coordinator import Coordinator


async def main():
    async with Driver.start(sys.argv[1]) as driver:
        Coordinator(driver.runtime).serve()
        server = driver.runtime.server
        tcp = server.bind("tcp://127.0.0.1:0")
        server_stats = lambda r: r.reply({"peers": server.peers,
                                          "dropped": server.messages_dropped})
        driver.runtime.serve("fuzz.stats", server_stats)
        actor = await driver.create_actor("tests.actors.basic:Counter")
        actor_pid = await driver.get(actor.pid.remote(), timeout_s=60)
        print("READY " + json.dumps({"ipc": driver.runtime.local_address, "tcp": tcp,
                                     "actor": actor.endpoint, "actor_pid": actor_pid}),
              flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(0, stop.set)  # stdin closed: stop
        await stop.wait()


asyncio.run(main())
"""


# ---------------------------------------------------------------------------- the target
class Target:
    """The child process (runtime server + coordinator) and its actor."""

    def __init__(self, directory: Path) -> None:
        self.log_path = directory / "target.log"
        self.proc = start_python(["-c", TARGET_SRC, str(directory / "s")], self.log_path,
                                 env=NO_TORCH)
        line = ready_line(self.proc, self.proc.stdout, "READY ", 90, self.log_path)
        info = json.loads(line[len("READY "):])
        self.ipc: str = info["ipc"]
        self.tcp: str = info["tcp"]
        self.actor: str = info["actor"]
        self.pids = {"server": self.proc.pid, "actor": int(info["actor_pid"])}
        self.baseline: dict[str, tuple[int, int]] = {}

    def log_tail(self) -> str:
        """The end of the child's stderr."""
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Close the child's stdin (it shuts its driver down), kill it past a deadline."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.proc.stdout.close()


def fds_and_rss(pid: int) -> tuple[int, int]:
    """Open file descriptors and resident bytes of ``pid``."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return fds, rss


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """One target for the module; it must survive every phase and exit cleanly."""
    directory = Path(os.environ.get("TMPDIR", "/tmp")) / f"arl-fuzz-{os.getpid()}"
    directory.mkdir(exist_ok=True)  # short: ipc paths are limited to ~107 bytes
    tgt = Target(directory)
    yield tgt
    alive = tgt.proc.poll() is None
    tgt.stop()
    log = tgt.log_path.read_text(errors="replace")
    shutil.rmtree(directory, ignore_errors=True)
    assert alive, f"the target died during the fuzzing:\n{log[-4000:]}"
    # Refusals are logged as one-line warnings; a traceback means a handler raised.
    at = log.find("Traceback")
    assert at < 0, f"an exception escaped a handler:\n{log[max(0, at - 500):at + 3000]}"


@pytest.fixture(scope="module")
def attacker() -> Iterator[zmq.Context]:
    """A ZeroMQ context of its own for the hostile sockets."""
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A raw DEALER connected to ``endpoint``."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, int(REPLY_S * 1000))
    sock.connect(endpoint)
    return sock


_ids = iter(range(10**12, 10**13))
_codec = Codec()


def request(method: Any, args: Any, kwargs: Any = None,
            kind: int = KIND_REQUEST) -> tuple[int, list[Any]]:
    """A request id and its frames (fields of any type: the codec encodes what it is given)."""
    request_id = next(_ids)
    body = _codec.encode([method, args, {} if kwargs is None else kwargs])
    return request_id, [PREFIX.pack(kind, request_id), *body]


def collect_replies(sock: zmq.Socket, ids: set[int], timeout_s: float = REPLY_S,
                    names: dict[int, str] | None = None) -> dict[int, tuple[int, Any]]:
    """:func:`tests.helpers.wire.collect_replies` with this module's reply deadline."""
    return raw_collect_replies(sock, ids, timeout_s, names)


async def healthy(target: Target, phase: str) -> None:
    """A legitimate call to the server and one to the actor answer within 1 s; both
    processes live; their fds and RSS come back near the baseline (the first call sets
    it)."""
    for name, pid in target.pids.items():
        assert os.path.exists(f"/proc/{pid}"), f"{name} died in phase {phase}\n" \
            + target.log_tail()
    server = RpcClient(target.tcp, connect_timeout_s=LEGIT_S * 5)
    actor = RpcClient(target.actor, connect_timeout_s=LEGIT_S * 5)
    try:
        status = await server.call("coord.status", timeout_s=LEGIT_S)
        assert isinstance(status, dict), status
        object_id = os.urandom(16)
        done = await actor.call("__call__", [object_id, "noop", [], {}], timeout_s=LEGIT_S)
        assert done[0] == 0 and done[2] is None, done
        actor.notify("__free__", [[object_id]])
        assert await actor.call("__ping__", timeout_s=LEGIT_S)
    finally:
        server.close()
        actor.close()
    await settled(target.pids, target.baseline, phase)


async def settled(pids: dict[str, int], baseline: dict[str, tuple[int, int]], phase: str
                  ) -> None:
    """Wait until the fds and RSS of ``pids`` are back near ``baseline`` (filled with the
    current ones when empty); fail after :data:`SETTLE_S`."""
    if not baseline:
        baseline.update({name: fds_and_rss(pid) for name, pid in pids.items()})
        return
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while True:  # libzmq closes connections and fds on its own threads: bounded wait
        now = {name: fds_and_rss(pid) for name, pid in pids.items()}
        over = {name: (now[name], baseline[name]) for name in now
                if now[name][0] > baseline[name][0] + FD_SLACK
                or now[name][1] > baseline[name][1] + RSS_SLACK}
        if not over:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"after phase {phase}: (fds, rss) now vs baseline {over}")
        await asyncio.sleep(0.05)


def send_all(sock: zmq.Socket, messages: list[list[Any]]) -> None:
    """Send each message (multipart) on ``sock``."""
    for frames in messages:
        sock.send_multipart(frames, copy=False)


# ---------------------------------------------------------------------------- phases
async def test_baseline(target: Target) -> None:
    """The target answers legitimate calls; the fd/RSS baseline is taken here."""
    await healthy(target, "baseline")
    await healthy(target, "baseline again")


def _random_messages(rng: random.Random, count: int) -> list[list[bytes]]:
    messages = []
    for _ in range(count):
        frames = [rng.randbytes(rng.choice((0, 1, 8, 9, 30, 300))) for _ in
                  range(rng.randint(1, 5))]
        if rng.random() < 0.5:  # a valid prefix, so the body reaches the decoder
            frames[0] = PREFIX.pack(rng.choice((KIND_REQUEST, KIND_NOTIFY, 0, 7)),
                                    rng.getrandbits(64))
        messages.append(frames)
    return messages


async def test_random_bytes_and_frames(target: Target, attacker: zmq.Context) -> None:
    """600 random multipart messages, some with valid prefixes, to server and actor."""
    rng = random.Random(13)
    for endpoint in (target.tcp, target.actor):
        sock = dealer(attacker, endpoint)
        try:
            send_all(sock, _random_messages(rng, 300))
        finally:
            sock.close(linger=0)
    await healthy(target, "random bytes")


def _valid_headers() -> list[bytes]:
    return [_codec.encode(v)[0] for v in (
        ["coord.status", [], {}], ["__call__", [b"x" * 16, "add", [1], {"k": [1.5, None]}], {}],
        {"a": [1, 2, {"b": b"\x00" * 40}]}, np.arange(12, dtype=np.float32))]


def _malformed_headers(rng: random.Random, count: int) -> list[bytes]:
    out = []
    valid = _valid_headers()
    for _ in range(count):
        header = bytearray(rng.choice(valid))
        op = rng.randrange(4)
        if op == 0:
            del header[rng.randrange(len(header)):]
        elif op == 1:
            for _ in range(rng.randint(1, 4)):
                header[rng.randrange(len(header))] = rng.randrange(256)
        elif op == 2:
            pos = rng.randrange(len(header) + 1)
            header[pos:pos] = rng.randbytes(rng.randint(1, 9))
        else:
            header += rng.randbytes(rng.randint(1, 9))
        out.append(bytes(header))
    return out


def _crafted_headers() -> list[bytes]:
    dtype = b"<f4"
    huge_shape = struct.pack("<BBBi", len(dtype), 2, 0, -1) + dtype + struct.pack(
        "<2q", 2**40, 2**40)
    return [
        b"\xdf\xff\xff\xff\xff",  # a map announcing 4 billion pairs
        b"\xdd\xff\xff\xff\xff",  # an array announcing 4 billion items
        b"\xdb\xff\xff\xff\xff",  # a str announcing 4 GiB
        b"\x91" * 100_000 + b"\xc0",  # 100k nested arrays
        b"\x81\x91" * 20_000 + b"\xc0",  # nested maps with list keys
        msgpack.packb(msgpack.ExtType(EXT_ARRAY, huge_shape)),
        msgpack.packb(msgpack.ExtType(EXT_ARRAY, b"\xff" * 7)),
        msgpack.packb(msgpack.ExtType(99, b"")),
        msgpack.packb({"\x00actorrl.type": "no.such.type", "v": 1}),
        msgpack.packb({"\x00actorrl.type": "actorrl.data.batch.SampleBatch", "v": [1, 2]}),
        colliding_key_map(20_000),
        msgpack.packb([colliding_key_map(2_000)] * 8),
    ]


@pytest.mark.parametrize("which", ["server", "actor"])
async def test_malformed_and_crafted_msgpack_is_answered(target: Target, attacker: zmq.Context,
                                                          which: str) -> None:
    """Mutated valid headers, collision maps, deep nesting, absurd lengths and bad array
    headers, each as a request: every one is answered (ok or error)."""
    rng = random.Random(7)
    sock = dealer(attacker, target.tcp if which == "server" else target.actor)
    try:
        ids = set()
        for header in [*_malformed_headers(rng, 200), *_crafted_headers()]:
            request_id = next(_ids)
            ids.add(request_id)
            sock.send_multipart([PREFIX.pack(KIND_REQUEST, request_id), header])
        collect_replies(sock, ids)  # within its deadline; decode cost: benchmarks/
    finally:
        sock.close(linger=0)
    await healthy(target, f"malformed msgpack to the {which}")


BAD = [None, True, 1.5, -1, 2**63, "", "x" * 5000, b"\xff" * 3, [], [[[]]], {}, {1: 2},
       {"k": None}, np.zeros(3, np.float32)]
RUNTIME_SHAPES: dict[str, list[Any]] = {
    "__call__": [b"\x01" * 16, "noop", [], {}],
    "__fetch__": [b"\x02" * 16, False],
    "__wait__": [b"\x03" * 16],
    "__free__": [[b"\x04" * 16]],
}
COORD_SHAPES: dict[str, list[Any]] = {
    "coord.register_node": ["n", "name", "bogus://x", "127.0.0.1", 1.0, 0.0],
    "coord.actor_died": ["n", "a", "reason"],
    "coord.create_actor": ["session", ["no.such:Thing"]],
    "coord.kill_actor": ["session", "a"],
    "coord.close_session": ["no-such-session"],
    "coord.wait_nodes": [10**6, 0.05],
    "coord.wait_actor": ["nobody", None, [], 0.05],
    "coord.actor_log": ["a", 100],
    "coord.heartbeat": ["n"],
    "coord.session_ping": ["s"],
    "coord.actors": [None],
}


def _well_formed(method: str, args: Any) -> bool:
    try:
        check_request(method, args)
    except (ValueError, TypeError):
        return False
    return True


def _bad_field_requests(shapes: dict[str, list[Any]], rng: random.Random
                        ) -> list[tuple[int, list[Any], str]]:
    """Each method with each field replaced by bad values, plus too few/many fields, bad
    containers and bad keyword maps."""
    out = []

    def add(method: Any, args: Any, kwargs: Any = None) -> None:
        if method in ("__fetch__", "__wait__", "__free__") and _well_formed(method, args):
            return  # waits for the object by design (or is a notification): no reply yet
        try:
            request_id, frames = request(method, args, kwargs)
        except Exception:  # a value the codec refuses to send: not a wire case
            return
        out.append((request_id, frames, f"{method!r}{args!r:.80}"))

    for method, args in shapes.items():
        for position in range(len(args)):
            for bad in rng.sample(BAD, 5):
                if method in ("coord.wait_nodes", "coord.wait_actor") and \
                        position == len(args) - 1:
                    continue  # their last field is a timeout: keep every wait short
                if method == "__wait__" and isinstance(bad, bytes):
                    continue  # a well-formed id of an object that never comes: waits
                fields = list(args)
                fields[position] = bad
                add(method, fields)
        if method not in ("coord.wait_nodes", "coord.wait_actor"):  # a default timeout
            add(method, args[:-1])
        add(method, [*args, None])
        add(method, {"not": "a list"})
        add(method, args, {1: 2})
        add(method, args, {"unexpected": True})
    for bad in BAD[:6]:
        add(bad, [])
    return out


LENIENT = ("'__call__'", "'coord.actor_died'", "'coord.actors'", "'coord.close_session'",
           "'coord.heartbeat'", "'coord.kill_actor'", "'coord.session_ping'",
           "'coord.wait_actor'", "'coord.wait_nodes'")
"""Requests that may be answered as valid with a bad field: the actor's ``noop`` takes any
arguments; the others look up ids or filters that match nothing and say so (``False``,
``known: False``, no actors, no nodes) instead of failing, so a peer learns nothing from
the difference."""


async def test_bad_field_types_are_answered(target: Target, attacker: zmq.Context) -> None:
    """Every runtime-protocol and ``coord.*`` request with a field of the wrong type (or
    the wrong count) is answered; all but the lookups in :data:`LENIENT` with an error;
    nothing is left pending."""
    rng = random.Random(3)
    for endpoint, shapes in ((target.actor, RUNTIME_SHAPES),
                             (target.tcp, {**RUNTIME_SHAPES, **COORD_SHAPES})):
        sock = dealer(attacker, endpoint)
        try:
            cases = _bad_field_requests(shapes, rng)
            send_all(sock, [frames for _, frames, _ in cases])
            replies = collect_replies(sock, {rid for rid, _, _ in cases},
                                      names={rid: name for rid, _, name in cases})
        finally:
            sock.close(linger=0)
        answered_ok = sorted(name for rid, _, name in cases
                             if replies[rid][0] != KIND_ERROR)
        unexpected = [name for name in answered_ok if not name.startswith(LENIENT)]
        assert not unexpected, f"hostile requests answered as if valid: {unexpected}"
    await healthy(target, "bad field types")


async def test_failed_register_node_connects_leak_nothing(target: Target,
                                                          attacker: zmq.Context) -> None:
    """300 ``coord.register_node`` calls with endpoints that cannot be connected are
    refused; the server's fds come back (each used to leak two)."""
    sock = dealer(attacker, target.tcp)
    try:
        cases = [request("coord.register_node",
                         [f"n{i}", "x", endpoint, "127.0.0.1", 1, 0, WIRE_VERSION])
                 for i, endpoint in zip(range(300), ["bogus://x", "tcp://127.0.0.1:notaport",
                                                     "ipc://" + "x" * 200] * 100, strict=False)]
        send_all(sock, [frames for _, frames in cases])
        replies = collect_replies(sock, {rid for rid, _ in cases})
    finally:
        sock.close(linger=0)
    assert all(kind == KIND_ERROR for kind, _ in replies.values())
    await healthy(target, "failed register_node connects")


async def test_oversized_reports_and_headers_are_refused(target: Target,
                                                         attacker: zmq.Context) -> None:
    """A header over the 1 MiB cap and 50 death reports of 900 KB each: refused or
    truncated, nothing kept."""
    sock = dealer(attacker, target.tcp)
    try:
        big = request("coord.status", [b"x" * (2 << 20)])
        reports = [request("coord.actor_died", ["no-such-node", f"a{i}", "r" * (900 << 10)])
                   for i in range(50)]
        send_all(sock, [big[1], *[frames for _, frames in reports]])
        replies = collect_replies(sock, {big[0], *(rid for rid, _ in reports)})
    finally:
        sock.close(linger=0)
    assert replies[big[0]][0] == KIND_ERROR and "exceeds" in str(replies[big[0]][1])
    assert all(replies[rid] == (KIND_OK, False) for rid, _ in reports)
    await healthy(target, "oversized reports")


def _zmtp_greeting(mechanism: bytes = b"NULL") -> bytes:
    return (b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\x00")
            + b"\x00" + b"\x00" * 31)


def _stream_until_dropped(address: tuple[str, int], head: bytes, total: int) -> int:
    """Send ``head`` then up to ``total`` zero bytes on a raw TCP connection; returns how
    many were accepted before the peer closed it."""
    sent = 0
    with socket.create_connection(address, timeout=REPLY_S) as conn:
        conn.sendall(head)
        chunk = b"\x00" * (1 << 20)
        try:
            while sent < total:
                sent += conn.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    return sent


async def test_frames_over_the_socket_cap_are_dropped_unbuffered(target: Target) -> None:
    """A frame announced larger than ``ZMQ_MAXMSGSIZE`` (here 3 GiB, after a NULL
    greeting, as the first command: before any handshake or authentication) gets the
    connection closed when its size is read: the server cannot be made to buffer it
    (without the cap the 256 MB sent here were kept in the server's memory)."""
    host, port = target.tcp.removeprefix("tcp://").rsplit(":", 1)
    frame_head = b"\x06" + struct.pack(">Q", 3 << 30)  # long command frame of 3 GiB
    before = fds_and_rss(target.pids["server"])[1]
    sent = await asyncio.to_thread(_stream_until_dropped, (host, int(port)),
                                   _zmtp_greeting() + frame_head, 256 << 20)
    assert sent < 64 << 20, f"the server read {sent} bytes of an oversize frame"
    assert fds_and_rss(target.pids["server"])[1] < before + (32 << 20)
    await healthy(target, "oversize frames")


async def test_many_connections_come_and_go(target: Target, attacker: zmq.Context) -> None:
    """200 ZeroMQ peers that each call once, and 200 raw TCP connections that never
    handshake, opened together and closed: fds and the server's peer count return."""
    probe = RpcClient(target.tcp, connect_timeout_s=5)
    try:
        peers_before = (await probe.call("fuzz.stats", timeout_s=LEGIT_S))["peers"]
        host, port = target.tcp.removeprefix("tcp://").rsplit(":", 1)
        raw = [socket.create_connection((host, int(port)), timeout=REPLY_S)
               for _ in range(200)]
        socks = [dealer(attacker, target.tcp) for _ in range(200)]
        try:
            pings = [request("__ping__", []) for _ in socks]
            for sock, (_, frames) in zip(socks, pings, strict=True):
                sock.send_multipart(frames)
            for sock, (request_id, _) in zip(socks, pings, strict=True):
                collect_replies(sock, {request_id})
            during = (await probe.call("fuzz.stats", timeout_s=LEGIT_S))["peers"]
            assert during >= peers_before + 200, (peers_before, during)
        finally:
            for sock in socks:
                sock.close(linger=0)
            for conn in raw:
                conn.close()
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while (peers := (await probe.call("fuzz.stats", timeout_s=LEGIT_S))["peers"]) \
                > peers_before:
            assert asyncio.get_running_loop().time() < deadline, (peers_before, peers)
            await asyncio.sleep(0.05)
    finally:
        probe.close()
    await healthy(target, "many connections")


async def test_the_coordinator_never_loads_torch(target: Target, attacker: zmq.Context
                                                 ) -> None:
    """After every phase above, and a tensor-typed argument sent to each ``coord.*``
    method, the coordinator's process has not mapped libtorch."""
    head = struct.pack("<BBBi", 3, 1, 0, -1) + b"<f4" + struct.pack("<q", 2)
    tensor = msgpack.ExtType(EXT_TENSOR, head + b"\0" * 8)
    sock = dealer(attacker, target.tcp)
    try:
        cases = []
        for method in COORD_SHAPES:
            request_id = next(_ids)
            header = msgpack.packb([method, [tensor], {}])
            cases.append((request_id, [PREFIX.pack(KIND_REQUEST, request_id), header]))
        send_all(sock, [frames for _, frames in cases])
        replies = collect_replies(sock, {request_id for request_id, _ in cases})
    finally:
        sock.close(linger=0)
    assert len(replies) == len(cases)
    maps = Path(f"/proc/{target.pids['server']}/maps").read_text()
    assert "libtorch" not in maps
    import torch  # noqa: F401 - the marker is right: a process that imported torch maps it

    assert "libtorch" in Path("/proc/self/maps").read_text()
    await healthy(target, "tensor arguments")


# ---------------------------------------------------------------------------- keyed cluster
KEYED_MAX_PEERS = 40
"""The keyed coordinator's peer cap (``--max-peers``): small, so a CI-sized flood passes
it."""


def _start_cli(args: list[str], log_path: Path, ready: str, timeout_s: float = 90,
               env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``python -m actorrl.cli.cluster ARGS`` (``env``: variables set for it) and
    wait for a stdout line starting with ``ready``; returns the process and that line."""
    proc = start_python(["-m", "actorrl.cli.cluster", *args], log_path,
                        stdin=subprocess.DEVNULL, env=env)
    try:
        line = ready_line(proc, proc.stdout, ready, timeout_s, log_path)
    except AssertionError:
        proc.stdout.close()
        raise
    return proc, line


class KeyedTarget:
    """A CURVE-keyed coordinator (``actorrl coordinator start --keys``, peer cap
    :data:`KEYED_MAX_PEERS`) and a node agent joined to it (``actorrl node join``)."""

    def __init__(self, directory: Path) -> None:
        from transport.auth import generate_keys, load_keypair, load_public_key

        self.dir = directory
        self.keys = str(directory / "keys")
        generate_keys(self.keys)
        self.coord_public = load_public_key(self.keys, "coordinator")
        client = load_keypair(self.keys, "client")
        coord = load_keypair(self.keys, "coordinator")
        self.client_keys = (self.coord_public, client.public, client.secret)
        self.coord_pair = coord
        self.procs: list[subprocess.Popen] = []
        self.coordinator, line = _start_cli(
            ["coordinator", "start", "--bind", "tcp://127.0.0.1:0", "--keys", self.keys,
             "--state-dir", str(directory / "state"), "--max-peers", str(KEYED_MAX_PEERS)],
            directory / "coordinator.log", "coordinator listening at ")
        self.procs.append(self.coordinator)
        self.tcp = line.split()[-1]
        self.node, _ = _start_cli(
            ["node", "join", self.tcp, "--keys", self.keys, "--host", "127.0.0.1",
             "--name", "fuzzed", "--cpus", "1", "--gpus", "0", "--session-dir",
             str(directory / "n")], directory / "node.log", "node fuzzed joined",
            env=NO_TORCH)
        self.procs.append(self.node)
        self.pids = {"coordinator": self.coordinator.pid, "node": self.node.pid}
        self.node_tcp = ""
        self.node_key = b""
        self.baseline: dict[str, tuple[int, int]] = {}

    def log(self, name: str) -> str:
        """A process's log (``coordinator`` or ``node``)."""
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM both (the node leaves first), kill past a deadline."""
        for proc in reversed(self.procs):
            terminate(proc)
            proc.stdout.close()


@pytest.fixture(scope="module")
def keyed() -> Iterator[KeyedTarget]:
    """One keyed coordinator and joined node for the keyed phases; both must survive."""
    directory = Path(os.environ.get("TMPDIR", "/tmp")) / f"arl-kfuzz-{os.getpid()}"
    directory.mkdir(exist_ok=True)
    tgt = KeyedTarget(directory)
    try:
        asyncio.run(keyed_healthy(tgt, "start"))  # the node's endpoint and the baselines
        yield tgt
        alive = {name: proc.poll() is None for name, proc in
                 (("coordinator", tgt.coordinator), ("node", tgt.node))}
    finally:
        tgt.stop()
    logs = {name: tgt.log(name) for name in ("coordinator", "node")}
    shutil.rmtree(directory, ignore_errors=True)
    assert all(alive.values()), f"died during the fuzzing: {alive}\n{logs}"
    for name, text in logs.items():
        at = text.find("Traceback")
        assert at < 0, f"{name}: an exception escaped:\n{text[max(0, at - 500):at + 3000]}"


async def keyed_healthy(tgt: KeyedTarget, phase: str) -> None:
    """A legitimate client call to the coordinator and a coordinator-key call to the node
    answer (within :data:`LEGIT_S`); the node is still joined (never declared lost); fds and RSS of
    both are back near their baselines (the first call sets them)."""
    for name, pid in tgt.pids.items():
        assert os.path.exists(f"/proc/{pid}"), f"{name} died in phase {phase}"
    client = RpcClient(tgt.tcp, curve_keys=tgt.client_keys, connect_timeout_s=LEGIT_S * 5)
    try:
        status = await client.call("coord.status", timeout_s=LEGIT_S)
    finally:
        client.close()
    assert [n["name"] for n in status["nodes"]] == ["fuzzed"], status
    assert status["lost_nodes"] == [], status["lost_nodes"]
    if not tgt.node_tcp:
        from transport.endpoint import Endpoint

        endpoint = Endpoint.parse(status["nodes"][0]["endpoint"])
        tgt.node_tcp, tgt.node_key = endpoint.address, endpoint.server_key or b""
    node = RpcClient(tgt.node_tcp, curve_keys=(tgt.node_key, tgt.coord_pair.public,
                                               tgt.coord_pair.secret),
                     connect_timeout_s=LEGIT_S * 5)
    try:
        info = await node.call("node.info", timeout_s=LEGIT_S)
        assert info["name"] == "fuzzed", info
    finally:
        node.close()
    await settled(tgt.pids, tgt.baseline, phase)


async def test_keyed_baseline(keyed: KeyedTarget) -> None:
    """The keyed coordinator and its node answer legitimate calls; baselines taken."""
    await keyed_healthy(keyed, "keyed baseline")
    await keyed_healthy(keyed, "keyed baseline again")


def _raw_garbage(endpoint: str, rng: random.Random, count: int) -> None:
    """``count`` raw TCP connections each sending random bytes (some after a valid ZMTP
    greeting for CURVE or NULL), then closing."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    for i in range(count):
        head = [b"", _zmtp_greeting(b"CURVE"), _zmtp_greeting()][i % 3]
        with socket.create_connection((host, int(port)), timeout=REPLY_S) as conn, \
                contextlib.suppress(OSError):
            conn.sendall(head + rng.randbytes(rng.randrange(1, 4096)))


async def test_keyed_unauthenticated_garbage_gets_nothing(keyed: KeyedTarget,
                                                          attacker: zmq.Context) -> None:
    """Raw garbage, keyless ZeroMQ peers and peers with unknown CURVE keys, against the
    coordinator and the node: no request reaches a handler, no reply comes back, both
    keep serving."""
    await keyed_healthy(keyed, "keyed start")
    rng = random.Random(13)
    for endpoint in (keyed.tcp, keyed.node_tcp):
        await asyncio.to_thread(_raw_garbage, endpoint, rng, 30)
        stranger_public, stranger_secret = zmq.curve_keypair()
        server_key = keyed.coord_public if endpoint == keyed.tcp else keyed.node_key
        socks = []
        for keys in (None, (server_key, stranger_public, stranger_secret)):
            for _ in range(5):
                sock = attacker.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                if keys is not None:
                    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys
                sock.connect(endpoint)
                socks.append(sock)
                for method in ("coord.status", "node.start_actor", "__call__"):
                    _, frames = request(method, [])
                    with contextlib.suppress(zmq.Again):
                        sock.send_multipart(frames, zmq.NOBLOCK)
        try:
            poller = zmq.Poller()
            for sock in socks:
                poller.register(sock, zmq.POLLIN)
            assert poller.poll(500) == [], "an unauthenticated peer got a reply"
        finally:
            for sock in socks:
                sock.close(linger=0)
    await keyed_healthy(keyed, "keyed garbage")


async def test_keyed_oversize_frames_before_auth_are_dropped(keyed: KeyedTarget) -> None:
    """A 3 GiB frame announced right after a CURVE greeting (before any authentication)
    to the coordinator and the node: the connection is closed when its size is read, and
    neither buffers it."""
    frame_head = b"\x06" + struct.pack(">Q", 3 << 30)
    for endpoint, name in ((keyed.tcp, "coordinator"), (keyed.node_tcp, "node")):
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        before = fds_and_rss(keyed.pids[name])[1]
        sent = await asyncio.to_thread(_stream_until_dropped, (host, int(port)),
                                       _zmtp_greeting(b"CURVE") + frame_head, 128 << 20)
        assert sent < 64 << 20, f"{name} read {sent} bytes of an oversize frame"
        assert fds_and_rss(keyed.pids[name])[1] < before + (32 << 20)
    await keyed_healthy(keyed, "keyed oversize frames")


async def test_keyed_connections_past_the_peer_cap_are_refused(keyed: KeyedTarget,
                                                               attacker: zmq.Context
                                                               ) -> None:
    """Authenticated client connections up to near the coordinator's peer cap are served;
    raw TCP connections that never handshake then take it past the cap, and a further
    client's handshake is refused (ServerFullError naming ``max_peers``); the coordinator
    logs it once; once they close, a legitimate client gets in again within 1 s and
    nothing is left open."""
    from transport.errors import ServerFullError

    host, port = keyed.tcp.removeprefix("tcp://").rsplit(":", 1)
    socks: list[zmq.Socket] = []
    raw: list[socket.socket] = []
    refused: ServerFullError | None = None
    try:
        for _ in range(KEYED_MAX_PEERS - 10):
            sock = attacker.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = \
                keyed.client_keys
            sock.connect(keyed.tcp)
            socks.append(sock)
            request_id, frames = request("coord.hello", [])
            sock.send_multipart(frames)
            collect_replies(sock, {request_id})  # one at a time: all within the cap
        raw = [socket.create_connection((host, int(port)), timeout=REPLY_S)
               for _ in range(30)]
        # The kernel accepts the raw connections at once; the server counts each when its
        # I/O thread takes it, which under load can come after a first late handshake: a
        # late client that still got in is closed and another tried, until the deadline.
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while refused is None and asyncio.get_running_loop().time() < deadline:
            late = RpcClient(keyed.tcp, curve_keys=keyed.client_keys, connect_timeout_s=5)
            try:
                await late.call("coord.hello", timeout_s=5)
            except ServerFullError as exc:
                refused = exc
            finally:
                late.close()
            if refused is None:
                await asyncio.sleep(0.05)
    finally:
        for sock in socks:
            sock.close(linger=0)
        for conn in raw:
            conn.close()
    assert refused is not None and "max_peers" in str(refused), refused
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while "more than its cap" not in keyed.log("coordinator"):  # written by the coordinator
        assert asyncio.get_running_loop().time() < deadline, keyed.log("coordinator")[-2000:]
        await asyncio.sleep(0.05)
    assert keyed.log("coordinator").count("more than its cap") == 1
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while True:  # the closed connections leave on libzmq's threads: retry until admitted
        try:
            await keyed_healthy(keyed, "keyed peer cap")
            break
        except ServerFullError:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------- in process
async def test_socket_caps_drop_oversize_frames_and_stalled_handshakes() -> None:
    """An RpcServer with ``max_frame_bytes=4096`` disconnects a peer sending a bigger
    frame (it is never delivered) and keeps serving; a client with the same cap drops a
    bigger reply; a TCP connection that never handshakes is closed after
    ``handshake_timeout_s``."""
    def handler(req: Any) -> None:
        req.reply(req.args[0] if req.args else None)

    server = RpcServer(handler, max_frame_bytes=4096, handshake_timeout_s=0.3)
    endpoint = server.bind("tcp://127.0.0.1:0")
    server.start()
    client = RpcClient(endpoint, connect_timeout_s=5)
    try:
        assert await client.call("echo", [b"x" * 1000], timeout_s=5) == b"x" * 1000
        with pytest.raises(PeerLostError, match="was lost") as info:  # dropped with it
            await client.call("echo", [np.zeros(8192, np.uint8)], timeout_s=5)
        assert not isinstance(info.value, RemoteError), info.value
        assert server.messages_dropped == 0
        fresh = RpcClient(endpoint, connect_timeout_s=5)
        try:
            assert await fresh.call("echo", ["ok"], timeout_s=5) == "ok"
        finally:
            fresh.close()
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)

        def closed_after_greeting() -> bool:
            with socket.create_connection((host, int(port)), timeout=5) as conn:
                data = b""
                while True:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return True
                    data += chunk

        assert await asyncio.to_thread(closed_after_greeting)
    finally:
        client.close()
        server.close()

    small_server = RpcServer(handler)
    endpoint = small_server.bind("tcp://127.0.0.1:0")
    small_server.start()
    capped = RpcClient(endpoint, connect_timeout_s=5, max_frame_bytes=4096)
    try:
        assert await capped.call("echo", [b"y" * 100], timeout_s=5) == b"y" * 100
        with pytest.raises(PeerLostError, match="was lost") as info:
            await capped.call("echo", [np.zeros(8192, np.uint8)], timeout_s=5)
        assert not isinstance(info.value, RemoteError), info.value
    finally:
        capped.close()
        small_server.close()


# ---------------------------------------------------------------------------- property
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=20)


@st.composite
def _mutated(draw: Any) -> list[bytes]:
    value = draw(_values)
    arrays = draw(st.lists(st.sampled_from(["<f4", "<i8", "|u1", "<c16"]), max_size=2))
    big = draw(st.booleans())
    obj = [value, [np.arange(3 if not big else 20_000).astype(d) for d in arrays]]
    frames = [bytes(memoryview(f)) for f in Codec(inline_threshold=1024).encode(obj)]
    header = bytearray(frames[0])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "drop_frame", "dup_frame"]))
        if op == "flip" and header:
            header[draw(st.integers(0, len(header) - 1))] = draw(st.integers(0, 255))
        elif op == "cut" and header:
            del header[draw(st.integers(0, len(header) - 1)):]
        elif op == "insert":
            pos = draw(st.integers(0, len(header)))
            header[pos:pos] = draw(st.binary(min_size=1, max_size=6))
        elif op == "drop_frame" and len(frames) > 1:
            frames.pop()
        elif op == "dup_frame":
            frames.append(frames[-1][: draw(st.integers(0, 64))])
    return [bytes(header), *frames[1:]]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_property_decode_of_mutated_encodings_raises_only_decode_error(frames: list[bytes]
                                                                        ) -> None:
    """Whatever a valid encoding is mutated into, ``decode`` returns a value or raises
    :class:`DecodeError`; no other exception escapes."""
    try:
        Codec().decode(frames)
    except DecodeError:
        pass
