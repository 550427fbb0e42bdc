"""Who is calling: the roles a CURVE key may carry, the caller of the request being
served, and serving a method only to the roles allowed.

Roles (keys carry one, see :mod:`transport.auth`): the node side of ``coord.*`` takes node
keys (and the coordinator's own); ``job.*`` and the client side of ``coord.*`` take client
and admin keys; a client key sees and stops only what it created, an admin key all.
Connections without CURVE (ipc, keyless loopback) are trusted. Handlers read who called
through :func:`current_caller`.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from actorrl.runtime.process.runtime import Runtime
from transport.auth import (
    ROLE_ADMIN,
    ROLE_CLIENT,
    ROLE_COORDINATOR,
    ROLE_NODE,
    check_role,
)
from transport.rpc import Request

NODE_ROLES = (ROLE_NODE, ROLE_COORDINATOR)
"""Who may call the node side of ``coord.*`` (register, heartbeat, report deaths, leave)."""
CLIENT_ROLES = (ROLE_CLIENT, ROLE_ADMIN, ROLE_COORDINATOR)
"""Who may call ``job.*`` and the client side of ``coord.*``."""
ADMIN_ROLES = (ROLE_ADMIN, ROLE_COORDINATOR)
"""Who may act on every session and job (and shut the coordinator down)."""
COORDINATOR_ROLES = (ROLE_COORDINATOR,)
"""Who may call ``node.*`` on a node agent: only the coordinator."""


@dataclass(frozen=True)
class Caller:
    """Who made the request being served: the role and z85 public key of its CURVE key,
    both None for a connection without CURVE (trusted: this host's own processes) and for
    calls made in-process."""

    role: str | None = None
    key: str | None = None

    @property
    def is_admin(self) -> bool:
        """Whether this caller may act on every session and job."""
        return self.role is None or self.role in ADMIN_ROLES

    def owns(self, owner_key: str | None) -> bool:
        """Whether this caller may see and stop what was created with key ``owner_key``
        (None: created by a trusted caller, which only admins may touch)."""
        return self.is_admin or (self.role == ROLE_CLIENT and self.key is not None
                                 and owner_key == self.key)


TRUSTED = Caller()
"""The caller outside of any request (in-process calls, a job's own work)."""
_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("actorrl_caller",
                                                                        default=None)


def current_caller() -> Caller:
    """The caller of the request being served (:data:`TRUSTED` outside of one)."""
    return _caller.get() or TRUSTED


def trusted_context() -> contextvars.Context:
    """A copy of the current context with no caller: for tasks that outlive the request
    that started them (a job's run), so they act for nobody in particular."""
    ctx = contextvars.copy_context()
    ctx.run(_caller.set, None)
    return ctx


def serve_guarded(runtime: Runtime, method: str, handler: Callable[[Request], None],
                  roles: Iterable[str] | None = None) -> None:
    """Serve ``method`` with ``handler(request)``, refused (a PermissionError reply naming
    the roles allowed) to a key whose role is not in ``roles`` (None: any role), and run
    with :func:`current_caller` giving the request's caller."""
    allowed = tuple(roles) if roles is not None else None

    def guarded(request: Request) -> None:
        if allowed is not None:
            check_role(request.role, allowed, method)
        token = _caller.set(Caller(request.role, request.key))
        try:
            handler(request)
        finally:
            _caller.reset(token)

    runtime.serve(method, guarded)



def serve_async(runtime: Runtime, method: str, fn: Callable[..., Awaitable[Any]],
                roles: Iterable[str] | None = None) -> None:
    """Serve ``method`` with coroutine function ``fn(*args, **kwargs)``; its return value is
    the reply, its exception the error reply. Wrong arguments fail at once. ``roles``: the
    key roles allowed to call it (None: any; see :func:`serve_guarded`); ``fn`` sees the
    caller through :func:`current_caller`."""
    tasks: set[asyncio.Task] = set()

    def handler(request: Request) -> None:
        task = runtime.loop.create_task(fn(*request.args, **request.kwargs))
        tasks.add(task)

        def done(t: asyncio.Task) -> None:
            tasks.discard(t)
            if t.cancelled():
                request.fail(RuntimeError(f"{method} was cancelled (shutting down)"))
            elif t.exception() is not None:
                request.fail(t.exception())
            else:
                request.reply(t.result())

        task.add_done_callback(done)

    serve_guarded(runtime, method, handler, roles)

