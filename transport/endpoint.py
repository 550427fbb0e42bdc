"""Endpoints that say how to reach a process from anywhere in a cluster.

A plain endpoint is a ZeroMQ address (``ipc://...`` or ``tcp://host:port``). A process that
other hosts must reach publishes a *composite* endpoint: its tcp address plus, separated by
``|``, the facts a caller needs to connect::

    tcp://10.0.0.5:41234|k=<z85 CURVE server key>|n=<node tag>|l=ipc:///tmp/s/actor-1.sock

- ``k``: the server's CURVE public key (present when the tcp side is encrypted);
- ``n`` and ``l``: processes on the same node (same tag) connect to the ipc address ``l``
  instead, unencrypted and faster (same-host peers use ipc, other hosts tcp).

Composite endpoints travel inside ObjectRefs and actor handles, so any process holding a
ref can fetch straight from its owner without a directory lookup. ``|`` never occurs in
z85 keys, tcp addresses or the ipc paths actorrl makes.
"""

from __future__ import annotations

from dataclasses import dataclass

SEPARATOR = "|"


@dataclass(frozen=True)
class Endpoint:
    """A parsed (possibly composite) endpoint."""

    address: str
    """The address other nodes connect to (tcp), or the only address (plain endpoints)."""
    server_key: bytes | None = None
    """z85 CURVE public key of the server, when ``address`` needs CURVE."""
    node: str | None = None
    """Tag of the node the process runs on."""
    local: str | None = None
    """ipc address for callers on the same node."""

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """Parse ``text``; raises ValueError on an unknown or malformed field."""
        address, *fields = text.split(SEPARATOR)
        if not address:
            raise ValueError(f"endpoint {text!r} has no address")
        values: dict[str, str] = {}
        for item in fields:
            key, sep, value = item.partition("=")
            if not sep or key not in ("k", "n", "l") or not value:
                raise ValueError(f"endpoint {text!r} has a malformed field {item!r}")
            values[key] = value
        key_text = values.get("k")
        return cls(address, key_text.encode() if key_text else None, values.get("n"),
                   values.get("l"))

    def __str__(self) -> str:
        parts = [self.address]
        if self.server_key is not None:
            parts.append(f"k={self.server_key.decode()}")
        if self.node is not None:
            parts.append(f"n={self.node}")
        if self.local is not None:
            parts.append(f"l={self.local}")
        for part in parts:
            if part.count(SEPARATOR):
                raise ValueError(f"endpoint part {part!r} contains {SEPARATOR!r}")
        return SEPARATOR.join(parts)

    def route(self, from_node: str | None) -> tuple[str, bytes | None]:
        """Where a caller on node ``from_node`` connects: ``(address, server_key)`` with
        ``server_key`` None for an unencrypted connection."""
        if self.local is not None and self.node is not None and self.node == from_node:
            return self.local, None
        return self.address, self.server_key


def is_composite(text: str) -> bool:
    """True when ``text`` carries more than a bare ZeroMQ address."""
    return SEPARATOR in text


def short(text: str) -> str:
    """The address part of an endpoint, for messages and reprs."""
    return text.split(SEPARATOR, 1)[0]
