"""Errors raised by the actor runtime.

Each is registered with :mod:`transport.error_types`, so one raised in an actor (or in a
coordinator or node agent) reaches the caller as that type too: ``except ObjectLostError``
catches a remote ``ObjectLostError`` (which is also a :class:`RemoteError` carrying the
remote traceback).
"""

from __future__ import annotations

from transport.error_types import register_error
from transport.errors import RemoteError

__all__ = [
    "ActorCreationError",
    "ActorDiedError",
    "GetTimeoutError",
    "ObjectLostError",
    "RemoteError",
    "RuntimeNotStartedError",
]


@register_error
class ActorDiedError(RuntimeError):
    """The actor that was running a call (or owning an object) died before answering."""


@register_error
class ObjectLostError(ActorDiedError):
    """An object is gone: freed, or its owner process died."""


@register_error
class ActorCreationError(RuntimeError):
    """An actor process could not be started or its constructor raised."""


@register_error
class GetTimeoutError(TimeoutError):
    """``get``/``wait`` ran past its timeout."""


@register_error
class RuntimeNotStartedError(RuntimeError):
    """The runtime API was used before ``actorrl.runtime.init()``."""
