"""Errors that cross the wire, and the transport's own failures."""

from __future__ import annotations

import traceback

from transport.codec import register_type


class TransportError(Exception):
    """Base class of transport failures."""


class PeerLostError(TransportError):
    """The peer of a call went away (disconnected, or never reachable) before replying."""


class CallTimeoutError(TransportError, TimeoutError):
    """A call's deadline passed before its reply arrived."""


class RemoteError(Exception):
    """An exception raised on the remote side of a call.

    ``type_name`` is the remote exception's qualified class name, ``message`` its text and
    ``remote_traceback`` the formatted remote traceback.
    """

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(type_name, message, remote_traceback)
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback

    @classmethod
    def from_exception(cls, exc: BaseException) -> RemoteError:
        """Capture ``exc`` (with its traceback) as a record that can be sent."""
        if isinstance(exc, RemoteError):
            return exc
        name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        if type(exc).__module__ == "builtins":
            name = type(exc).__qualname__
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(name, str(exc), tb)

    def __str__(self) -> str:
        text = f"{self.type_name}: {self.message}"
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return text


register_type(
    RemoteError,
    "transport.RemoteError",
    lambda e: [e.type_name, e.message, e.remote_traceback],
    lambda s: RemoteError(s[0], s[1], s[2]),
)
