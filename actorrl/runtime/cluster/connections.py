"""How the coordinator reaches a node to start and stop actors there: a node agent in
another process over its control connection, or a :class:`LocalNode` in its own."""

from __future__ import annotations

import asyncio
from typing import Protocol

from actorrl.runtime.errors import ActorCreationError
from actorrl.runtime.node.node import LocalNode
from actorrl.runtime.process.handles import ActorHandle, ActorSpec
from actorrl.runtime.process.wire import spec_to_wire
from transport.errors import RemoteError
from transport.rpc import RpcClient


class NodeConnection(Protocol):
    """How the coordinator starts and stops actors on one node."""

    async def start_actor(self, spec: ActorSpec, timeout_s: float) -> tuple[str, str, int]:
        """Start an actor; returns ``(actor_id, endpoint, pid)``."""
        ...

    async def stop_actor(self, actor_id: str, timeout_s: float) -> None:
        """Ask an actor to exit, SIGKILL after ``timeout_s``."""
        ...

    async def kill_actor(self, actor_id: str) -> None:
        """SIGKILL an actor (it is reported dead, like a crash)."""
        ...

    async def release(self, exit_node: bool) -> None:
        """Stop every actor of the node (and make the agent exit when ``exit_node``)."""
        ...

    async def actor_log(self, actor_id: str, max_bytes: int) -> str:
        """The end of an actor process's output (stdout + stderr)."""
        ...

    def close(self) -> None:
        """Drop the connection."""
        ...


class RemoteNode:
    """A node agent in another process, reached over its control connection."""

    def __init__(self, client: RpcClient) -> None:
        self.client = client

    async def start_actor(self, spec: ActorSpec, timeout_s: float) -> tuple[str, str, int]:
        try:
            actor_id, endpoint, pid = await self.client.call(
                "node.start_actor", [spec_to_wire(spec), timeout_s], timeout_s=timeout_s + 5)
        except ActorCreationError as exc:  # the node refused: its message says why
            if isinstance(exc, RemoteError):  # (the node's own traceback is noise)
                raise ActorCreationError(exc.message) from None
            raise
        return actor_id, endpoint, pid

    async def stop_actor(self, actor_id: str, timeout_s: float) -> None:
        await self.client.call("node.stop_actor", [actor_id, timeout_s],
                               timeout_s=timeout_s * 2 + 5)

    async def kill_actor(self, actor_id: str) -> None:
        await self.client.call("node.kill_actor", [actor_id], timeout_s=10)

    async def release(self, exit_node: bool) -> None:
        await self.client.call("node.release", [exit_node], timeout_s=30)

    async def actor_log(self, actor_id: str, max_bytes: int) -> str:
        return await self.client.call("node.actor_log", [actor_id, max_bytes], timeout_s=10)

    def close(self) -> None:
        self.client.close()


class InProcessNode:
    """A :class:`LocalNode` in the coordinator's own process (``Client.local()``)."""

    def __init__(self, local: LocalNode) -> None:
        self.local = local

    async def start_actor(self, spec: ActorSpec, timeout_s: float) -> tuple[str, str, int]:
        handle = await self.local.start_actor(spec, timeout_s)
        process = self.local.process_of(handle)
        return handle.actor_id, handle.endpoint, process.pid if process else 0

    async def stop_actor(self, actor_id: str, timeout_s: float) -> None:
        await self.local.stop_actor(ActorHandle(actor_id, ""), timeout_s)

    async def kill_actor(self, actor_id: str) -> None:
        self.local.kill_actor(ActorHandle(actor_id, ""))

    async def release(self, exit_node: bool) -> None:
        await asyncio.gather(*(self.local.stop_actor(ActorHandle(a, ""))
                               for a in list(self.local.actors)))

    async def actor_log(self, actor_id: str, max_bytes: int) -> str:
        process = self.local.process_of(ActorHandle(actor_id, ""))
        return process.log_tail(max_bytes) if process is not None else ""

    def close(self) -> None:
        pass

