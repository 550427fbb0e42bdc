"""Request/reply over ROUTER/DEALER with request ids, so many calls share one connection.

The files, by job:

- :mod:`~transport.rpc.framing`: the wire format (message kinds, request id bits,
  batches, frame sizes) and decoding a message body.
- :mod:`~transport.rpc.outbox`: sending a connection's messages, small ones in batches.
- :mod:`~transport.rpc.server`: :class:`RpcServer` and the :class:`Request` its handler
  gets; input checks and the server's socket limits.
- :mod:`~transport.rpc.client`: :class:`RpcClient`, one connection to a server.

Every name below is importable from ``transport.rpc``.
"""

from transport.rpc.client import RpcClient
from transport.rpc.framing import (
    BATCH_ID_BIT,
    DEFAULT_MAX_FRAME_BYTES,
    KIND_BATCH,
    KIND_ERROR,
    KIND_NOTIFY,
    KIND_OK,
    KIND_REQUEST,
    LOCAL_ID_BIT,
    MAX_BATCH,
    split_batch,
)
from transport.rpc.outbox import BATCH_ITEM_BYTES, Outbox
from transport.rpc.server import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_PEERS,
    ZAP_DOMAIN,
    Request,
    RequestHandler,
    RpcServer,
    caller_of,
    ipc_peer,
)

__all__ = [
    "BATCH_ID_BIT",
    "BATCH_ITEM_BYTES",
    "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_PEERS",
    "KIND_BATCH",
    "KIND_ERROR",
    "KIND_NOTIFY",
    "KIND_OK",
    "KIND_REQUEST",
    "LOCAL_ID_BIT",
    "MAX_BATCH",
    "ZAP_DOMAIN",
    "Outbox",
    "Request",
    "RequestHandler",
    "RpcClient",
    "RpcServer",
    "caller_of",
    "ipc_peer",
    "split_batch",
]
