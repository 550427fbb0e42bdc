"""Errors raised by the actor runtime."""

from __future__ import annotations

from transport.errors import RemoteError

__all__ = [
    "ActorCreationError",
    "ActorDiedError",
    "GetTimeoutError",
    "ObjectLostError",
    "RemoteError",
    "RuntimeNotStartedError",
]


class ActorDiedError(RuntimeError):
    """The actor that was running a call (or owning an object) died before answering."""


class ObjectLostError(ActorDiedError):
    """An object is gone: freed, or its owner process died."""


class ActorCreationError(RuntimeError):
    """An actor process could not be started or its constructor raised."""


class GetTimeoutError(TimeoutError):
    """``get``/``wait`` ran past its timeout."""


class RuntimeNotStartedError(RuntimeError):
    """The runtime API was used before ``actorrl.runtime.init()``."""
