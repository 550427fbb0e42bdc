"""Hand-built wire input for tests: raw DEALER-side reply collection and crafted
msgpack (hash-colliding maps)."""

from __future__ import annotations

import struct
import time
from typing import Any

import msgpack
import zmq

from transport.codec import Codec
from transport.rpc import KIND_ERROR, KIND_OK

PREFIX = struct.Struct("<BQ")
"""Message kind and request id, the first frame of every RPC message."""
_codec = Codec()


def collect_replies(sock: zmq.Socket, ids: set[int], timeout_s: float,
                    names: dict[int, str] | None = None) -> dict[int, tuple[int, Any]]:
    """Receive until every id in ``ids`` is answered; every reply must be well formed
    (``names`` describe the requests in the failure message). Returns ``{id: (kind,
    decoded value)}`` in arrival order."""
    replies: dict[int, tuple[int, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while not ids <= replies.keys():
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0 or not sock.poll(left_ms):
            missing = sorted(ids - replies.keys())[:10]
            raise AssertionError(f"no reply within {timeout_s} s to "
                                 f"{[(names or {}).get(i, i) for i in missing]}; got "
                                 f"replies for {sorted(replies)[:10]}")
        frames = sock.recv_multipart(copy=False)
        assert len(frames) >= 2 and len(frames[0]) == PREFIX.size, "malformed reply"
        kind, rid = PREFIX.unpack(frames[0].bytes)
        assert kind in (KIND_OK, KIND_ERROR), kind
        assert rid not in replies, f"two replies to request {rid}"
        replies[rid] = (kind, _codec.decode(frames[1:]))
    return replies


def colliding_key_map(count: int) -> bytes:
    """A msgpack map whose ``count`` keys are distinct lists of -1/-2 (hash(-1) ==
    hash(-2) in CPython, so every such tuple has the same hash)."""
    width = max(1, (count - 1).bit_length())
    packer = msgpack.Packer()
    out = bytearray(packer.pack_map_header(count))
    for i in range(count):
        out += packer.pack([-1 - ((i >> bit) & 1) for bit in range(width)]) + packer.pack(0)
    return bytes(out)
