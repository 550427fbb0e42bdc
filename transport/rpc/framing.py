"""The RPC wire format: message kinds, request ids, batches, frame sizes.

Every message (after the ROUTER identity frame on the server side)::

    frame 0: prefix  = kind (u8) + request id (u64, little endian)
    frame 1: codec header (msgpack)            -- see transport.codec
    frame 2..: zero-copy array buffers

A request's codec body is ``[method, args, kwargs]``; a reply's is the value (kind OK) or a
:class:`~transport.errors.RemoteError` record (kind ERROR). Kind NOTIFY is a request that
wants no reply.

Kind BATCH carries several header-only messages to one peer in one ZeroMQ message (every
ZeroMQ message costs a wake-up of libzmq's I/O threads on both sides, the largest share of
a small call's CPU here)::

    frame 0: prefix = KIND_BATCH + count (u64)
    frame 1: table  = count x (kind u8, request id u64, header length u32)
    frame 2: the count codec headers, concatenated

Each entry is then handled exactly as the message ``[prefix(kind, id), header]`` would be
(same checks, same order). Which messages go in batches is the sender's choice
(:mod:`transport.rpc.outbox`).

Two bits of a request id say what its client accepts: :data:`BATCH_ID_BIT`, batched
replies; :data:`LOCAL_ID_BIT`, shared-memory handles (:mod:`transport.shm`) in the reply,
from a client on this host (``RpcClient(shm=True)`` over ipc) whose request may carry them
too.

Frame sizes: ``max_frame_bytes`` (``ZMQ_MAXMSGSIZE``, on every server and client socket) is
enforced by libzmq before Python sees anything: a peer that announces a frame larger than
this is disconnected when libzmq reads the frame's size, before any of it is buffered; this
holds before CURVE authentication too (the handshake commands go through the same
decoder). libzmq applies it per frame, not per multipart message. The default,
:data:`DEFAULT_MAX_FRAME_BYTES`, is the largest frame a default
:class:`~transport.codec.Codec` ever sends: an array frame of up to ``MAX_ARRAY_BYTES``
(2 GiB - 1; a header frame is at most ``max_header_bytes``, 1 MiB). Processes that send
larger arrays (``Codec(allow_large=True)``) must raise it on both ends; processes that only
ever receive control messages can lower it.
"""

from __future__ import annotations

import struct
from typing import Any

import zmq

from transport.codec import DEFAULT_MAX_HEADER_BYTES, MAX_ARRAY_BYTES, Codec

KIND_REQUEST = 1
KIND_NOTIFY = 2
KIND_OK = 3
KIND_ERROR = 4
KIND_BATCH = 5
MAX_BATCH = 1024
"""The most messages one batch carries (a longer one is refused whole)."""
LOCAL_ID_BIT = 1 << 63
"""Set in the request ids of a client on this host that takes shared-memory handles."""
BATCH_ID_BIT = 1 << 62
"""Set in the request ids of a client that reads batched replies (:data:`KIND_BATCH`);
servers batch only replies to such requests (every server reads batched requests)."""
MESSAGE_PREFIX = struct.Struct("<BQ")
"""Frame 0 of every message: kind (u8) and request id, or a batch's count (u64)."""
_BATCH_ENTRY = struct.Struct("<BQI")
DEFAULT_MAX_FRAME_BYTES = max(MAX_ARRAY_BYTES, DEFAULT_MAX_HEADER_BYTES)
"""``ZMQ_MAXMSGSIZE`` of every socket: the largest frame a default Codec sends (one array
of up to 2 GiB - 1; headers are capped at 1 MiB). Larger frames are dropped by libzmq, with
the connection, before they are buffered."""


def frame_len(frame: Any) -> int:
    """Bytes of ``frame`` (a received :class:`zmq.Frame` or a buffer to send)."""
    if isinstance(frame, zmq.Frame):
        return len(frame)
    return memoryview(frame).nbytes


def frames_len(frames: list[Any]) -> int:
    """Bytes of all ``frames`` (one frame, the common case, costs no generator)."""
    if len(frames) == 1:
        return frame_len(frames[0])
    return sum(frame_len(f) for f in frames)


def _frame_bytes(frame: Any) -> bytes:
    return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)


def pack_batch(entries: list[tuple[int, int, Any]]) -> tuple[bytes, bytes, bytes]:
    """The frames ``(prefix, table, headers)`` of a batch of ``entries`` (``(kind, request
    id, header)``, at most :data:`MAX_BATCH`): what :func:`split_batch` reads."""
    table = b"".join([_BATCH_ENTRY.pack(kind, request_id, len(header))
                      for kind, request_id, header in entries])
    return (MESSAGE_PREFIX.pack(KIND_BATCH, len(entries)), table,
            b"".join([header for _, _, header in entries]))


def split_batch(frames: list[Any]) -> list[tuple[int, int, memoryview]]:
    """The ``(kind, request id, header)`` entries of a received batch ``[prefix, table,
    headers]`` (the identity frame removed); ValueError when it is malformed (wrong frame
    count, a count of 0 or above :data:`MAX_BATCH`, a table that does not match, lengths
    that do not add up to the headers frame)."""
    if len(frames) != 3:
        raise ValueError(f"batch of {len(frames)} frames (expected 3)")
    count = MESSAGE_PREFIX.unpack(_frame_bytes(frames[0]))[1]
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


def decode_body(codec: Codec, frames: list[Any], local: bool) -> tuple[Any, int]:
    """The value a message body (``[header, *buffers]``) encodes, and how many of its bytes
    were read through shared memory. Only a ``local`` body (from a process of this host
    over ipc, as its request id or the client says) may carry shared-memory handles; in
    any other a handle is a DecodeError, like anything malformed."""
    if not local:
        return codec.decode(frames), 0
    value = codec.decode(frames, allow_shm=True)
    return value, codec.take_shm_bytes()
