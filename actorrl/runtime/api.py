"""The synchronous facade for scripts and tests.

::

    import actorrl.runtime as rt
    rt.init()
    counter = rt.create_actor("mypkg.mod:Counter", args=(0,))
    print(rt.get(counter.add.remote(5)))
    rt.shutdown()

The event loop runs in a background thread of this process (still one loop per process).
``init(serial=True)`` runs the actors in that loop too, not in processes (see
:mod:`actorrl.runtime.process.serial`).

**The one module-level default.** This facade keeps the :class:`Driver` that :func:`init`
started in a module variable, so scripts need not carry it around; it is the only
process-wide runtime reference in actorrl, and only these functions read it. Inside an
actor's methods, ``get``/``wait``/``put``/``free`` use the runtime hosting that actor
(:meth:`Runtime.current`), in an actor process as in the driver. Everything else (the
async API, pipelines, handles) is handed its runtime explicitly.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from actorrl.runtime.driver import Driver
from actorrl.runtime.errors import GetTimeoutError, RemoteError, RuntimeNotStartedError
from actorrl.runtime.process.handles import ActorHandle
from actorrl.runtime.process.refs import ObjectRef
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.process.scope import current_scope
from transport.sockets import new_event_loop

T = TypeVar("T")

_driver: Driver | None = None
"""The facade's default driver (see the module docstring); set by init, cleared by
shutdown."""
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _runtime() -> Runtime:
    """The runtime this facade acts on here: the one hosting the running actor method,
    else the driver :func:`init` started."""
    scope = current_scope()
    if scope is not None and not scope.runtime.closed:
        return scope.runtime
    return driver().runtime


def _run(coro: Coroutine[Any, Any, T], runtime: Runtime,
         timeout_s: float | None = None) -> T:
    if runtime.on_loop():
        coro.close()
        hint = (" (a serial-mode actor method runs on it: make the method async and await "
                "Runtime.current().get_async(...))" if current_scope() is not None else "")
        raise RuntimeError("the synchronous runtime API cannot be used on the event loop "
                           "thread; use the async API (await driver.get(...)) there" + hint)
    runtime.before_loop_request()
    future = asyncio.run_coroutine_threadsafe(coro, runtime.loop)
    try:
        return future.result(None if timeout_s is None else timeout_s + 5.0)
    except TimeoutError as exc:
        if isinstance(exc, RemoteError):  # a remote method timed out, not this call
            raise
        future.cancel()
        raise GetTimeoutError(f"timed out after {timeout_s:g} s") from None


def init(session_dir: str | None = None, num_cpus: float | None = None,
         num_gpus: float | None = None, *, serial: bool = False,
         start_method: str | None = None) -> Driver:
    """Start the runtime and a local node in a background event-loop thread; with
    ``serial``, actors run in that loop instead of in processes. ``start_method``:
    ``fork`` or ``spawn`` (see :meth:`Driver.start`)."""
    global _driver, _loop, _thread
    if _driver is not None:
        raise RuntimeError("actorrl.runtime.init() was already called; call shutdown() first")
    loop = new_event_loop()
    started = threading.Event()
    thread = threading.Thread(target=lambda: (asyncio.set_event_loop(loop), started.set(),
                                              loop.run_forever()),
                              name="actorrl-loop", daemon=True)
    thread.start()
    started.wait()

    async def start() -> Driver:
        return Driver.start(session_dir, num_cpus, num_gpus, serial=serial,
                            start_method=start_method)

    _driver = asyncio.run_coroutine_threadsafe(start(), loop).result()
    _loop, _thread = loop, thread
    return _driver


def driver() -> Driver:
    """The driver started by :func:`init`."""
    if _driver is None:
        raise RuntimeNotStartedError("call actorrl.runtime.init() first")
    return _driver


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return _driver is not None


def create_actor(class_path: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
                 *, num_cpus: float = 1.0, num_gpus: float = 0.0, name: str = "",
                 env: dict[str, str] | None = None, timeout_s: float = 120.0) -> ActorHandle:
    """Start an actor process for ``class_path`` (``"pkg.module:Class"``)."""
    d = driver()
    return _run(d.create_actor(class_path, args, kwargs, num_cpus=num_cpus, num_gpus=num_gpus,
                               name=name, env=env, timeout_s=timeout_s), d.runtime)


def restart_actor(handle: ActorHandle) -> ActorHandle:
    """Recreate an actor from its creation spec; returns the new handle."""
    d = driver()
    return _run(d.restart_actor(handle), d.runtime)


def kill_actor(handle: ActorHandle, timeout_s: float = 5.0) -> None:
    """Stop an actor (exit request, then SIGKILL after ``timeout_s``)."""
    d = driver()
    _run(d.kill_actor(handle, timeout_s), d.runtime)


def get(refs: ObjectRef | Sequence[ObjectRef], timeout: float | None = None) -> Any:
    """Resolve a ref or list of refs; raises the remote error, ActorDiedError or
    GetTimeoutError."""
    runtime = _runtime()
    return _run(runtime.get_async(refs, timeout), runtime, timeout)


def wait(refs: Sequence[ObjectRef], num_returns: int = 1, timeout: float | None = None
         ) -> tuple[list[ObjectRef], list[ObjectRef]]:
    """``(ready, not_ready)`` once ``num_returns`` refs are ready or ``timeout`` passes."""
    runtime = _runtime()
    return _run(runtime.wait_async(refs, num_returns, timeout), runtime, timeout)


def put(value: Any) -> ObjectRef:
    """Store ``value`` in this process; returns its ref."""
    return _runtime().put(value)


def free(refs: ObjectRef | Sequence[ObjectRef]) -> None:
    """Release objects at their owners."""
    _runtime().free(refs)


def get_and_free(refs: ObjectRef | Sequence[ObjectRef], timeout: float | None = None) -> Any:
    """Get, then free at the owner."""
    runtime = _runtime()
    return _run(runtime.get_and_free_async(refs, timeout), runtime, timeout)


def shutdown(timeout_s: float = 5.0) -> None:
    """Stop all actors, close the runtime and the loop thread."""
    global _driver, _loop, _thread
    if _driver is None:
        return
    d, loop, thread = _driver, _loop, _thread
    _driver = _loop = _thread = None
    assert loop is not None and thread is not None
    try:
        asyncio.run_coroutine_threadsafe(d.shutdown(timeout_s), loop).result(timeout_s * 3 + 10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
