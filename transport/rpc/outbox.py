"""Sending a connection's messages, small ones coalesced into batches.

A connection sends a batch (:data:`~transport.rpc.framing.KIND_BATCH`) when several small
messages to one peer are made in one event-loop iteration: the first goes out at once, the
rest at the end of the iteration (:class:`Outbox`). A server batches only replies to
requests whose id has :data:`~transport.rpc.framing.BATCH_ID_BIT` set (an
:class:`~transport.rpc.client.RpcClient` sets it; a bare ZeroMQ peer does not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from transport.rpc.framing import (
    BATCH_ID_BIT,
    MAX_BATCH,
    MESSAGE_PREFIX,
    frame_len,
    pack_batch,
)
from transport.sockets import AsyncSocket

BATCH_ITEM_BYTES = 16 * 1024
"""Header-only messages up to this size are coalesced into batches; larger ones and
messages with array frames go alone (after the peer's earlier waiting messages)."""


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
                sock.send(self._message(peer, MESSAGE_PREFIX.pack(kind, request_id), frames))
                return
        if sock.closed:
            raise zmq.ZMQError(zmq.ENOTSOCK, "socket is closed")
        if (len(frames) == 1 and request_id & self._batch_mask == self._batch_mask
                and frame_len(frames[0]) <= BATCH_ITEM_BYTES):
            waiting = self._waiting.get(peer)
            if waiting is None:
                self._waiting[peer] = [(kind, request_id, frames[0])]
            else:
                waiting.append((kind, request_id, frames[0]))
            return
        if peer in self._waiting:
            self._flush_peer(peer, self._waiting.pop(peer))
        sock.send(self._message(peer, MESSAGE_PREFIX.pack(kind, request_id), frames))

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
                    self._sock.send(self._message(peer, MESSAGE_PREFIX.pack(kind, request_id),
                                                  [header]))
                    continue
                prefix, table, headers = pack_batch(chunk)
                self._sock.send(self._message(peer, prefix, [table, headers]))
        except (zmq.ZMQError, OSError) as exc:
            sent = start  # chunks before this one went out
            self._on_failed(exc, [(k, r) for k, r, _ in entries[sent:]])
