"""Request/reply over ROUTER/DEALER with request ids, so many calls share one connection.

Wire format of every message (after the ROUTER identity frame on the server side)::

    frame 0: prefix  = kind (u8) + request id (u64, little endian)
    frame 1: codec header (msgpack)            -- see transport.codec
    frame 2..: zero-copy array buffers

A request's codec body is ``[method, args, kwargs]``; a reply's is the value (kind OK) or a
:class:`RemoteError` record (kind ERROR). Kind NOTIFY is a request that wants no reply.
A request whose id has its top bit (:data:`LOCAL_ID_BIT`) set comes from a client on
this host (``RpcClient(shm=True)`` over ipc): its bulk arrays may be shared-memory handles
(:mod:`transport.shm`), and so may those of its reply. A server accepts handles only in
such requests, and only from a peer that reached it over ipc (checked per message when
the server also has tcp binds).

The server never dies of bad input: a message it cannot parse is answered with an error
when its request id can be read, and dropped and logged otherwise; oversize messages
(``max_message_bytes``) are refused with an error reply before decoding.

Socket-level limits (what libzmq enforces before Python sees anything):

- ``max_frame_bytes`` (``ZMQ_MAXMSGSIZE``, on every server and client socket): a peer that
  announces a frame larger than this is disconnected by libzmq when it reads the frame's
  size, before any of it is buffered; this holds before CURVE authentication too (the
  handshake commands go through the same decoder). libzmq applies it per frame, not per
  multipart message. The default, :data:`DEFAULT_MAX_FRAME_BYTES`, is the largest frame a
  default :class:`~transport.codec.Codec` ever sends: an array frame of up to
  ``MAX_ARRAY_BYTES`` (2 GiB - 1; a header frame is at most ``max_header_bytes``, 1 MiB).
  Processes that send larger arrays (``Codec(allow_large=True)``) must raise it on both
  ends; processes that only ever receive control messages can lower it.
- ``handshake_timeout_s`` (``ZMQ_HANDSHAKE_IVL``, servers): a connection that has not
  completed the ZMTP (and CURVE) handshake within this time is closed, so idle
  unauthenticated connections do not hold file descriptors for long.

libzmq has no cap on the number of peers of a ROUTER and no call that closes one accepted
connection: ``ZMQ_BACKLOG`` bounds only the kernel's queue of connections not yet
accepted, and libzmq accepts eagerly. :attr:`RpcServer.peers` counts connected peers (from
the socket monitor) and a warning names the count past ``max_peers``; refusing a peer
beyond it would need closing a descriptor libzmq owns, which races with its reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import os
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import zmq

from transport.auth import parse_user_id
from transport.codec import (
    DEFAULT_MAX_HEADER_BYTES,
    MAX_ARRAY_BYTES,
    Codec,
    DecodeError,
    EncodeError,
)
from transport.errors import (
    AuthenticationError,
    CallTimeoutError,
    PeerLostError,
    RemoteError,
    TransportError,
)
from transport.shm import CallPlacer, Placer
from transport.sockets import AsyncSocket, context

log = logging.getLogger(__name__)

KIND_REQUEST = 1
KIND_NOTIFY = 2
KIND_OK = 3
KIND_ERROR = 4
LOCAL_ID_BIT = 1 << 63
"""Set in the request ids of a client on this host that takes shared-memory handles."""
_IPC_PEER = re.compile(r"[^:]*:(\d+):\d+:\d+")
_PREFIX = struct.Struct("<BQ")
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024**3
DEFAULT_MAX_FRAME_BYTES = max(MAX_ARRAY_BYTES, DEFAULT_MAX_HEADER_BYTES)
"""``ZMQ_MAXMSGSIZE`` of every socket: the largest frame a default Codec sends (one array
of up to 2 GiB - 1; headers are capped at 1 MiB). Larger frames are dropped by libzmq, with
the connection, before they are buffered."""
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
"""Servers close connections that have not finished the ZMTP/CURVE handshake by then
(libzmq's default is 30 s)."""
DEFAULT_MAX_PEERS = 1000
"""Past this many connected peers a server logs a warning naming the count (libzmq
cannot refuse a connection; see the module docstring)."""
ZAP_DOMAIN = b"actorrl"


def _frame_len(frame: Any) -> int:
    if isinstance(frame, zmq.Frame):
        return len(frame)
    return memoryview(frame).nbytes


def ipc_peer(frame: Any) -> bool:
    """Whether the message ``frame`` (a received :class:`zmq.Frame`) came over an ipc
    connection from a process of this user (libzmq's ``Peer-Address`` of an ipc peer is
    ``host:uid:gid:pid``; of a tcp peer, its IP address)."""
    try:
        text = frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError, TypeError):
        return False
    if not isinstance(text, str):
        return False
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(text.partition("%")[0])
        return False
    match = _IPC_PEER.fullmatch(text)
    return match is not None and int(match.group(1)) == os.getuid()


def caller_of(frame: Any) -> tuple[str | None, str | None]:
    """``(role, key)`` of the peer that sent ``frame`` (a received :class:`zmq.Frame`),
    from the ``User-Id`` property libzmq attaches to every message of a connection admitted
    by the ZAP handler; ``(None, None)`` without one (no CURVE, or not a Frame)."""
    if not isinstance(frame, zmq.Frame):
        return None, None
    try:
        text = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError, TypeError):
        return None, None
    return parse_user_id(text if isinstance(text, str) else None)


@dataclass(slots=True)
class Request:
    """One received call. Reply exactly once with :meth:`reply` or :meth:`fail`
    (unless ``wants_reply`` is false), possibly later and from any coroutine on the loop."""

    server: RpcServer
    peer: bytes
    request_id: int
    method: str
    args: list[Any]
    kwargs: dict[str, Any]
    wants_reply: bool
    replied: bool = False
    role: str | None = None
    """The caller key's role (``client``, ``node``, ``admin``, ``coordinator``: see
    :mod:`transport.auth`), from the user id the ZAP handler gave its CURVE connection;
    None for a connection without CURVE (ipc, keyless loopback)."""
    key: str | None = None
    """The caller's z85 CURVE public key; None without CURVE."""
    local: bool = False
    """The caller is a process of this host (over ipc) that accepts shared-memory
    handles in the reply."""

    def reply(self, value: Any, placer: Placer | None = None) -> None:
        """Send ``value`` back to the caller; with ``placer`` (only when :attr:`local`)
        its big arrays may go as shared-memory handles."""
        if self.replied or not self.wants_reply:
            return
        self.replied = True
        self.server.send_reply(self.peer, self.request_id, value,
                               placer if self.local else None)

    def fail(self, exc: BaseException) -> None:
        """Send ``exc`` back to the caller as a :class:`RemoteError`."""
        if self.replied or not self.wants_reply:
            return
        self.replied = True
        self.server.send_error(self.peer, self.request_id, RemoteError.from_exception(exc))


RequestHandler = Callable[[Request], None]


class RpcServer:
    """A ROUTER socket bound to one or more endpoints, dispatching requests to ``handler``.

    ``handler(request)`` runs on the event loop and must not block; it replies through the
    request (now or later). Exceptions it raises are sent back as errors.
    """

    def __init__(self, handler: RequestHandler, codec: Codec | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 curve_server_secret_key: bytes | None = None, *,
                 max_frame_bytes: int | None = DEFAULT_MAX_FRAME_BYTES,
                 handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
                 max_peers: int = DEFAULT_MAX_PEERS) -> None:
        """``max_message_bytes``: the largest message (all body frames) decoded, checked
        once it arrived; ``max_frame_bytes``: ``ZMQ_MAXMSGSIZE``, the largest frame libzmq
        reads at all (None: no limit); ``handshake_timeout_s``: ``ZMQ_HANDSHAKE_IVL``;
        ``max_peers``: connected peers past which a warning is logged."""
        self.handler = handler
        self._authenticated = False
        """Whether a CURVE bind exists (then messages carry ZAP user ids)."""
        self._remote_binds = False
        """Whether a non-ipc bind exists (then a local request's peer is checked)."""
        self.codec = codec or Codec()
        self.max_message_bytes = max_message_bytes
        self.max_frame_bytes = max_frame_bytes
        self.max_peers = max_peers
        self.peers = 0
        """Connections accepted and not yet closed (all endpoints together)."""
        sock = context().socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)  # never drop a reply; callers bound their in-flight
            sock.setsockopt(zmq.RCVHWM, 0)
            # Security options are copied into each listener at bind time: set them first.
            sock.setsockopt(zmq.MAXMSGSIZE, -1 if max_frame_bytes is None else max_frame_bytes)
            sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(handshake_timeout_s * 1000)))
            if curve_server_secret_key is not None:
                sock.curve_server = True
                sock.curve_secretkey = curve_server_secret_key
            self._monitor: zmq.Socket = sock.get_monitor_socket(
                zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        except BaseException:
            sock.close(linger=0)
            raise
        self._monitor_async: AsyncSocket | None = None
        self._warned_peers = False
        self._sock = sock
        self.endpoints: list[str] = []
        self._async: AsyncSocket | None = None
        self.bytes_received = 0
        """Bytes of every message received, arrays read through shared memory included."""
        self.shm_bytes_received = 0
        """Of those, the bytes of arrays read through shared memory (not the socket)."""
        self.bytes_sent = 0
        self.messages_dropped = 0

    def bind(self, address: str, curve_secret_key: bytes | None = None) -> str:
        """Bind to ``address`` (``tcp://host:0`` picks a free port); returns the endpoint.

        With ``curve_secret_key`` only this bind is a CURVE server (ZeroMQ takes a copy of
        the socket's security options at bind time), so one socket can serve plain ipc to
        its own node and CURVE tcp to other hosts. Start the process's ZAP handler
        (:func:`transport.auth.ensure_authenticator`) first.
        """
        if curve_secret_key is not None and not self._sock.curve_server:
            self._authenticated = True
            self._sock.curve_server = True
            self._sock.curve_secretkey = curve_secret_key
            # ZAP (the allow-list) is consulted only with a domain set; with it enforced, a
            # missing handler means "refuse", never "admit anyone". Plain binds made later
            # keep the domain and are not enforced: the handler admits NULL handshakes.
            self._sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
            self._sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            try:
                self._sock.bind(address)
            finally:
                self._sock.curve_server = False
                self._sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 0)
        else:
            self._sock.bind(address)
        if not address.startswith("ipc://"):
            self._remote_binds = True
        endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.endpoints.append(endpoint)
        return endpoint

    def start(self) -> None:
        """Start serving on the running event loop."""
        self._monitor_async = AsyncSocket(self._monitor, self._on_monitor_event)
        self._async = AsyncSocket(self._sock, self._on_message)

    def _on_monitor_event(self, frames: list[Any]) -> None:
        event, _value = struct.unpack("=hi", frames[0].bytes[:6])
        if event == zmq.EVENT_ACCEPTED:
            self.peers += 1
            if self.peers > self.max_peers and not self._warned_peers:
                self._warned_peers = True
                log.warning("%d peers are connected to %s, more than the %d expected (libzmq "
                            "cannot refuse connections: check for a connection flood)",
                            self.peers, ", ".join(self.endpoints), self.max_peers)
        elif event == zmq.EVENT_DISCONNECTED:
            self.peers = max(0, self.peers - 1)
            if self.peers <= self.max_peers // 2:
                self._warned_peers = False

    def _on_message(self, frames: list[Any]) -> None:
        self.bytes_received += sum(_frame_len(f) for f in frames)
        if len(frames) < 2:
            self.messages_dropped += 1
            log.warning("dropped malformed message: %d frames", len(frames))
            return
        peer = frames[0].bytes
        prefix = frames[1].bytes
        if len(prefix) != _PREFIX.size:
            self.messages_dropped += 1
            log.warning("dropped message with a malformed %d-byte prefix", len(prefix))
            return
        kind, request_id = _PREFIX.unpack(prefix)
        local = False
        if request_id & LOCAL_ID_BIT and kind == KIND_REQUEST:
            local = not self._remote_binds or ipc_peer(frames[1])
        elif kind not in (KIND_REQUEST, KIND_NOTIFY):
            self.messages_dropped += 1
            log.warning("dropped message of unknown kind %d", kind)
            return
        wants_reply = kind == KIND_REQUEST
        if len(frames) < 3:
            self._refuse(peer, request_id, wants_reply, DecodeError("request has no body"))
            return
        size = sum(_frame_len(f) for f in frames[2:])
        if size > self.max_message_bytes:
            self._refuse(peer, request_id, wants_reply, ValueError(
                f"message of {size} bytes exceeds this server's limit of "
                f"{self.max_message_bytes} bytes"))
            return
        try:
            if local:
                body = self.codec.decode(frames[2:], allow_shm=True)
                shm_bytes = self.codec.take_shm_bytes()
                self.bytes_received += shm_bytes
                self.shm_bytes_received += shm_bytes
            else:
                body = self.codec.decode(frames[2:])
            method, args, kwargs = body
            if not isinstance(method, str) or not isinstance(args, list) or not isinstance(
                    kwargs, dict):
                raise DecodeError("request body must be [method: str, args: list, kwargs: map]")
        except (DecodeError, ValueError, TypeError) as exc:
            self._refuse(peer, request_id, wants_reply, exc)
            return
        # Only a socket with a CURVE bind has ZAP user ids: asking without one raises (an
        # exception per message, ~4% of a no-op call's CPU).
        role, key = caller_of(frames[1]) if self._authenticated else (None, None)
        request = Request(self, peer, request_id, method, args, kwargs, wants_reply,
                          role=role, key=key, local=local)
        try:
            self.handler(request)
        except Exception as exc:
            if wants_reply and not request.replied:
                request.fail(exc)
            else:
                log.exception("notification handler for %r failed", method)

    def _refuse(self, peer: bytes, request_id: int, wants_reply: bool,
                exc: BaseException) -> None:
        self.messages_dropped += 1
        log.warning("refused request %d: %s", request_id, exc)
        if wants_reply:
            self.send_error(peer, request_id, RemoteError.from_exception(exc))

    def send_reply(self, peer: bytes, request_id: int, value: Any,
                   placer: Placer | None = None) -> None:
        """Send a successful reply (encoding errors become an error reply); ``placer``:
        see :meth:`Request.reply`."""
        try:
            frames = self.codec.encode(value, placer) if placer is not None else \
                self.codec.encode(value)
        except EncodeError as exc:
            self.send_error(peer, request_id, RemoteError.from_exception(exc))
            return
        self._send([peer, _PREFIX.pack(KIND_OK, request_id), *frames])

    def send_error(self, peer: bytes, request_id: int, error: RemoteError) -> None:
        """Send an error reply."""
        self._send([peer, _PREFIX.pack(KIND_ERROR, request_id), *self.codec.encode(error)])

    def _send(self, frames: list[Any]) -> None:
        if self._async is None:
            return
        self.bytes_sent += sum(_frame_len(f) for f in frames)
        try:
            self._async.send(frames)
        except zmq.ZMQError as exc:
            log.warning("could not send reply: %s", exc)

    def close(self) -> None:
        """Stop serving and close the socket and its monitor."""
        with contextlib.suppress(Exception):
            self._sock.disable_monitor()
        if self._monitor_async is not None:
            self._monitor_async.close()
        else:
            self._monitor.close(linger=0)
        if self._async is not None:
            self._async.close()
        else:
            self._sock.close(linger=0)


def _answered(fut: asyncio.Future) -> bool:
    """Whether a call's future holds the server's answer (value or remote error): then the
    server decoded the request, and whatever it mapped it holds on its own."""
    return not fut.cancelled() and not isinstance(fut.exception(), TransportError)


class RpcClient:
    """A DEALER connection to one server; many calls in flight, matched by request id.

    If the connection drops (the peer died), every pending call fails with
    :class:`PeerLostError`; so does every call made while the peer has been unreachable for
    ``connect_timeout_s`` since the client was created. ``on_lost`` callbacks run (on the
    loop) each time that happens. Over tcp, ZeroMQ heartbeats (``heartbeat_s``) turn a
    silent peer (a host that vanished) into a dropped connection within
    ``heartbeat_timeout_s``.
    """

    _ids = itertools.count(1)

    def __init__(self, endpoint: str, codec: Codec | None = None,
                 connect_timeout_s: float = 30.0,
                 curve_keys: tuple[bytes, bytes, bytes] | None = None,
                 heartbeat_s: float = 1.0, heartbeat_timeout_s: float = 5.0,
                 max_frame_bytes: int | None = DEFAULT_MAX_FRAME_BYTES,
                 shm: bool = False) -> None:
        """``max_frame_bytes``: ``ZMQ_MAXMSGSIZE``, the largest reply frame libzmq reads
        (a server sending more is disconnected; None: no limit). ``shm``: over ipc, say
        so in every request (:data:`LOCAL_ID_BIT`) and accept shared-memory handles in the
        replies (:mod:`transport.shm`)."""
        self.endpoint = endpoint
        self.local = shm and endpoint.startswith("ipc://")
        """Request ids carry LOCAL_ID_BIT and replies may carry shm handles."""
        self._id_flag = LOCAL_ID_BIT if self.local else 0
        self.codec = codec or Codec()
        self.loop = asyncio.get_running_loop()
        self.on_lost: list[Callable[[PeerLostError], None]] = []
        self._pending: dict[int, asyncio.Future] = {}
        sock = context().socket(zmq.DEALER)
        monitor: zmq.Socket | None = None
        monitor_async: AsyncSocket | None = None
        try:  # a failed connect (bad endpoint) closes both sockets: no fd leaks per try
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, -1 if max_frame_bytes is None else max_frame_bytes)
            if endpoint.startswith("tcp://"):
                sock.setsockopt(zmq.HEARTBEAT_IVL, int(heartbeat_s * 1000))
                sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(heartbeat_timeout_s * 1000))
            if curve_keys is not None:
                server_public, public, secret = curve_keys
                sock.curve_serverkey = server_public
                sock.curve_publickey = public
                sock.curve_secretkey = secret
            monitor = sock.get_monitor_socket(
                zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | zmq.EVENT_HANDSHAKE_SUCCEEDED)
            monitor_async = AsyncSocket(monitor, self._on_monitor_event)
            sock.connect(endpoint)
        except BaseException:
            if monitor is not None:
                with contextlib.suppress(Exception):
                    sock.disable_monitor()
                if monitor_async is not None:
                    monitor_async.close()
                else:
                    monitor.close(linger=0)
            sock.close(linger=0)
            raise
        self._monitor, self._monitor_async = monitor, monitor_async
        self._async = AsyncSocket(sock, self._on_message)
        self.connected = False
        """Whether the peer is reachable: for CURVE, once the handshake succeeded (a TCP
        connect alone may still be refused by the server's key check)."""
        self._curve = curve_keys is not None
        self.lost: PeerLostError | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        """Bytes of every reply received, arrays read through shared memory included."""
        self.shm_bytes_received = 0
        """Of those, the bytes of arrays read through shared memory (not the socket)."""
        self._connect_timer = self.loop.call_later(connect_timeout_s, self._connect_timed_out,
                                                   connect_timeout_s)

    def _on_monitor_event(self, frames: list[Any]) -> None:
        event, value = struct.unpack("=hi", frames[0].bytes[:6])
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED or (
                event == zmq.EVENT_CONNECTED and not self._curve):
            self.connected = True
            self._connect_timer.cancel()
        elif event == zmq.EVENT_DISCONNECTED and self.connected:
            self.connected = False
            self._async.drain()  # replies received before the disconnect still count
            self._fail_all(PeerLostError(f"connection to {self.endpoint} was lost"))
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self._fail_all(AuthenticationError(
                f"{self.endpoint} refused this client's key (CURVE authentication failed, "
                f"ZAP status {value}): its public key is not on that server's allow-list",
                key_refused=True))
        elif event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                       zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            if self._curve:  # a wrong server key: the server cannot read our HELLO
                self._fail_all(AuthenticationError(
                    f"the CURVE handshake with {self.endpoint} failed: the server dropped "
                    "it, so the server public key this client uses is most likely not that "
                    "server's (or it does not serve CURVE there)", key_refused=False))
            else:  # before DISCONNECTED, so pending calls get this reason
                self._fail_all(AuthenticationError(
                    f"the handshake with {self.endpoint} failed: the server closed the "
                    "connection (it probably requires CURVE keys, and this client has "
                    "none)", key_refused=False))

    def _connect_timed_out(self, timeout_s: float) -> None:
        if not self.connected:
            self._fail_all(PeerLostError(
                f"could not connect to {self.endpoint} within {timeout_s:g} s"))

    def _fail_all(self, error: PeerLostError, notify: bool = True) -> None:
        self.lost = error
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)
        if notify:
            for callback in list(self.on_lost):
                try:
                    callback(error)
                except Exception:
                    log.exception("on_lost callback failed")

    def _on_message(self, frames: list[Any]) -> None:
        self.bytes_received += sum(_frame_len(f) for f in frames)
        if len(frames) < 2 or len(frames[0]) != _PREFIX.size:
            log.warning("dropped malformed reply from %s", self.endpoint)
            return
        kind, request_id = _PREFIX.unpack(frames[0].bytes)
        fut = self._pending.pop(request_id, None)
        if fut is None or fut.done():
            return
        try:
            if self.local:
                value = self.codec.decode(frames[1:], allow_shm=True)
                shm_bytes = self.codec.take_shm_bytes()
                self.bytes_received += shm_bytes
                self.shm_bytes_received += shm_bytes
            else:
                value = self.codec.decode(frames[1:])
        except DecodeError as exc:
            fut.set_exception(exc)
            return
        if kind == KIND_OK:
            fut.set_result(value)
        elif kind == KIND_ERROR and isinstance(value, RemoteError):
            fut.set_exception(value.typed())
        else:
            fut.set_exception(DecodeError(f"reply of unknown kind {kind}"))

    def call(self, method: str, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None,
             timeout_s: float | None = None) -> asyncio.Future:
        """Send a request; the returned future resolves to the reply value.

        Raises :class:`EncodeError` at once if the arguments cannot be encoded.
        """
        return self.call_encoded(self.codec.encode([method, list(args), kwargs or {}]),
                                 timeout_s)

    def call_encoded(self, frames: list[Any], timeout_s: float | None = None,
                     placer: CallPlacer | None = None) -> asyncio.Future:
        """Like :meth:`call`, with the body ``[method, args, kwargs]`` already encoded (so a
        caller on another thread can encode and fail early, then hand frames to the loop).

        ``placer``: the one the body was encoded with (only for a :attr:`local` client);
        its segments are released once the call is answered (reused) or fails (unlinked)."""
        request_id = next(self._ids) | self._id_flag
        fut = self.loop.create_future()
        if placer is not None:
            fut.add_done_callback(lambda f: placer.finish(_answered(f)))
        if self.lost is not None and not self.connected:
            fut.set_exception(self.lost)
            return fut
        self._pending[request_id] = fut
        try:
            self._send([_PREFIX.pack(KIND_REQUEST, request_id), *frames])
        except BaseException:
            del self._pending[request_id]
            raise
        # A caller that gives up (cancels) leaves no entry behind.
        fut.add_done_callback(
            lambda f, rid=request_id: f.cancelled() and self._pending.pop(rid, None))
        if timeout_s is not None:
            handle = self.loop.call_later(timeout_s, self._expire, request_id, timeout_s)
            fut.add_done_callback(lambda _f: handle.cancel())
        return fut

    def notify(self, method: str, args: Iterable[Any] = (),
               kwargs: dict[str, Any] | None = None) -> None:
        """Send a request that wants no reply (best effort)."""
        frames = self.codec.encode([method, list(args), kwargs or {}])
        self._send([_PREFIX.pack(KIND_NOTIFY, 0), *frames])

    def _send(self, frames: list[Any]) -> None:
        self.bytes_sent += sum(_frame_len(f) for f in frames)
        self._async.send(frames)

    def _expire(self, request_id: int, timeout_s: float) -> None:
        fut = self._pending.pop(request_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(CallTimeoutError(
                f"no reply from {self.endpoint} within {timeout_s:g} s"))

    @property
    def in_flight(self) -> int:
        """Calls sent and not yet answered."""
        return len(self._pending)

    def close(self) -> None:
        """Close the connection; pending calls fail with PeerLostError."""
        self._connect_timer.cancel()
        self._fail_all(PeerLostError(f"client to {self.endpoint} was closed"), notify=False)
        with contextlib.suppress(Exception):
            self._async.sock.disable_monitor()
        self._monitor_async.close()
        self._async.close()
