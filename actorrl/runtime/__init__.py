"""The actor framework: processes, actors, ObjectRefs, wait/get/put/free, nodes.

Sync facade (scripts, tests): :func:`init`, :func:`create_actor`, :func:`get`, :func:`wait`,
:func:`put`, :func:`free`, :func:`get_and_free`, :func:`shutdown`. Async API:
:class:`Driver` (and :class:`Runtime` underneath); :class:`DriverLike` is the surface the
local, serial and cluster drivers share. ``Driver.start(serial=True)`` /
``init(serial=True)`` run every actor in this process (:mod:`actorrl.runtime.process.serial`).
"""

from actorrl.runtime.api import (
    create_actor,
    driver,
    free,
    get,
    get_and_free,
    init,
    is_initialized,
    kill_actor,
    put,
    restart_actor,
    shutdown,
    wait,
)
from actorrl.runtime.driver import Driver, DriverLike
from actorrl.runtime.errors import (
    ActorCreationError,
    ActorDiedError,
    GetTimeoutError,
    ObjectLostError,
    RemoteError,
    RuntimeNotStartedError,
)
from actorrl.runtime.process.handles import ActorHandle, ActorSpec
from actorrl.runtime.process.refs import ObjectRef
from actorrl.runtime.process.runtime import Runtime

__all__ = [
    "ActorCreationError",
    "ActorDiedError",
    "ActorHandle",
    "ActorSpec",
    "Driver",
    "DriverLike",
    "GetTimeoutError",
    "ObjectLostError",
    "ObjectRef",
    "RemoteError",
    "Runtime",
    "RuntimeNotStartedError",
    "create_actor",
    "driver",
    "free",
    "get",
    "get_and_free",
    "init",
    "is_initialized",
    "kill_actor",
    "put",
    "restart_actor",
    "shutdown",
    "wait",
]
