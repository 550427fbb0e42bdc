"""Actor handles: what callers hold to call methods on an actor living in another process.

A handle is bound to the runtime that submits its calls (a :class:`CallSubmitter`): the
one that created the actor, or the one whose :class:`BindingCodec` decoded the handle (a
handle sent to an actor is bound to that actor's runtime on arrival). Nothing is looked up
globally.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from actorrl.runtime.errors import RuntimeNotStartedError
from actorrl.runtime.process.refs import ObjectRef
from transport.codec import Codec, register_type
from transport.endpoint import short


class CallSubmitter(Protocol):
    """What a handle submits its calls through (a process's runtime)."""

    def submit(self, handle: ActorHandle, method: str, args: Sequence[Any],
               kwargs: dict[str, Any]) -> ObjectRef:
        """Submit ``handle.method(*args, **kwargs)``; the result's ref, at once."""
        ...


_decoding_for: contextvars.ContextVar[CallSubmitter | None] = contextvars.ContextVar(
    "actorrl_decoding_for", default=None)
"""The runtime whose codec is decoding a message in this thread right now (set only for
the duration of one ``decode``): handles on the wire are bound to it."""


class BindingCodec(Codec):
    """A runtime's codec: the actor handles it decodes submit their calls through
    ``submitter``."""

    def __init__(self, submitter: CallSubmitter) -> None:
        super().__init__()
        self.submitter = submitter

    def decode(self, frames: Sequence[Any], allow_shm: bool = False) -> Any:
        """Decode ``frames``; handles inside are bound to :attr:`submitter`."""
        token = _decoding_for.set(self.submitter)
        try:
            return super().decode(frames, allow_shm)
        finally:
            _decoding_for.reset(token)


@dataclass(frozen=True)
class ActorSpec:
    """How to (re)create an actor: class path, constructor arguments and resources."""

    class_path: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    name: str = ""
    env: dict[str, str] = field(default_factory=dict)


class ActorHandle:
    """A handle to a remote actor. ``handle.method.remote(*args)`` returns an ObjectRef at
    once; calls from one caller to one actor run in submission order.

    Handles can be sent to other actors (they cross the wire as actor id + endpoint, and
    are bound to the receiving runtime). ``runtime`` is the runtime that submits this
    handle's calls; a handle without one can be used only after :meth:`bind`.
    """

    __slots__ = ("actor_id", "endpoint", "class_path", "name", "spec", "_submitter")

    def __init__(self, actor_id: str, endpoint: str, class_path: str = "", name: str = "",
                 spec: ActorSpec | None = None, runtime: CallSubmitter | None = None) -> None:
        self.actor_id = actor_id
        self.endpoint = endpoint
        self.class_path = class_path
        self.name = name
        self.spec = spec
        self._submitter = runtime

    @property
    def runtime(self) -> CallSubmitter:
        """The runtime that submits this handle's calls (raises when unbound)."""
        runtime = self._submitter
        if runtime is None:
            raise RuntimeNotStartedError(
                f"{self!r} is not bound to a runtime: use the handle the driver returned, "
                "or handle.bind(runtime)")
        return runtime

    def bind(self, runtime: CallSubmitter) -> ActorHandle:
        """This handle, submitting its calls through ``runtime``."""
        return ActorHandle(self.actor_id, self.endpoint, self.class_path, self.name,
                           self.spec, runtime)

    def __getattr__(self, method: str) -> ActorMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return ActorMethod(self, method)

    def __repr__(self) -> str:
        label = self.name or self.class_path
        return f"ActorHandle({label} #{self.actor_id[:8]} @ {short(self.endpoint)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other.actor_id == self.actor_id

    def __hash__(self) -> int:
        return hash(self.actor_id)


class ActorMethod:
    """One method of an actor; call ``.remote(*args, **kwargs)``."""

    __slots__ = ("handle", "name")

    def __init__(self, handle: ActorHandle, name: str) -> None:
        self.handle = handle
        self.name = name

    def remote(self, *args: Any, **kwargs: Any) -> ObjectRef:
        """Submit the call through the handle's runtime; returns a ref to its result
        immediately."""
        return self.handle.runtime.submit(self.handle, self.name, args, kwargs)


register_type(
    ActorHandle,
    "actorrl.ActorHandle",
    lambda h: [h.actor_id, h.endpoint, h.class_path, h.name],
    lambda s: ActorHandle(s[0], s[1], s[2], s[3], runtime=_decoding_for.get()),
)
