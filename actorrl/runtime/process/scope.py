"""Which hosted actor the code running now belongs to.

One context variable, owned here: a host enters its actor's :class:`ActorScope` around the
actor's code (its constructor, each method; a coroutine method's task runs in a context
that holds it, and ``asyncio.to_thread`` work started there inherits it). It is a context
variable, not a process global, so it is right in serial mode too, where many actors share
one loop. ``Runtime.current()`` reads it; so does ``Runtime.put``, so that what an actor's
code puts is owned by that actor.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actorrl.runtime.process.refs import ObjectRef


@dataclass(frozen=True)
class ActorScope:
    """The scope of one hosted actor's code."""

    runtime: Any
    """The runtime hosting the actor (what ``Runtime.current()`` returns; opaque here,
    since this module sits below it)."""
    put: Callable[[Any], ObjectRef]
    """How the actor's code puts a value: the object is owned by the actor (in serial
    mode, by its own store in the driver's process)."""


_scope: contextvars.ContextVar[ActorScope | None] = contextvars.ContextVar(
    "actorrl_actor_scope", default=None)


def current_scope() -> ActorScope | None:
    """The scope of the actor code running in this context, or None outside actor code."""
    return _scope.get()


def enter_scope(scope: ActorScope) -> contextvars.Token:
    """Mark this context as running ``scope``'s actor code (undo with :func:`leave_scope`)."""
    return _scope.set(scope)


def leave_scope(token: contextvars.Token) -> None:
    """Undo :func:`enter_scope`."""
    _scope.reset(token)


def scoped_context(scope: ActorScope) -> contextvars.Context:
    """A copy of the current context in which ``scope`` is entered (for an actor's task)."""
    context = contextvars.copy_context()
    context.run(_scope.set, scope)
    return context
