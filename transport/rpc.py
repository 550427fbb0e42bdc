"""Request/reply over ROUTER/DEALER with request ids, so many calls share one connection.

Wire format of every message (after the ROUTER identity frame on the server side)::

    frame 0: prefix  = kind (u8) + request id (u64, little endian)
    frame 1: codec header (msgpack)            -- see transport.codec
    frame 2..: zero-copy array buffers

A request's codec body is ``[method, args, kwargs]``; a reply's is the value (kind OK) or a
:class:`RemoteError` record (kind ERROR). Kind NOTIFY is a request that wants no reply.

Kind BATCH carries several header-only messages to one peer in one ZeroMQ message (every
ZeroMQ message costs a wake-up of libzmq's I/O threads on both sides, the largest share of
a small call's CPU here)::

    frame 0: prefix = KIND_BATCH + count (u64)
    frame 1: table  = count x (kind u8, request id u64, header length u32)
    frame 2: the count codec headers, concatenated

Each entry is then handled exactly as the message ``[prefix(kind, id), header]`` would be
(same checks, same order). A connection sends one when several small messages to a peer
are made in one event-loop iteration: the first goes out at once, the rest at the end of
the iteration (:class:`Outbox`). A server batches only replies to requests whose id has
:data:`BATCH_ID_BIT` set (an :class:`RpcClient` sets it; a bare ZeroMQ peer does not).
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

- ``max_peers`` (servers with a CURVE bind): libzmq has no cap on the peers of a ROUTER
  and no call that closes one accepted connection, but it asks the ZAP handler about
  every handshake. :attr:`RpcServer.peers` counts open connections (socket monitor), and
  past ``max_peers`` the ZAP handler refuses the handshake (status 500, "too many
  peers": :class:`transport.auth.PeerGate`), so libzmq closes the connection; the client
  gets :class:`ServerFullError`. The cap is lowered to fit the fd limit
  (:func:`transport.limits.peer_budget`). The count is updated on the event loop, so a
  burst can pass the cap by the accepts the loop has not seen yet (the connection being
  handshaken, typically). Connections that never handshake are not seen
  by ZAP: ``handshake_timeout_s`` closes them. Keyless servers (ipc, an insecure loopback
  bind) have no ZAP handshake and only get a warning past the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import itertools
import logging
import os
import re
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import zmq

from transport.auth import PeerGate, current_authenticator, parse_user_id
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
    ServerFullError,
    TransportError,
)
from transport.limits import peer_budget
from transport.shm import CallPlacer, Placer
from transport.sockets import AsyncSocket, context

log = logging.getLogger(__name__)

KIND_REQUEST = 1
KIND_NOTIFY = 2
KIND_OK = 3
KIND_ERROR = 4
KIND_BATCH = 5
MAX_BATCH = 1024
"""The most messages one batch carries (a longer one is refused whole)."""
BATCH_ITEM_BYTES = 16 * 1024
"""Header-only messages up to this size are coalesced into batches; larger ones and
messages with array frames go alone (after the peer's earlier waiting messages)."""
_BATCH_ENTRY = struct.Struct("<BQI")
LOCAL_ID_BIT = 1 << 63
"""Set in the request ids of a client on this host that takes shared-memory handles."""
BATCH_ID_BIT = 1 << 62
"""Set in the request ids of a client that reads batched replies (:data:`KIND_BATCH`);
servers batch only replies to such requests (every server reads batched requests)."""
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
"""Past this many open connections a CURVE server refuses new handshakes (see the module
docstring); a keyless one logs a warning."""
ZAP_DOMAIN = b"actorrl"
_server_ids = itertools.count(1)


def _frame_len(frame: Any) -> int:
    if isinstance(frame, zmq.Frame):
        return len(frame)
    return memoryview(frame).nbytes


def split_batch(frames: list[Any]) -> list[tuple[int, int, memoryview]]:
    """The ``(kind, request id, header)`` entries of a received batch ``[prefix, table,
    headers]`` (the identity frame removed); ValueError when it is malformed (wrong frame
    count, a count of 0 or above :data:`MAX_BATCH`, a table that does not match, lengths
    that do not add up to the headers frame)."""
    if len(frames) != 3:
        raise ValueError(f"batch of {len(frames)} frames (expected 3)")
    count = _PREFIX.unpack(_frame_bytes(frames[0]))[1]
    if not 0 < count <= MAX_BATCH:
        raise ValueError(f"batch of {count} messages (1 to {MAX_BATCH} allowed)")
    table = _frame_bytes(frames[1])
    if len(table) != count * _BATCH_ENTRY.size:
        raise ValueError(f"batch table of {len(table)} bytes for {count} messages")
    headers = memoryview(frames[2].buffer if isinstance(frames[2], zmq.Frame) else frames[2])
    entries = []
    pos = 0
    for kind, request_id, length in _BATCH_ENTRY.iter_unpack(table):
        entries.append((kind, request_id, headers[pos:pos + length]))
        pos += length
    if pos != headers.nbytes:
        raise ValueError(f"batch headers of {headers.nbytes} bytes, table says {pos}")
    return entries


def _frame_bytes(frame: Any) -> bytes:
    return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)


class Outbox:
    """Sends a connection's messages, coalescing the small ones that one event-loop
    iteration sends to a peer into :data:`KIND_BATCH` messages.

    The first message of an iteration goes out at once (a lone call waits for nothing);
    header-only messages sent after it in the same iteration wait for the end of the
    iteration and go as one batch per peer (or alone when there is one). A message with
    array frames first sends what its peer has waiting, so each peer's messages keep their
    order. ``on_failed(exc, entries)`` runs when a waiting message could not be sent at the
    end of the iteration (the socket closed meanwhile, a full send backlog);
    ``entries`` are its ``(kind, request_id)`` pairs.
    """

    def __init__(self, sock: AsyncSocket, routed: bool,
                 on_failed: Callable[[BaseException, list[tuple[int, int]]], None]) -> None:
        """``routed``: the socket is a ROUTER (each message starts with the peer's
        identity) and batches only replies to ids with :data:`BATCH_ID_BIT`; a DEALER
        batches every small message."""
        self._sock = sock
        self._routed = routed
        self._batch_mask = BATCH_ID_BIT if routed else 0
        self._on_failed = on_failed
        self._waiting: dict[bytes, list[tuple[int, int, Any]]] = {}
        self._scheduled = False

    def send(self, peer: bytes, kind: int, request_id: int, frames: list[Any],
             hold: bool = False) -> None:
        """Send ``[prefix(kind, request_id), *frames]`` to ``peer`` (``b""`` on a
        DEALER); raises at once when the socket is closed or its backlog full. ``hold``:
        even as the iteration's first message, wait for its end (so the messages sent
        right after it travel in the same batch)."""
        sock = self._sock
        if not self._scheduled:
            self._scheduled = True
            sock.loop.call_soon(self.flush)
            if not hold:
                sock.send(self._message(peer, _PREFIX.pack(kind, request_id), frames))
                return
        if sock.closed:
            raise zmq.ZMQError(zmq.ENOTSOCK, "socket is closed")
        if (len(frames) == 1 and request_id & self._batch_mask == self._batch_mask
                and _frame_len(frames[0]) <= BATCH_ITEM_BYTES):
            waiting = self._waiting.get(peer)
            if waiting is None:
                self._waiting[peer] = [(kind, request_id, frames[0])]
            else:
                waiting.append((kind, request_id, frames[0]))
            return
        if peer in self._waiting:
            self._flush_peer(peer, self._waiting.pop(peer))
        sock.send(self._message(peer, _PREFIX.pack(kind, request_id), frames))

    def _message(self, peer: bytes, prefix: bytes, frames: list[Any]) -> list[Any]:
        return [peer, prefix, *frames] if self._routed else [prefix, *frames]

    def flush(self) -> None:
        """Send every waiting message now (runs at the end of each iteration that sent)."""
        self._scheduled = False
        waiting, self._waiting = self._waiting, {}
        for peer, entries in waiting.items():
            self._flush_peer(peer, entries)

    def _flush_peer(self, peer: bytes, entries: list[tuple[int, int, Any]]) -> None:
        try:
            for start in range(0, len(entries), MAX_BATCH):
                chunk = entries[start:start + MAX_BATCH]
                if len(chunk) == 1:
                    kind, request_id, header = chunk[0]
                    self._sock.send(self._message(peer, _PREFIX.pack(kind, request_id),
                                                  [header]))
                    continue
                table = b"".join([_BATCH_ENTRY.pack(kind, request_id, len(header))
                                  for kind, request_id, header in chunk])
                self._sock.send(self._message(peer, _PREFIX.pack(KIND_BATCH, len(chunk)),
                                              [table, b"".join([h for _, _, h in chunk])]))
        except (zmq.ZMQError, OSError) as exc:
            sent = start  # chunks before this one went out
            self._on_failed(exc, [(k, r) for k, r, _ in entries[sent:]])


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

    def reply_encoded(self, frames: list[Any]) -> None:
        """Send a reply already encoded with this server's codec (``codec.encode(value)``):
        one encoding of a value sent to many callers."""
        if self.replied or not self.wants_reply:
            return
        self.replied = True
        self.server.send_encoded_reply(self.peer, self.request_id, frames)

    def fail(self, exc: BaseException) -> None:
        """Send ``exc`` back to the caller as a :class:`RemoteError`."""
        if self.replied or not self.wants_reply:
            return
        self.replied = True
        self.server.send_error(self.peer, self.request_id, RemoteError.from_exception(exc))


RequestHandler = Callable[[Request], None]


def _bind(sock: zmq.Socket, address: str) -> None:
    """``sock.bind(address)``; an address that is not one of this host's fails naming it
    and the fix (ZeroMQ's own message shows only the errno text and the address)."""
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRNOTAVAIL:
            raise
        host = urlparse(address).hostname or address
        raise zmq.ZMQError(exc.errno, (
            f"cannot listen on {address}: {host} is not an address of this host "
            f"({exc.strerror}); bind one of this host's addresses instead, e.g. 127.0.0.1 "
            "(this host only) or 0.0.0.0 (every interface)")) from None


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
        ``max_peers``: open connections past which new handshakes are refused (CURVE
        binds; lowered to fit the fd limit, :func:`transport.limits.peer_budget`)."""
        self.handler = handler
        self._authenticated = False
        """Whether a CURVE bind exists (then messages carry ZAP user ids)."""
        self._remote_binds = False
        """Whether a non-ipc bind exists (then a local request's peer is checked)."""
        self.codec = codec or Codec()
        self.max_message_bytes = max_message_bytes
        self.max_frame_bytes = max_frame_bytes
        self.max_peers = peer_budget(max_peers)
        self._zap_domain = ZAP_DOMAIN + b"-%d-%d" % (os.getpid(), next(_server_ids))
        """This socket's own ZAP domain: the handler finds its :class:`PeerGate` by it."""
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
                zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        except BaseException:
            sock.close(linger=0)
            raise
        self._monitor_async: AsyncSocket | None = None
        self._warned_peers = False
        self.handshake_failures = 0
        """Connections whose ZMTP/CURVE handshake failed (not those ZAP refused)."""
        self._unlogged_failures = 0
        self._failure_logged_at: float | None = None
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
            self._sock.setsockopt(zmq.ZAP_DOMAIN, self._zap_domain)
            self._sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            try:
                _bind(self._sock, address)
            finally:
                self._sock.curve_server = False
                self._sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 0)
        else:
            _bind(self._sock, address)
        if not address.startswith("ipc://"):
            self._remote_binds = True
        endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.endpoints.append(endpoint)
        authenticator = current_authenticator() if curve_secret_key is not None else None
        if authenticator is not None:
            authenticator.add_gate(self._zap_domain, PeerGate(
                f"the server at {endpoint}", lambda: self.peers, self.max_peers))
        return endpoint

    def start(self) -> None:
        """Start serving on the running event loop."""
        self._monitor_async = AsyncSocket(self._monitor, self._on_monitor_event)
        self._async = AsyncSocket(self._sock, self._on_message)
        self._outbox = Outbox(self._async, True, self._send_failed)

    def _on_monitor_event(self, frames: list[Any]) -> None:
        event, _value = struct.unpack("=hi", frames[0].bytes[:6])
        if event == zmq.EVENT_ACCEPTED:
            self.peers += 1
            if self.peers > self.max_peers and not self._warned_peers and \
                    not self._authenticated:  # CURVE servers refuse them (PeerGate)
                self._warned_peers = True
                log.warning("%d peers are connected to %s, more than the %d expected (libzmq "
                            "cannot refuse connections: check for a connection flood)",
                            self.peers, ", ".join(self.endpoints), self.max_peers)
        elif event == zmq.EVENT_DISCONNECTED:
            self.peers = max(0, self.peers - 1)
            if self.peers <= self.max_peers // 2:
                self._warned_peers = False
        else:  # a handshake failed
            where = frames[1].bytes.decode(errors="replace") if len(frames) > 1 else ""
            self._handshake_failed(event, _value, where)

    HANDSHAKE_LOG_WINDOW_S = 60.0
    """Handshake failures are logged at most once per window (with the count since)."""

    def _handshake_failed(self, event: int, value: int, where: str) -> None:
        """Count a failed handshake; on a CURVE server log it as an authentication
        failure, naming the endpoint and the likely cause, at most once per window."""
        self.handshake_failures += 1
        self._unlogged_failures += 1
        now = time.monotonic()
        if self._failure_logged_at is not None and \
                now - self._failure_logged_at < self.HANDSHAKE_LOG_WINDOW_S:
            return
        self._failure_logged_at = now
        count, self._unlogged_failures = self._unlogged_failures, 0
        where = where or ", ".join(self.endpoints)
        if not self._authenticated:
            log.debug("%d handshake(s) failed on %s (event %d, value %d)", count, where,
                      event, value)
            return
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and \
                value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            cause = ("its CURVE HELLO could not be decrypted: the peer uses a server public "
                     "key that is not this server's (e.g. a node or client with a wrong "
                     "coordinator.public: copy it from this server's keys directory)")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            cause = (f"ZMTP/CURVE protocol error {value:#x}: the peer does not speak CURVE "
                     "with this server's key (no keys, a wrong server key, or not ZeroMQ)")
        else:
            cause = ("the peer closed the connection during the handshake or did not "
                     "finish it in time (a wrong server key, no keys, or not ZeroMQ)")
        log.warning("authentication failure: %d connection(s) to %s failed the CURVE "
                    "handshake: %s; further failures are logged at most every %g s", count,
                    where, cause, self.HANDSHAKE_LOG_WINDOW_S)

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
        if kind == KIND_BATCH:
            try:
                entries = split_batch(frames[1:])
            except ValueError as exc:
                self.messages_dropped += 1
                log.warning("dropped malformed batch: %s", exc)
                return
            for kind, request_id, header in entries:
                self._on_request(peer, frames[1], kind, request_id, [header])
        else:
            self._on_request(peer, frames[1], kind, request_id, frames[2:])

    def _on_request(self, peer: bytes, prefix_frame: Any, kind: int, request_id: int,
                    body_frames: list[Any]) -> None:
        """Handle one message (alone or from a batch); ``prefix_frame`` is the received
        frame whose connection properties (peer address, ZAP user id) apply."""
        local = False
        if request_id & LOCAL_ID_BIT and kind == KIND_REQUEST:
            local = not self._remote_binds or ipc_peer(prefix_frame)
        elif kind not in (KIND_REQUEST, KIND_NOTIFY):
            self.messages_dropped += 1
            log.warning("dropped message of unknown kind %d", kind)
            return
        wants_reply = kind == KIND_REQUEST
        if not body_frames:
            self._refuse(peer, request_id, wants_reply, DecodeError("request has no body"))
            return
        size = sum(_frame_len(f) for f in body_frames) if len(body_frames) > 1 else \
            _frame_len(body_frames[0])
        if size > self.max_message_bytes:
            self._refuse(peer, request_id, wants_reply, ValueError(
                f"message of {size} bytes exceeds this server's limit of "
                f"{self.max_message_bytes} bytes"))
            return
        try:
            if local:
                body = self.codec.decode(body_frames, allow_shm=True)
                shm_bytes = self.codec.take_shm_bytes()
                self.bytes_received += shm_bytes
                self.shm_bytes_received += shm_bytes
            else:
                body = self.codec.decode(body_frames)
            method, args, kwargs = body
            if not isinstance(method, str) or not isinstance(args, list) or not isinstance(
                    kwargs, dict):
                raise DecodeError("request body must be [method: str, args: list, kwargs: map]")
        except (DecodeError, ValueError, TypeError) as exc:
            self._refuse(peer, request_id, wants_reply, exc)
            return
        # Only a socket with a CURVE bind has ZAP user ids: asking without one raises (an
        # exception per message, ~4% of a no-op call's CPU).
        role, key = caller_of(prefix_frame) if self._authenticated else (None, None)
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
        self._send(peer, KIND_OK, request_id, frames)

    def send_encoded_reply(self, peer: bytes, request_id: int, frames: list[Any]) -> None:
        """Send a successful reply encoded beforehand (see :meth:`Request.reply_encoded`)."""
        self._send(peer, KIND_OK, request_id, frames)

    def send_error(self, peer: bytes, request_id: int, error: RemoteError) -> None:
        """Send an error reply."""
        self._send(peer, KIND_ERROR, request_id, self.codec.encode(error))

    def _send(self, peer: bytes, kind: int, request_id: int, frames: list[Any]) -> None:
        if self._async is None:
            return
        self.bytes_sent += len(peer) + _PREFIX.size + (
            _frame_len(frames[0]) if len(frames) == 1 else sum(_frame_len(f) for f in frames))
        try:
            self._outbox.send(peer, kind, request_id, frames)
        except zmq.ZMQError as exc:
            log.warning("could not send reply: %s", exc)

    @staticmethod
    def _send_failed(exc: BaseException, entries: list[tuple[int, int]]) -> None:
        log.warning("could not send %d replies: %s", len(entries), exc)

    def close(self) -> None:
        """Stop serving and close the socket and its monitor."""
        authenticator = current_authenticator() if self._authenticated else None
        if authenticator is not None:
            authenticator.remove_gate(self._zap_domain)
        with contextlib.suppress(Exception):
            self._sock.disable_monitor()
        if self._monitor_async is not None:
            self._monitor_async.close()
        else:
            self._monitor.close(linger=0)
        if self._async is not None:
            self._outbox.flush()  # replies made in this iteration still go out
            self._async.close()
        else:
            self._sock.close(linger=0)


def _answered(fut: asyncio.Future) -> bool:
    """Whether a call's future holds the server's answer (value or remote error): then the
    server decoded the request, and whatever it mapped it holds on its own. (A future the
    caller supplied may hold its own error for a transport error, with that as its
    ``__cause__``.)"""
    if fut.cancelled():
        return False
    exc = fut.exception()
    return not isinstance(exc, TransportError) and not isinstance(
        getattr(exc, "__cause__", None), TransportError)


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
                 shm: bool = False, refused_is_lost: bool = False) -> None:
        """``max_frame_bytes``: ``ZMQ_MAXMSGSIZE``, the largest reply frame libzmq reads
        (a server sending more is disconnected; None: no limit). ``shm``: over ipc, say
        so in every request (:data:`LOCAL_ID_BIT`) and accept shared-memory handles in the
        replies (:mod:`transport.shm`). ``refused_is_lost``: a refused connect attempt
        (nothing listens at the endpoint) fails the calls at once instead of being retried
        until ``connect_timeout_s``; for probing a peer believed to be there, not for
        connecting to one that may still be starting."""
        self.endpoint = endpoint
        self.local = shm and endpoint.startswith("ipc://")
        """Request ids carry LOCAL_ID_BIT and replies may carry shm handles."""
        self._id_flag = (LOCAL_ID_BIT if self.local else 0) | BATCH_ID_BIT
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
                | zmq.EVENT_HANDSHAKE_SUCCEEDED
                | (zmq.EVENT_CONNECT_RETRIED if refused_is_lost else 0))
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
        self._outbox = Outbox(self._async, False, self._send_failed)
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
        elif event == zmq.EVENT_CONNECT_RETRIED and not self.connected:
            # Only monitored with refused_is_lost: the attempt failed (refused on a live
            # host), and libzmq would retry it silently until the connect timeout.
            self._fail_all(PeerLostError(
                f"{self.endpoint} refused the connection: nothing listens there (the peer "
                "process is gone)"))
        elif event == zmq.EVENT_DISCONNECTED and self.connected:
            self.connected = False
            self._async.drain()  # replies received before the disconnect still count
            self._fail_all(PeerLostError(f"connection to {self.endpoint} was lost"))
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH and value == 500:
            self._fail_all(ServerFullError(
                f"{self.endpoint} refused the connection in the handshake (ZAP status 500): "
                "it has as many peers as its cap allows (max_peers); retry later, or raise "
                "that server's cap"))
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self._fail_all(AuthenticationError(
                f"{self.endpoint} refused this client's key (CURVE authentication failed, "
                f"ZAP status {value}): its public key is not on that server's allow-list",
                key_refused=True))
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and value != errno.EPIPE:
            # Reset or timed out mid-handshake: nobody answered (the peer process died, or
            # a child that inherited its listening socket holds connections it never
            # reads). Only a server that read our greeting and closed the connection
            # (EPIPE) says anything about keys.
            self._fail_all(PeerLostError(
                f"no answer to the handshake from {self.endpoint} "
                f"({errno.errorcode.get(value, value)}): the peer process is gone or not "
                "answering"))
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
        if kind == KIND_BATCH:
            try:
                entries = split_batch(frames)
            except ValueError as exc:
                log.warning("dropped malformed batch of replies from %s: %s", self.endpoint,
                            exc)
                return
            for kind, request_id, header in entries:
                self._on_reply(kind, request_id, [header])
        else:
            self._on_reply(kind, request_id, frames[1:])

    def _on_reply(self, kind: int, request_id: int, body_frames: list[Any]) -> None:
        fut = self._pending.pop(request_id, None)
        if fut is None or fut.done():
            return
        try:
            if self.local:
                value = self.codec.decode(body_frames, allow_shm=True)
                shm_bytes = self.codec.take_shm_bytes()
                self.bytes_received += shm_bytes
                self.shm_bytes_received += shm_bytes
            else:
                value = self.codec.decode(body_frames)
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
                     placer: CallPlacer | None = None,
                     future: asyncio.Future | None = None) -> asyncio.Future:
        """Like :meth:`call`, with the body ``[method, args, kwargs]`` already encoded (so a
        caller on another thread can encode and fail early, then hand frames to the loop).

        ``placer``: the one the body was encoded with (only for a :attr:`local` client);
        its segments are released once the call is answered (reused) or fails (unlinked).
        ``future``: resolve this future (of this loop) instead of a new one, saving the
        caller a future and a loop iteration; when the send raises, it is left as it was."""
        request_id = next(self._ids) | self._id_flag
        fut = self.loop.create_future() if future is None else future
        if self.lost is not None and not self.connected:
            if placer is not None:
                fut.add_done_callback(lambda f: placer.finish(_answered(f)))
            fut.set_exception(self.lost)
            return fut
        self._pending[request_id] = fut
        try:
            self._send(KIND_REQUEST, request_id, frames)
        except BaseException:
            del self._pending[request_id]
            raise
        if placer is not None:
            fut.add_done_callback(lambda f: placer.finish(_answered(f)))
        # A caller that gives up (cancels) leaves no entry behind.
        fut.add_done_callback(
            lambda f, rid=request_id: f.cancelled() and self._pending.pop(rid, None))
        if timeout_s is not None:
            handle = self.loop.call_later(timeout_s, self._expire, request_id, timeout_s)
            fut.add_done_callback(lambda _f: handle.cancel())
        return fut

    def notify(self, method: str, args: Iterable[Any] = (),
               kwargs: dict[str, Any] | None = None, hold: bool = False) -> None:
        """Send a request that wants no reply (best effort). ``hold``: send it at the end
        of this loop iteration, in one message with what else goes to the server by then
        (for a notification made just before a request)."""
        frames = self.codec.encode([method, list(args), kwargs or {}])
        self._send(KIND_NOTIFY, 0, frames, hold)

    def _send(self, kind: int, request_id: int, frames: list[Any], hold: bool = False) -> None:
        self.bytes_sent += _PREFIX.size + (
            _frame_len(frames[0]) if len(frames) == 1 else sum(_frame_len(f) for f in frames))
        self._outbox.send(b"", kind, request_id, frames, hold)

    def _send_failed(self, exc: BaseException, entries: list[tuple[int, int]]) -> None:
        for kind, request_id in entries:
            fut = self._pending.pop(request_id, None) if kind == KIND_REQUEST else None
            if fut is not None and not fut.done():
                fut.set_exception(exc)

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
        self._outbox.flush()  # notifications made in this iteration still go out
        self._async.close()
