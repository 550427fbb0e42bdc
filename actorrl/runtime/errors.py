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
    """An actor process could not be started or its constructor raised.

    ``reason`` says what failed, in one line or a few; when the failed process left a log,
    ``log_path`` names it and the message goes on with the log's tail (``log_tail``), so
    a summary can show the reason alone. (Raised on the caller's side of a call, a remote
    one is a :class:`RemoteError` whose ``message`` is the whole text.)
    """

    reason: str = ""
    log_path: str | None = None

    def __init__(self, reason: str, *, log_path: str | None = None,
                 log_tail: str = "") -> None:
        message = reason if log_path is None else \
            f"{reason}; its log ({log_path}) ends with:\n{log_tail}"
        super().__init__(message)
        self.reason = reason
        self.log_path = log_path


@register_error
class GetTimeoutError(TimeoutError):
    """``get``/``wait`` ran past its timeout."""


@register_error
class RuntimeNotStartedError(RuntimeError):
    """The runtime API was used before ``actorrl.runtime.init()``."""
