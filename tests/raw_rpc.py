"""Raw DEALER-side helpers for tests that speak the RPC wire format by hand."""

from __future__ import annotations

import struct
import time
from typing import Any

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
