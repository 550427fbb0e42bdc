"""The RPC server: a ROUTER socket that dispatches requests to a handler.

A :class:`RpcServer` hands each request (:class:`Request`) to its handler on the event
loop; the handler replies through the request, now or later. The wire format is
:mod:`transport.rpc.framing`'s; replies to clients that read batches are coalesced
(:mod:`transport.rpc.outbox`).

The server never dies of bad input: a message it cannot parse is answered with an error
when its request id can be read, and dropped and logged otherwise; oversize messages
(``max_message_bytes``, default :data:`DEFAULT_MAX_MESSAGE_BYTES`) are refused with an
error reply before decoding. A request whose id has
:data:`~transport.rpc.framing.LOCAL_ID_BIT` set may carry shared-memory handles
(:mod:`transport.shm`), and so may its reply; the server accepts handles only in such
requests, and only from a peer that reached it over ipc (checked per message when the
server also has tcp binds).

Socket-level limits (what libzmq enforces before Python sees anything), besides
``max_frame_bytes`` (:mod:`transport.rpc.framing`):

- ``handshake_timeout_s`` (``ZMQ_HANDSHAKE_IVL``): a connection that has not completed the
  ZMTP (and CURVE) handshake within this time is closed, so idle unauthenticated
  connections do not hold file descriptors for long.
- ``max_peers`` (servers with a CURVE bind): libzmq has no cap on the peers of a ROUTER
  and no call that closes one accepted connection, but it asks the ZAP handler about
  every handshake. :attr:`RpcServer.peers` counts open connections (socket monitor), and
  past ``max_peers`` the ZAP handler refuses the handshake (status 500, "too many
  peers": :class:`transport.auth.PeerGate`), so libzmq closes the connection; the client
  gets :class:`~transport.errors.ServerFullError`. The cap is lowered to fit the fd limit
  (:func:`transport.limits.peer_budget`). The count is updated on the event loop, so a
  burst can pass the cap by the accepts the loop has not seen yet (the connection being
  handshaken, typically). Connections that never handshake are not seen
  by ZAP: ``handshake_timeout_s`` closes them. Keyless servers (ipc, an insecure loopback
  bind) have no ZAP handshake and only get a warning past the cap.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import zmq

import transport.rpc.framing as framing
from transport.auth import PeerGate, current_authenticator, parse_user_id
from transport.codec import Codec, DecodeError, EncodeError
from transport.errors import RemoteError
from transport.limits import peer_budget
from transport.rpc.outbox import Outbox
from transport.shm.placers import Placer
from transport.sockets import AsyncSocket, context

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024**3
"""The largest message (all body frames together) a server decodes by default."""
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
"""Servers close connections that have not finished the ZMTP/CURVE handshake by then
(libzmq's default is 30 s)."""
DEFAULT_MAX_PEERS = 1000
"""Past this many open connections a CURVE server refuses new handshakes (see the module
docstring); a keyless one logs a warning."""
ZAP_DOMAIN = b"actorrl"
_IPC_PEER = re.compile(r"[^:]*:(\d+):\d+:\d+")
_server_ids = itertools.count(1)


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
                 max_frame_bytes: int | None = framing.DEFAULT_MAX_FRAME_BYTES,
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
        self.bytes_received += framing.frames_len(frames)
        if len(frames) < 2:
            self.messages_dropped += 1
            log.warning("dropped malformed message: %d frames", len(frames))
            return
        peer = frames[0].bytes
        prefix = frames[1].bytes
        if len(prefix) != framing.MESSAGE_PREFIX.size:
            self.messages_dropped += 1
            log.warning("dropped message with a malformed %d-byte prefix", len(prefix))
            return
        kind, request_id = framing.MESSAGE_PREFIX.unpack(prefix)
        if kind == framing.KIND_BATCH:
            try:
                entries = framing.split_batch(frames[1:])
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
        if request_id & framing.LOCAL_ID_BIT and kind == framing.KIND_REQUEST:
            local = not self._remote_binds or ipc_peer(prefix_frame)
        elif kind not in (framing.KIND_REQUEST, framing.KIND_NOTIFY):
            self.messages_dropped += 1
            log.warning("dropped message of unknown kind %d", kind)
            return
        wants_reply = kind == framing.KIND_REQUEST
        if not body_frames:
            self._refuse(peer, request_id, wants_reply, DecodeError("request has no body"))
            return
        size = framing.frames_len(body_frames)
        if size > self.max_message_bytes:
            self._refuse(peer, request_id, wants_reply, ValueError(
                f"message of {size} bytes exceeds this server's limit of "
                f"{self.max_message_bytes} bytes"))
            return
        try:
            body, shm_bytes = framing.decode_body(self.codec, body_frames, local)
            if shm_bytes:
                self.bytes_received += shm_bytes
                self.shm_bytes_received += shm_bytes
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
        self._send(peer, framing.KIND_OK, request_id, frames)

    def send_encoded_reply(self, peer: bytes, request_id: int, frames: list[Any]) -> None:
        """Send a successful reply encoded beforehand (see :meth:`Request.reply_encoded`)."""
        self._send(peer, framing.KIND_OK, request_id, frames)

    def send_error(self, peer: bytes, request_id: int, error: RemoteError) -> None:
        """Send an error reply."""
        self._send(peer, framing.KIND_ERROR, request_id, self.codec.encode(error))

    def _send(self, peer: bytes, kind: int, request_id: int, frames: list[Any]) -> None:
        if self._async is None:
            return
        self.bytes_sent += len(peer) + framing.MESSAGE_PREFIX.size + framing.frames_len(frames)
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
