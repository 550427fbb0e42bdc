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
from dataclasses import dataclass
from types import FrameType
from typing import Any

from actorrl.runtime.errors import ActorCreationError, ActorDiedError
from actorrl.runtime.node.resources import NodeResources
from actorrl.runtime.process.handles import ActorHandle, ActorSpec, CallSubmitter
from actorrl.runtime.process.hosting import ActorHost, HostedCall, RefReader, import_class
from actorrl.runtime.process.loop import LoopThread
from actorrl.runtime.process.peers import Peers
from actorrl.runtime.process.refs import ObjectRef, Release, new_object_id
from actorrl.runtime.process.scope import ActorScope, enter_scope, leave_scope
from actorrl.runtime.process.store import STATUS_ERROR, STATUS_OK, ObjectStore
from transport.codec import Codec
from transport.errors import RemoteError

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


@dataclass(frozen=True)
class SerialHosting:
    """What serial actors take from the runtime of the driver that hosts them."""

    runtime: CallSubmitter
    """The driver's runtime: their handles submit through it, and it is what
    ``Runtime.current()`` returns in their code."""
    loop: LoopThread
    codec: Codec
    """Arguments and results cross it, as on the wire."""
    reader: RefReader
    """Reads their calls' ref arguments."""
    release: Release
    """Frees what they put once its ref is collected."""
    peers: Peers
    """Where the node registers them, so that calls to their endpoints reach them."""


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
    """An actor living in the driver's process and loop: the
    :class:`~actorrl.runtime.process.peers.InProcessActor` its endpoint routes to.

    It owns a store (its results and puts) and hosts its calls as an actor process does
    (the same :class:`~actorrl.runtime.process.hosting.ActorHost`), except that synchronous
    methods run inline on the loop and what crosses between caller and actor is copied
    through the codec, as the wire would.
    """

    def __init__(self, hosting: SerialHosting, actor_id: str, endpoint: str,
                 spec: ActorSpec) -> None:
        self.actor_id = actor_id
        self.endpoint = endpoint
        self.spec = spec
        self.codec = hosting.codec
        self._on_loop = hosting.loop.on_loop
        self._release = hosting.release
        self.dead: str | None = None
        self._pending: dict[bytes, asyncio.Future] = {}
        # Its code's puts are its own (self.put).
        super().__init__(None, ActorScope(hosting.runtime, self.put), hosting.loop.loop,
                         ObjectStore(hosting.loop.loop), hosting.reader)

    def __repr__(self) -> str:
        label = self.spec.name or self.spec.class_path
        return f"SerialActor({label} #{self.actor_id[:8]})"

    def build(self) -> None:
        """Construct the instance here, inline, with this actor as the hosting actor (its
        constructor arguments cross the codec as they would to an actor process)."""
        args, kwargs = roundtrip(self.codec, [list(self.spec.args), self.spec.kwargs])
        cls = import_class(self.spec.class_path)
        token = enter_scope(self.scope)
        try:
            self.instance = cls(*args, **kwargs)
        finally:
            leave_scope(token)

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` as this actor's object (thread-safe): its code's puts (see
        :class:`~actorrl.runtime.process.scope.ActorScope`). Not copied; lost when the
        actor dies."""
        ref = ObjectRef(new_object_id(), self.endpoint, self._release)
        ref.became_ready()  # its value is not kept on the ref: lost with the actor
        if self._on_loop():
            self.store.set(ref.id, STATUS_OK, value)
        else:
            self.loop.call_soon_threadsafe(self.store.set, ref.id, STATUS_OK, value)
        return ref

    # ---- calls --------------------------------------------------------------------------
    def accept(self, frames: list[Any], fut: asyncio.Future, caller: FrameType | None
               ) -> None:
        """Take a call submitted through the runtime (see ``InProcessActor.accept``)."""
        if self.dead is not None:
            fut.set_exception(self._died())
            return
        try:
            _, call_args, _ = decode_copy(self.codec, frames)
        except Exception as exc:
            fut.set_exception(exc)
            return
        self._pending[call_args[0]] = fut
        # The caller's frame, for a traceback spanning the step, while the call may run
        # inline under it.
        request = _LocalRequest(call_args, fut, caller, self._pending)
        self.on_call(request)
        request.frame = None  # a call that runs later has no caller on its stack

    def _run_sync(self, call: HostedCall, fn: Callable[..., Any]) -> None:
        token = enter_scope(self.scope)
        try:
            result = fn(*call.args, **call.kwargs)
        except BaseException as exc:
            self._finish(call, STATUS_ERROR, self._error(call, exc))
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: still stop the program
        else:
            self._finish(call, STATUS_OK, result)
        finally:
            leave_scope(token)

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
        coroutine methods are cancelled, the objects it owned are lost (its node stops
        routing its endpoint here first)."""
        if self.dead is not None:
            return
        self.dead = reason
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

    def __init__(self, hosting: SerialHosting, num_cpus: float | None = None,
                 num_gpus: float | None = None) -> None:
        super().__init__(num_cpus, num_gpus)  # recorded, not enforced
        self.hosting = hosting
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
        actor = SerialActor(self.hosting, actor_id, endpoint, spec)
        try:
            actor.build()
        except Exception as exc:
            raise ActorCreationError(
                f"constructing {spec.class_path} failed: {RemoteError.from_exception(exc)}"
            ) from exc
        self.actors[actor_id] = actor
        self.hosting.peers.add_in_process(endpoint, actor)
        return ActorHandle(actor_id, endpoint, spec.class_path, spec.name, spec,
                           self.hosting.runtime)

    def process_of(self, handle: ActorHandle) -> None:
        """None: serial actors have no process."""
        return None

    async def stop_actor(self, handle: ActorHandle, timeout_s: float = 5.0) -> None:
        """Drop the actor (asked to stop: no death is reported)."""
        actor = self.actors.pop(handle.actor_id, None)
        if actor is not None:
            self._terminate(actor, "stopped")

    def kill_actor(self, handle: ActorHandle) -> None:
        """Drop the actor as if its process had been SIGKILLed: its calls fail with
        ActorDiedError and the ``on_death`` callbacks fire."""
        actor = self.actors.pop(handle.actor_id, None)
        if actor is None:
            return
        reason = "killed (serial mode)"
        self._terminate(actor, reason)
        log.warning("actor %s (%s) died: %s", handle.actor_id[:8], actor.spec.class_path,
                    reason)
        for callback in list(self.on_death):
            callback(handle.actor_id, reason)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Drop every actor."""
        actors, self.actors = list(self.actors.values()), {}
        for actor in actors:
            self._terminate(actor, "the driver shut down")

    def _terminate(self, actor: SerialActor, reason: str) -> None:
        """Calls to ``actor``'s endpoint fail from now on, then it ends."""
        self.hosting.peers.remove_in_process(actor.endpoint, reason)
        actor.terminate(reason)
