"""A thin asyncio adapter over plain (blocking-API) ZeroMQ sockets.

``zmq.asyncio`` wakes the event loop once per message; measured on this machine that caps
it at ~14-21k calls/s. Here the loop watches the socket's file descriptor and, on each
wake-up, drains every ready message with non-blocking receives, and sends go straight to
the socket (non-blocking) with a backlog only when the high-water mark is hit. ZeroMQ's FD
is edge-triggered, so after sends the socket's ``EVENTS`` are re-checked (once per loop
iteration, however many messages were sent in it) and pending input is drained.

Frames go through pyzmq's compiled ``send``/``recv`` directly: its Python-level
``send_multipart``/``recv_multipart`` and ``getsockopt`` cost ~6-10 us per message here
(an enum conversion per option read, a ``RCVMORE`` read per frame), about what libzmq
itself needs to move a small message.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlparse

import zmq
from zmq.backend import Socket as _BackendSocket

log = logging.getLogger(__name__)

_send = _BackendSocket.send
_recv = _BackendSocket.recv
_get = _BackendSocket.get
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK

_context: zmq.Context | None = None
_context_pid: int | None = None


def context() -> zmq.Context:
    """The process's single ZeroMQ context (recreated after a fork, never shared)."""
    global _context, _context_pid
    if _context is None or _context_pid != os.getpid():
        _context = zmq.Context()
        _context_pid = os.getpid()
    return _context


def install_event_loop_policy() -> None:
    """Use uvloop when it is installed (Linux); the default asyncio loop otherwise."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(ImportError):
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop when installed, else asyncio's default."""
    if sys.platform.startswith("linux"):
        try:
            import uvloop

            return uvloop.new_event_loop()
        except ImportError:
            pass
    return asyncio.new_event_loop()


def is_loopback_address(address: str) -> bool:
    """True for ``ipc://``/``inproc://`` endpoints and tcp on 127.0.0.0/8, ::1 or localhost."""
    parsed = urlparse(address)
    if parsed.scheme in ("ipc", "inproc"):
        return True
    host = parsed.hostname or ""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def local_bind_problem(host: str) -> str | None:
    """Why ``host`` cannot be bound on this machine (the OS's reason, e.g. "Cannot assign
    requested address" for an IP of another host), or None when it can or is not checked.

    Only IP literals are checked (bracketed IPv6 included); wildcards (``*``, ``0.0.0.0``,
    ``::``) and names are not (checking a name would resolve it). The check binds a plain
    TCP socket to ``(host, 0)`` and closes it: nothing is sent, to any address."""
    literal = host.strip("[]")
    try:
        ip = ipaddress.ip_address(literal)
    except ValueError:
        return None
    if ip.is_unspecified:
        return None
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((literal, 0))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


class AsyncSocket:
    """A ZeroMQ socket driven by the running event loop.

    ``on_message(frames)`` is called on the loop for every received multipart message
    (frames are ``zmq.Frame`` objects, received without copying). ``send(frames)`` never
    blocks: if ZeroMQ refuses with EAGAIN (high-water mark), frames wait in an in-process
    backlog, bounded by ``max_backlog`` messages, beyond which sends raise ``zmq.Again``.
    """

    def __init__(self, sock: zmq.Socket, on_message: Callable[[list[Any]], None],
                 loop: asyncio.AbstractEventLoop | None = None,
                 max_backlog: int = 100_000) -> None:
        self.sock = sock
        self.loop = loop or asyncio.get_running_loop()
        self._on_message = on_message
        self._backlog: deque[Sequence[Any]] = deque()
        self._max_backlog = max_backlog
        self._drain_scheduled = False
        self._closed = False
        self._fd = sock.getsockopt(zmq.FD)
        self.loop.add_reader(self._fd, self._on_ready)
        # Messages may already be queued before the reader was registered.
        self._schedule_drain()

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled and not self._closed:
            self._drain_scheduled = True
            self.loop.call_soon(self._on_ready)

    def drain(self) -> None:
        """Handle every message already received, now (before a peer is declared lost, so
        a reply that arrived first is not failed)."""
        self._on_ready()

    def _on_ready(self) -> None:
        self._drain_scheduled = False
        if self._closed:
            return
        sock = self.sock
        on_message = self._on_message
        try:
            while True:
                if self._backlog:
                    self._flush_backlog()
                if not _get(sock, _EVENTS) & _POLLIN:
                    break
                # A multipart message is delivered whole: once its first frame is here,
                # so are the others (``more`` is read off the frame, no getsockopt).
                frame = _recv(sock, _NOBLOCK, copy=False)
                frames = [frame]
                while frame.more:
                    frame = _recv(sock, _NOBLOCK, copy=False)
                    frames.append(frame)
                try:
                    on_message(frames)
                except Exception:  # a handler bug must never stop the socket
                    log.exception("message handler failed")
                if self._closed:
                    return
        except zmq.Again:
            pass
        except zmq.ZMQError as exc:
            if not self._closed:
                log.warning("socket error while draining: %s", exc)
        if self._backlog and not self._closed:
            # A ROUTER reports POLLOUT even when one peer's pipe is full, so the FD may not
            # wake us when that pipe drains: retry shortly while a backlog exists.
            self.loop.call_later(0.001, self._schedule_drain)

    def _send_now(self, frames: Sequence[Any]) -> None:
        sock = self.sock
        last = len(frames) - 1
        # Only the first frame can be refused (EAGAIN at the high-water mark): libzmq
        # takes the rest of a multipart message once it took its first frame.
        for i in range(last):
            _send(sock, frames[i], _SNDMORE_NOBLOCK, copy=False)
        _send(sock, frames[last], _NOBLOCK, copy=False)

    def _flush_backlog(self) -> None:
        while self._backlog:
            try:
                self._send_now(self._backlog[0])
            except zmq.Again:
                return
            self._backlog.popleft()

    def send(self, frames: Sequence[Any]) -> None:
        """Queue ``frames`` (bytes, memoryviews or ``zmq.Frame``; at least one) for sending
        (zero-copy for large frames); never blocks."""
        if self._closed:
            raise zmq.ZMQError(zmq.ENOTSOCK, "socket is closed")
        if self._backlog:
            if len(self._backlog) >= self._max_backlog:
                raise zmq.Again("send backlog full")
            self._backlog.append(frames)
        else:
            try:
                self._send_now(frames)
            except zmq.Again:
                self._backlog.append(frames)
        # Edge-triggered FD: a send can consume the readiness edge of pending input. One
        # check per loop iteration covers every send made in it.
        self._schedule_drain()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def backlog(self) -> int:
        """Messages waiting in the in-process send backlog."""
        return len(self._backlog)

    def close(self, linger_ms: int = 0) -> None:
        """Stop watching and close the socket."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self._fd)
        self.sock.close(linger=linger_ms)
