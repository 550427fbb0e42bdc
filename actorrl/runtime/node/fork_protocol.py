"""The messages between a node and its fork server, defined once for both sides.

They travel over a ``SOCK_SEQPACKET`` socket pair, one msgpack list per message: a tag,
then the message's fields in order. The node sends :class:`ForkRequest` (and
:class:`LogTo` when a new node takes over a kept server); the server sends
:class:`Ready` once its imports finish, :class:`Forked` (with a pidfd of the child attached
by ``SCM_RIGHTS``) or :class:`ForkFailed` per request, and :class:`Exited` when it reaps a
child. This module imports only the standard library and msgpack, so the server loads it
before anything it preloads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

MAX_MESSAGE_BYTES = 1 << 20
"""The largest message either side sends or reads (a fork request carries the actor's
whole environment)."""


@dataclass(frozen=True)
class Ready:
    """Server -> node: imports done, fork requests are served from now on."""

    TAG: ClassVar[str] = "ready"
    pid: int
    preloaded: list[str]
    import_seconds: float


@dataclass(frozen=True)
class ForkRequest:
    """Node -> server: fork a process running ``actor_main`` with ``argv``, exactly the
    environment ``environ``, and its output appended to ``log_path``, for an actor of
    ``class_path`` (the server first imports what that class lists in ``FORK_PRELOAD``, if
    the server has the class's module loaded)."""

    TAG: ClassVar[str] = "fork"
    request_id: int
    argv: list[str]
    environ: dict[str, str]
    log_path: str
    class_path: str = ""


@dataclass(frozen=True)
class LogTo:
    """Node -> server: append the server's own output to ``log_path`` from now on (a
    server kept by a process between two of its nodes writes into the new node's logs)."""

    TAG: ClassVar[str] = "log_to"
    log_path: str


@dataclass(frozen=True)
class Forked:
    """Server -> node: request ``request_id`` runs as ``pid`` (its pidfd is attached)."""

    TAG: ClassVar[str] = "forked"
    request_id: int
    pid: int


@dataclass(frozen=True)
class ForkFailed:
    """Server -> node: request ``request_id`` could not be forked, and why."""

    TAG: ClassVar[str] = "failed"
    request_id: int
    reason: str


@dataclass(frozen=True)
class Exited:
    """Server -> node: child ``pid`` exited and was reaped; ``returncode`` as
    :attr:`subprocess.Popen.returncode` (negative for a signal)."""

    TAG: ClassVar[str] = "exited"
    pid: int
    returncode: int


Message = Ready | ForkRequest | LogTo | Forked | ForkFailed | Exited
"""Any message of the protocol."""

_BY_TAG: dict[str, type[Message]] = {cls.TAG: cls for cls in
                                     (Ready, ForkRequest, LogTo, Forked, ForkFailed, Exited)}


class ProtocolError(ValueError):
    """Bytes that are no message of this protocol (or one too large to send)."""


def encode(message: Message) -> bytes:
    """``message`` as the bytes of one packet; :class:`ProtocolError` if it is over
    :data:`MAX_MESSAGE_BYTES`."""
    data = msgpack.packb([message.TAG, *(getattr(message, f.name)
                                         for f in dataclasses.fields(message))])
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"a fork-server {message.TAG!r} message of {len(data)} bytes is "
                            f"over the {MAX_MESSAGE_BYTES}-byte cap (a very large actor "
                            "environment?)")
    return data


def decode(data: bytes) -> Message:
    """The message in one packet; :class:`ProtocolError` when it is none."""
    try:
        fields: Any = msgpack.unpackb(data)
    except Exception as exc:
        raise ProtocolError(f"undecodable fork-server message: {exc}") from None
    cls = _BY_TAG.get(fields[0]) if isinstance(fields, list) and fields \
        and isinstance(fields[0], str) else None
    if cls is None:
        raise ProtocolError(f"unknown fork-server message {fields!r:.100}")
    try:
        return cls(*fields[1:])
    except TypeError:
        raise ProtocolError(f"malformed fork-server {cls.TAG!r} message {fields!r:.100}"
                            ) from None
