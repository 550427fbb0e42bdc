"""Serial mode: every actor in the driver's process and event loop (``Driver.start(serial=True)``,
``actorrl train ALGO --serial``, ``actorrl.runtime.init(serial=True)``).

What stays the same: actors are created from a class path, ``handle.method.remote(...)``
returns an :class:`~actorrl.runtime.process.refs.ObjectRef` at once, ``get``/``wait``/``free``
work on refs, calls from one caller to one actor start in submission order, an error a
method raises is raised by ``get`` with its type (a typed :class:`RemoteError`), a killed
actor's pending calls fail with ``ActorDiedError`` and the objects it owned (its results
and what it ``put``) are lost (``ObjectLostError``). Arguments and results cross the codec
as on the wire (copies; arrays arrive read-only; unencodable values fail the same way), so
the pipelines run unchanged.

What differs, on purpose, for debugging:

- **Synchronous methods run inline, on the event loop, at the call.** When a call is
  submitted on the loop (a pipeline step), its method runs right inside
  ``handle.method.remote(...)`` unless that actor still has earlier calls waiting (for
  ref arguments that are not ready yet) or is itself running a method (a call to
  itself): then it runs, in order, as soon as those are done. So a breakpoint in a policy,
  a rollout worker or a replay shard stops with the pipeline step on the same stack, and
  an error's traceback spans the whole step (the ``get`` that raises it carries it as the
  cause, and the remote traceback text starts at the step). The price: a method blocks the
  loop while it runs (nothing else needs it), and the blocking synchronous API
  (``actorrl.runtime.get``) cannot be used inside an actor method (make the method
  ``async`` and ``await Runtime.current().get_async(...)``, as the built-in actors do).
- **Coroutine methods run as tasks on the same loop** (as in an actor process), so their
  ``asyncio.to_thread`` work (learner batches) and a learner thread still run in threads
  of this process.
- Resources are not enforced: ``num_cpus``/``num_gpus`` are recorded, per-actor
  environment variables (``env``) are not applied. Compute libraries get one intra-op
  thread (``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` default to 1, and torch's thread count
  is set to 1 if torch is loaded), as each actor process has by default: several OpenMP
  teams (the loop's inference and a learner thread's SGD) spinning against each other on
  a few cores made serial Ape-X train 30x slower.
- ``put`` values are shared by reference between actors (no copy), and what an actor puts
  is owned by it (lost when it is killed), as in its own process.
- No process is started: no sockets are connected, nothing is pickled or forked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
import uuid
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from actorrl.runtime.errors import ActorCreationError, ActorDiedError
from actorrl.runtime.node.resources import NodeResources
from actorrl.runtime.process.handles import ActorHandle, ActorSpec
from actorrl.runtime.process.hosting import (
    ActorHost,
    HostedCall,
    Hosting,
    enter_hosting,
    import_class,
    leave_hosting,
)
from actorrl.runtime.process.refs import STATUS_ERROR, STATUS_OK, ObjectRef, ObjectStore
from transport.codec import Codec
from transport.errors import RemoteError

if TYPE_CHECKING:
    from actorrl.runtime.process.runtime import Runtime

log = logging.getLogger(__name__)

SERIAL_SCHEME = "serial://"
"""Endpoints of serial actors start with this (they are never connected to)."""


def roundtrip(codec: Codec, value: Any) -> Any:
    """``value`` as the receiving side of the wire would see it: encoded and decoded, bulk
    frames copied (so nothing is shared with the sender)."""
    return decode_copy(codec, codec.encode(value))


def decode_copy(codec: Codec, frames: list[Any]) -> Any:
    """Decode ``frames`` (as ``codec.encode`` made them) over copies of its bulk frames."""
    return codec.decode([frames[0], *(bytes(frame) for frame in frames[1:])])


def error_record(exc: BaseException, caller: FrameType | None = None) -> RemoteError:
    """The stored form of an error a serial actor method raised: the record a remote call
    would carry (so ``get`` raises it typed), with the original exception as its cause;
    the stack of ``caller`` (the frame that made the call, for an inline call) is
    prepended to the traceback text so it spans the pipeline step."""
    record = RemoteError.from_exception(exc)
    if caller is not None and type(exc) is not RemoteError:
        lines = ["Traceback (most recent call last):\n",
                 *traceback.format_list(traceback.extract_stack(caller)),
                 *traceback.format_tb(exc.__traceback__),
                 *traceback.format_exception_only(type(exc), exc)]
        record = RemoteError(record.type_name, record.message, "".join(lines))
    record.__cause__ = exc
    return record


class _LocalRequest:
    """A call made inside this process to a serial actor, as its host takes it (the
    stand-in for a served request): its reply resolves the caller's future."""

    __slots__ = ("args", "fut", "frame", "_pending")

    peer = "local"
    """Every call made in this process comes from one caller: the actor starts them in
    submission order."""

    def __init__(self, args: list[Any], fut: asyncio.Future, frame: FrameType | None,
                 pending: dict[bytes, asyncio.Future]) -> None:
        self.args = args
        self.fut = fut
        self.frame = frame
        """The frame that made the call, while it is being made (so an error of a call run
        inline has a traceback spanning the pipeline step)."""
        self._pending = pending

    def reply(self, value: Any) -> None:
        """Resolve the caller's future with ``[status, inline, value]``."""
        self._pending.pop(self.args[0], None)
        if not self.fut.done():
            self.fut.set_result(value)


class SerialActor(ActorHost):
    """An actor living in the driver's runtime: the ``LocalHost`` its endpoint routes to.

    It owns a store (its results and puts) and hosts its calls as an actor process does
    (the same :class:`~actorrl.runtime.process.hosting.ActorHost`), except that synchronous methods
    run inline on the loop and what crosses between caller and actor is copied through the
    codec, as the wire would.
    """

    def __init__(self, runtime: Runtime, actor_id: str, endpoint: str, spec: ActorSpec) -> None:
        super().__init__(None, Hosting(runtime, endpoint, ObjectStore(runtime.loop)))
        self.runtime = runtime
        self.codec = runtime.codec
        self.actor_id = actor_id
        self.endpoint = endpoint
        self.spec = spec
        self.dead: str | None = None
        self._pending: dict[bytes, asyncio.Future] = {}

    def __repr__(self) -> str:
        label = self.spec.name or self.spec.class_path
        return f"SerialActor({label} #{self.actor_id[:8]})"

    def build(self) -> None:
        """Construct the instance here, inline, with this actor as the hosting actor (its
        constructor arguments cross the codec as they would to an actor process)."""
        args, kwargs = roundtrip(self.codec, [list(self.spec.args), self.spec.kwargs])
        cls = import_class(self.spec.class_path)
        token = enter_hosting(self.hosting)
        try:
            self.instance = cls(*args, **kwargs)
        finally:
            leave_hosting(token)

    # ---- calls --------------------------------------------------------------------------
    def accept(self, ref: ObjectRef, frames: list[Any], fut: asyncio.Future) -> None:
        """Take a call submitted through the runtime (see ``LocalHost.accept``)."""
        if self.dead is not None:
            fut.set_exception(self._died())
            return
        try:
            _, call_args, _ = decode_copy(self.codec, frames)
        except Exception as exc:
            fut.set_exception(exc)
            return
        self._pending[call_args[0]] = fut
        # The caller's frame (handle.method.remote), for a traceback spanning the step.
        request = _LocalRequest(call_args, fut, sys._getframe(3), self._pending)
        self.on_call(request)
        request.frame = None  # a call that runs later has no caller on its stack

    def _run_sync(self, call: HostedCall, fn: Callable[..., Any]) -> None:
        token = enter_hosting(self.hosting)
        try:
            result = fn(*call.args, **call.kwargs)
        except BaseException as exc:
            self._finish(call, STATUS_ERROR, self._error(call, exc))
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: still stop the program
        else:
            self._finish(call, STATUS_OK, result)
        finally:
            leave_hosting(token)

    def _error(self, call: HostedCall, exc: BaseException) -> RemoteError:
        return error_record(exc, call.request.frame)  # type: ignore[attr-defined]

    def _finish(self, call: HostedCall, status: int, value: Any) -> None:
        if self.dead is not None:
            return  # the call already failed with ActorDiedError
        if status == STATUS_OK:
            try:  # the caller gets what the wire would deliver: a copy
                value = roundtrip(self.codec, value)
            except Exception as exc:
                status, value = STATUS_ERROR, error_record(exc)
        super()._finish(call, status, value)

    # ---- death --------------------------------------------------------------------------
    def _died(self) -> ActorDiedError:
        return ActorDiedError(f"{self!r} at {self.endpoint} died: {self.dead}")

    def terminate(self, reason: str) -> None:
        """The actor is gone: pending and queued calls fail with ActorDiedError, running
        coroutine methods are cancelled, the objects it owned are lost."""
        if self.dead is not None:
            return
        self.dead = reason
        self.runtime.remove_local_host(self.endpoint, reason)
        error = self._died()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(error)
        self._pending.clear()
        self.store.fail_pending(RemoteError.from_exception(error))
        self.stop()
        self.instance = None


def _one_compute_thread() -> None:
    """One intra-op thread for the compute libraries of this process (see the module
    docstring); an explicit ``OMP_NUM_THREADS`` is kept."""
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(key, "1")
    torch = sys.modules.get("torch")  # never imported here: only adjusted when loaded
    if torch is not None and os.environ["OMP_NUM_THREADS"] == "1":
        torch.set_num_threads(1)


class SerialNode(NodeResources):
    """The node of a serial-mode driver: "starts" actors by building them in this process
    (see the module docstring). Same surface as :class:`~actorrl.runtime.node.node.LocalNode`
    where the driver and tests use it."""

    def __init__(self, runtime: Runtime, num_cpus: float | None = None,
                 num_gpus: float | None = None) -> None:
        super().__init__(num_cpus, num_gpus)  # recorded, not enforced
        self.runtime = runtime
        _one_compute_thread()
        self.actors: dict[str, SerialActor] = {}
        self.on_death: list[Callable[[str, str], None]] = []

    async def start_actor(self, spec: ActorSpec, timeout_s: float | None = None
                          ) -> ActorHandle:
        """Build ``spec``'s actor here, now (``timeout_s`` is not applied: the constructor
        runs inline, so a breakpoint in it works); its handle."""
        actor_id = uuid.uuid4().hex
        label = spec.name or spec.class_path.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        endpoint = f"{SERIAL_SCHEME}{label}-{actor_id[:8]}"
        if spec.env:
            log.debug("serial mode: env %s of %s is not applied", sorted(spec.env), label)
        actor = SerialActor(self.runtime, actor_id, endpoint, spec)
        try:
            actor.build()
        except Exception as exc:
            raise ActorCreationError(
                f"constructing {spec.class_path} failed: {RemoteError.from_exception(exc)}"
            ) from exc
        self.actors[actor_id] = actor
        self.runtime.add_local_host(endpoint, actor)
        return ActorHandle(actor_id, endpoint, spec.class_path, spec.name, spec, self.runtime)

    def process_of(self, handle: ActorHandle) -> None:
        """None: serial actors have no process."""
        return None

    async def stop_actor(self, handle: ActorHandle, timeout_s: float = 5.0) -> None:
        """Drop the actor (asked to stop: no death is reported)."""
        actor = self.actors.pop(handle.actor_id, None)
        if actor is not None:
            actor.terminate("stopped")

    def kill_actor(self, handle: ActorHandle) -> None:
        """Drop the actor as if its process had been SIGKILLed: its calls fail with
        ActorDiedError and the ``on_death`` callbacks fire."""
        actor = self.actors.pop(handle.actor_id, None)
        if actor is None:
            return
        reason = "killed (serial mode)"
        actor.terminate(reason)
        log.warning("actor %s (%s) died: %s", handle.actor_id[:8], actor.spec.class_path,
                    reason)
        for callback in list(self.on_death):
            callback(handle.actor_id, reason)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Drop every actor."""
        actors, self.actors = list(self.actors.values()), {}
        for actor in actors:
            actor.terminate("the driver shut down")
