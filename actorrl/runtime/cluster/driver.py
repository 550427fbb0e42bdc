"""The driver surface over a cluster, for one owner (a job or a client)."""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Sequence
from typing import Any

from actorrl.runtime.cluster.coordinator import Coordinator
from actorrl.runtime.driver import ObjectOps
from actorrl.runtime.errors import ActorCreationError
from actorrl.runtime.node.node import DEFAULT_START_TIMEOUT_S
from actorrl.runtime.process.handles import ActorHandle, ActorSpec


class ClusterDriver(ObjectOps):
    """The :class:`~actorrl.runtime.driver.DriverLike` surface (``create_actor``,
    ``restart_actor``, ``kill_actor``, ``runtime``, get/wait/put/free) over a cluster, for
    one owner (a job or a client).

    ``placement`` maps actor-name patterns (fnmatch) to a preferred node name; ``colocate``
    maps actor-name patterns to the name of another actor of this owner to sit next to.
    """

    def __init__(self, coordinator: Coordinator, owner: str, *,
                 placement: dict[str, str] | None = None,
                 colocate: dict[str, str] | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        self.coordinator = coordinator
        self.runtime = coordinator.runtime
        self.owner = owner
        self.placement = dict(placement or {})
        self.colocate = dict(colocate or {})
        self.start_timeout_s = start_timeout_s
        self._replaced: dict[str, Any] = {}

    def _prefer(self, name: str) -> str | None:
        for pattern, node in self.placement.items():
            if fnmatch.fnmatchcase(name, pattern):
                return node
        return None

    def _anchor(self, name: str) -> str | None:
        for pattern, anchor_name in self.colocate.items():
            if fnmatch.fnmatchcase(name, pattern):
                for record in self.coordinator.actors.values():
                    if record.owner == self.owner and record.spec.name == anchor_name and \
                            record.state == "alive":
                        return record.actor_id
        return None

    async def create_actor(self, class_path: str, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None, *, num_cpus: float = 1.0,
                           num_gpus: float = 0.0, name: str = "",
                           env: dict[str, str] | None = None, timeout_s: float | None = None,
                           node: str | None = None,
                           colocate_with: ActorHandle | None = None) -> ActorHandle:
        """Start an actor somewhere in the cluster (see :meth:`Coordinator.create_actor`)."""
        spec = ActorSpec(class_path, tuple(args), dict(kwargs or {}), float(num_cpus),
                         float(num_gpus), name, dict(env or {}))
        return await self._create(spec, timeout_s, node, colocate_with)

    async def _create(self, spec: ActorSpec, timeout_s: float | None, node: str | None = None,
                      colocate_with: ActorHandle | None = None) -> ActorHandle:
        anchor = colocate_with.actor_id if colocate_with is not None else \
            self._anchor(spec.name)
        return await self.coordinator.create_actor(
            spec, self.owner, node=node, prefer=self._prefer(spec.name), colocate_with=anchor,
            timeout_s=self.start_timeout_s if timeout_s is None else timeout_s)

    async def restart_actor(self, handle: ActorHandle, timeout_s: float | None = None
                            ) -> ActorHandle:
        """Start a fresh actor from ``handle``'s spec (stopping the old one if it runs).

        A handle is restarted once: asking again (a caller that saw several of the dead
        actor's calls fail) raises ActorCreationError naming the replacement, so no second
        replacement is started.
        """
        replacement = self._replaced.get(handle.actor_id)
        if replacement is not None:
            raise ActorCreationError(f"{handle!r} was already restarted as {replacement!r}")
        record = self.coordinator.actors.get(handle.actor_id)
        spec = handle.spec or (record.spec if record is not None else None)
        if spec is None:
            raise ValueError(f"{handle!r} carries no creation spec; only its creator can "
                             "restart it")
        pending = asyncio.get_running_loop().create_future()
        self._replaced[handle.actor_id] = pending  # claimed while the new one starts
        try:
            await self.coordinator.kill_actor(handle.actor_id, timeout_s=1.0)
            new = await self._create(spec, timeout_s)
        except BaseException:
            del self._replaced[handle.actor_id]
            pending.cancel()
            raise
        self._replaced[handle.actor_id] = new
        pending.set_result(new)
        return new

    async def kill_actor(self, handle: ActorHandle, timeout_s: float = 5.0) -> None:
        """Stop an actor: exit request, SIGKILL after ``timeout_s``."""
        await self.coordinator.kill_actor(handle.actor_id, timeout_s)

    @property
    def local_gpus(self) -> float:
        """0.0: a cluster has no single node whose GPUs an actor gets without asking (ask
        with ``num_gpus``; placement finds a node that has them)."""
        return 0.0

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop every actor of this owner."""
        await self.coordinator.kill_owner(self.owner, timeout_s)
