"""Errors that cross the wire, and the transport's own failures."""

from __future__ import annotations

import traceback
import types

from transport.codec import register_type
from transport.error_types import error_type_name, registered_error


class TransportError(Exception):
    """Base class of transport failures."""


class PeerLostError(TransportError):
    """The peer of a call went away (disconnected, or never reachable) before replying."""


class AuthenticationError(PeerLostError):
    """A CURVE handshake failed: the server refused this client's key
    (``key_refused``), or dropped the handshake (most likely: the client was given a
    server public key that is not the server's). Retrying without changing keys does not
    help."""

    def __init__(self, message: str, *, key_refused: bool = False) -> None:
        super().__init__(message)
        self.key_refused = key_refused


class ServerFullError(PeerLostError):
    """The server refused the connection during the handshake because it has as many
    peers as its cap allows (``max_peers``): a temporary condition, worth retrying later
    (unlike :class:`AuthenticationError`)."""


class CallTimeoutError(TransportError, TimeoutError):
    """A call's deadline passed before its reply arrived."""


class RemoteError(Exception):
    """An exception raised on the remote side of a call.

    ``type_name`` is the remote exception's qualified class name, ``message`` its text and
    ``remote_traceback`` the formatted remote traceback. On the wire (and in object stores)
    it is this plain record; where a caller raises it, :meth:`typed` makes it also an
    instance of the remote class when that class is registered
    (:mod:`transport.error_types`), so ``except ValueError`` works on a remote failure.
    """

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        # Not super().__init__: in a typed subclass the next class is the remote one, whose
        # constructor must not run with these arguments.
        Exception.__init__(self, type_name, message, remote_traceback)
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback

    @classmethod
    def from_exception(cls, exc: BaseException) -> RemoteError:
        """Capture ``exc`` (with its traceback) as a plain record that can be sent.

        A remote error passes on with its original type name, message and traceback, so a
        failure forwarded through several processes still arrives as its first type."""
        if isinstance(exc, RemoteError):
            if type(exc) is RemoteError:
                return exc
            return RemoteError(exc.type_name, exc.message, exc.remote_traceback)
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RemoteError(error_type_name(type(exc)), str(exc), tb)

    def typed(self) -> RemoteError:
        """This error as a caller raises it: an instance of both :class:`RemoteError` and
        the class registered under :attr:`type_name`, with the same fields; ``self`` when
        no class is registered (or it is already typed).

        The registered class's constructor never runs: the instance is made by its
        ``__new__`` without arguments and filled in by :class:`RemoteError`'s constructor.
        A class that cannot be mixed in that way leaves the error plain.
        """
        if type(self) is not RemoteError:
            return self
        original = registered_error(self.type_name)
        if original is None:
            return self
        typed_cls = _typed_class(original)
        if typed_cls is None:
            return self
        try:
            err = typed_cls.__new__(typed_cls)
            RemoteError.__init__(err, self.type_name, self.message, self.remote_traceback)
        except Exception:  # an unusual __new__: keep the plain record
            return self
        err.__cause__ = self.__cause__
        err.__traceback__ = self.__traceback__
        return err

    def __str__(self) -> str:
        text = f"{self.type_name}: {self.message}"
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return text


_typed_classes: dict[type, type[RemoteError] | None] = {}


def _typed_class(original: type[Exception]) -> type[RemoteError] | None:
    """The cached subclass of :class:`RemoteError` and ``original`` (None when Python
    refuses to combine them, e.g. conflicting instance layouts)."""
    if original not in _typed_classes:
        name = f"RemoteError[{original.__qualname__}]"
        try:
            typed_cls: type[RemoteError] | None = types.new_class(
                name, (RemoteError, original), exec_body=lambda ns: ns.update(
                    {"__module__": __name__, "__qualname__": name,
                     "__doc__": f"A remote {error_type_name(original)}."}))
        except Exception:
            typed_cls = None
        _typed_classes[original] = typed_cls
    return _typed_classes[original]


register_type(
    RemoteError,
    "transport.RemoteError",
    lambda e: [e.type_name, e.message, e.remote_traceback],
    lambda s: RemoteError(s[0], s[1], s[2]),
)
