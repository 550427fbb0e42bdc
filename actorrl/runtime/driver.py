"""The native async API of a single-host run: a runtime plus a local node.

::

    async with Driver.start() as driver:
        counter = await driver.create_actor("mypkg.mod:Counter", args=(0,))
        ref = counter.add.remote(5)
        print(await driver.get(ref))

``Driver.start(serial=True)`` runs every actor inside this process and event loop instead
(see :mod:`actorrl.runtime.process.serial`). :class:`DriverLike` is the surface shared with the
cluster's ``ClusterDriver``; code that starts actors (the Trainer) is typed for it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from actorrl.runtime.node.node import DEFAULT_START_TIMEOUT_S, LocalNode
from actorrl.runtime.process.handles import ActorHandle, ActorSpec
from actorrl.runtime.process.peers import remove_ipc_fallback
from actorrl.runtime.process.refs import ObjectRef
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.process.serial import SerialHosting, SerialNode
from actorrl.runtime.sessions import make_session_dir


@runtime_checkable
class DriverLike(Protocol):
    """What code that starts and calls actors needs from a driver: :class:`Driver` (one
    host, or serial) and ``actorrl.runtime.cluster.driver.ClusterDriver`` (a cluster) both
    satisfy it."""

    @property
    def runtime(self) -> Runtime:
        """The runtime that submits calls and owns what this driver puts."""
        ...

    @property
    def local_gpus(self) -> float:
        """GPUs an actor started here can use without asking for them by ``num_gpus``
        (those of the one local node; 0.0 where placement chooses the node)."""
        ...

    async def create_actor(self, class_path: str, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None, *, num_cpus: float = 1.0,
                           num_gpus: float = 0.0, name: str = "",
                           env: dict[str, str] | None = None) -> ActorHandle:
        """Start an actor of ``class_path``; its handle once it is built."""
        ...

    async def restart_actor(self, handle: ActorHandle) -> ActorHandle:
        """A fresh actor from ``handle``'s creation spec (the old one stopped)."""
        ...

    async def kill_actor(self, handle: ActorHandle) -> None:
        """Stop an actor."""
        ...

    async def get(self, refs: ObjectRef | Sequence[ObjectRef],
                  timeout_s: float | None = None) -> Any:
        """Resolve a ref or a list of refs."""
        ...

    async def wait(self, refs: Sequence[ObjectRef], num_returns: int = 1,
                   timeout_s: float | None = None) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """``(ready, not_ready)`` once ``num_returns`` refs are ready."""
        ...

    def put(self, value: Any) -> ObjectRef:
        """Store ``value``; returns its ref."""
        ...

    def free(self, refs: ObjectRef | Sequence[ObjectRef]) -> None:
        """Release objects at their owners."""
        ...


class ObjectOps:
    """get/wait/put/free over ``self.runtime``: the object half of the driver surface,
    shared by :class:`Driver` and the cluster's ``ClusterDriver``."""

    runtime: Runtime

    async def get(self, refs: ObjectRef | Sequence[ObjectRef],
                  timeout_s: float | None = None) -> Any:
        """Resolve a ref or a list of refs."""
        return await self.runtime.get_async(refs, timeout_s)

    async def wait(self, refs: Sequence[ObjectRef], num_returns: int = 1,
                   timeout_s: float | None = None) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """``(ready, not_ready)`` once ``num_returns`` refs are ready, in first-ready order."""
        return await self.runtime.wait_async(refs, num_returns, timeout_s)

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` here; returns a ref others fetch from this process."""
        return self.runtime.put(value)

    def free(self, refs: ObjectRef | Sequence[ObjectRef]) -> None:
        """Release objects at their owners."""
        self.runtime.free(refs)

    async def get_and_free(self, refs: ObjectRef | Sequence[ObjectRef],
                           timeout_s: float | None = None) -> Any:
        """Get, then free at the owner."""
        return await self.runtime.get_and_free_async(refs, timeout_s)


class Driver(ObjectOps):
    """Owns this process's :class:`Runtime` and the node its actors run on: a
    :class:`LocalNode` (a child process per actor) or, in serial mode, a
    :class:`~actorrl.runtime.process.serial.SerialNode` (every actor in this process and loop)."""

    def __init__(self, runtime: Runtime, node: LocalNode | SerialNode, session_dir: str,
                 owns_session_dir: bool) -> None:
        self.runtime = runtime
        self.node = node
        self.session_dir = session_dir
        self._owns_session_dir = owns_session_dir

    @classmethod
    def start(cls, session_dir: str | None = None, num_cpus: float | None = None,
              num_gpus: float | None = None, *, serial: bool = False,
              start_method: str | None = None) -> Driver:
        """Start on the running event loop. ``session_dir`` holds sockets and actor logs (a
        fresh temporary directory by default, removed at shutdown). ``serial``: run every
        actor in this process and event loop (no child process at all), for debugging.
        ``start_method``: ``fork`` (actors forked from a fork server; the default where the
        platform allows) or ``spawn`` (a fresh interpreter per actor); unset, it comes from
        ``$ACTORRL_START_METHOD``."""
        owns = session_dir is None
        session_dir = session_dir or make_session_dir()
        os.makedirs(session_dir, exist_ok=True)
        runtime = Runtime.start(session_dir, "driver")
        node: LocalNode | SerialNode
        if serial:
            hosting = SerialHosting(runtime, runtime.loop_thread, runtime.codec, runtime.calls,
                                    runtime.frees.release, runtime.peers)
            node = SerialNode(hosting, num_cpus=num_cpus, num_gpus=num_gpus)
        else:
            node = LocalNode(runtime, session_dir, num_cpus=num_cpus, num_gpus=num_gpus,
                             start_method=start_method)
        return cls(runtime, node, session_dir, owns)

    @property
    def serial(self) -> bool:
        """True when the actors run in this process (``Driver.start(serial=True)``)."""
        return isinstance(self.node, SerialNode)

    @property
    def local_gpus(self) -> float:
        """The GPUs of this host (what its node counts)."""
        return self.node.num_gpus

    async def __aenter__(self) -> Driver:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    async def create_actor(self, class_path: str, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None, *, num_cpus: float = 1.0,
                           num_gpus: float = 0.0, name: str = "",
                           env: dict[str, str] | None = None,
                           timeout_s: float = DEFAULT_START_TIMEOUT_S) -> ActorHandle:
        """Start an actor of ``class_path`` (``"pkg.module:Class"``) in a new process (in
        this one, in serial mode)."""
        spec = ActorSpec(class_path, tuple(args), dict(kwargs or {}), float(num_cpus),
                         float(num_gpus), name, dict(env or {}))
        return await self.node.start_actor(spec, timeout_s)

    async def restart_actor(self, handle: ActorHandle,
                            timeout_s: float = DEFAULT_START_TIMEOUT_S) -> ActorHandle:
        """Start a fresh actor from ``handle``'s creation spec (killing the old process if
        it still runs); returns the new handle."""
        if handle.spec is None:
            raise ValueError(f"{handle!r} carries no creation spec; only the process that "
                             "created an actor can restart it")
        await self.node.stop_actor(handle, timeout_s=1.0)
        return await self.node.start_actor(handle.spec, timeout_s)

    async def kill_actor(self, handle: ActorHandle, timeout_s: float = 5.0) -> None:
        """Stop an actor: ask it to exit, SIGKILL after ``timeout_s`` (serial mode: it is
        dropped at once; its pending calls fail with ActorDiedError)."""
        await self.node.stop_actor(handle, timeout_s)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop every actor, reap them, close sockets, remove the session directory."""
        try:
            await self.node.shutdown(timeout_s)
        finally:
            self.runtime.close()
            remove_ipc_fallback(self.session_dir)
            if self._owns_session_dir:
                shutil.rmtree(self.session_dir, ignore_errors=True)
