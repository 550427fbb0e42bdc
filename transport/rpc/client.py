"""The RPC client: a DEALER connection to one server, many calls in flight.

Calls are matched to replies by request id (:mod:`transport.rpc.framing`); every id
carries :data:`~transport.rpc.framing.BATCH_ID_BIT` (the server may batch the replies), and
over ipc with ``shm=True`` also :data:`~transport.rpc.framing.LOCAL_ID_BIT`: the call's
big arrays may go as shared-memory handles (:mod:`transport.shm`), and so may the
reply's. Small messages made in one event-loop iteration go out in batches
(:mod:`transport.rpc.outbox`). A lost, refused or unauthenticated connection fails the
pending calls with a :class:`~transport.errors.TransportError` naming the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import struct
from collections.abc import Callable, Iterable
from typing import Any

import zmq

import transport.rpc.framing as framing
from transport.codec import Codec, DecodeError
from transport.errors import (
    AuthenticationError,
    CallTimeoutError,
    PeerLostError,
    RemoteError,
    ServerFullError,
    TransportError,
)
from transport.rpc.outbox import Outbox
from transport.shm.placers import CallPlacer
from transport.sockets import AsyncSocket, context

log = logging.getLogger(__name__)


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
                 max_frame_bytes: int | None = framing.DEFAULT_MAX_FRAME_BYTES,
                 shm: bool = False, refused_is_lost: bool = False) -> None:
        """``max_frame_bytes``: ``ZMQ_MAXMSGSIZE``, the largest reply frame libzmq reads
        (a server sending more is disconnected; None: no limit). ``shm``: over ipc, say
        so in every request (:data:`framing.LOCAL_ID_BIT`) and accept shared-memory handles in the
        replies (:mod:`transport.shm`). ``refused_is_lost``: a refused connect attempt
        (nothing listens at the endpoint) fails the calls at once instead of being retried
        until ``connect_timeout_s``; for probing a peer believed to be there, not for
        connecting to one that may still be starting."""
        self.endpoint = endpoint
        self.local = shm and endpoint.startswith("ipc://")
        """Request ids carry framing.LOCAL_ID_BIT and replies may carry shm handles."""
        self._id_flag = (framing.LOCAL_ID_BIT if self.local else 0) | framing.BATCH_ID_BIT
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
        self.bytes_received += framing.frames_len(frames)
        if len(frames) < 2 or len(frames[0]) != framing.MESSAGE_PREFIX.size:
            log.warning("dropped malformed reply from %s", self.endpoint)
            return
        kind, request_id = framing.MESSAGE_PREFIX.unpack(frames[0].bytes)
        if kind == framing.KIND_BATCH:
            try:
                entries = framing.split_batch(frames)
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
            value, shm_bytes = framing.decode_body(self.codec, body_frames, self.local)
        except DecodeError as exc:
            fut.set_exception(exc)
            return
        if shm_bytes:
            self.bytes_received += shm_bytes
            self.shm_bytes_received += shm_bytes
        if kind == framing.KIND_OK:
            fut.set_result(value)
        elif kind == framing.KIND_ERROR and isinstance(value, RemoteError):
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
            self._send(framing.KIND_REQUEST, request_id, frames)
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
        self._send(framing.KIND_NOTIFY, 0, frames, hold)

    def _send(self, kind: int, request_id: int, frames: list[Any], hold: bool = False) -> None:
        self.bytes_sent += framing.MESSAGE_PREFIX.size + framing.frames_len(frames)
        self._outbox.send(b"", kind, request_id, frames, hold)

    def _send_failed(self, exc: BaseException, entries: list[tuple[int, int]]) -> None:
        for kind, request_id in entries:
            fut = self._pending.pop(request_id, None) if kind == framing.KIND_REQUEST else None
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
