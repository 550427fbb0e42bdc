"""The cluster's member nodes: joining, heartbeats, and declaring a node lost.

A node that misses heartbeats for ``heartbeat_timeout_s`` (or whose control connection
drops and does not answer a ping) is lost, and every actor on it is reported dead through
the ``actor_lost`` hook the coordinator gives.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from actorrl.runtime.cluster.connections import InProcessNode, NodeConnection, RemoteNode
from actorrl.runtime.cluster.records import NodeState
from actorrl.runtime.node.node import LocalNode
from actorrl.runtime.process.runtime import Runtime

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 0.5
"""How often a node agent sends a heartbeat."""
DEFAULT_HEARTBEAT_TIMEOUT_S = 3.0
"""A node silent for this long is lost."""
LEFT = "it left"
"""The reason recorded for a node that left (``coord.leave``), as opposed to one lost."""


class Membership:
    """The live member nodes (``nodes``, by id) and the recently lost ones.

    ``actor_lost(actor_id, reason)`` is called for each actor of a lost node (and for each
    death an in-process node reports), ``changed()`` whenever membership changes, and
    ``spawn(coro)`` runs a background probe (the coordinator cancels those on shutdown).
    """

    def __init__(self, runtime: Runtime, heartbeat_s: float, heartbeat_timeout_s: float, *,
                 actor_lost: Callable[[str, str], None], changed: Callable[[], None],
                 spawn: Callable[[Awaitable[Any]], None]) -> None:
        self.runtime = runtime
        self.heartbeat_s = heartbeat_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.nodes: dict[str, NodeState] = {}
        self.lost_nodes: deque[dict[str, Any]] = deque(maxlen=100)
        self.on_node_lost: list[Callable[[NodeState, str], None]] = []
        self.closing = False
        """Set on shutdown: nodes are released then, not lost."""
        self._actor_lost = actor_lost
        self._changed = changed
        self._spawn = spawn
        self._seq = itertools.count()

    def add_node(self, node_id: str, name: str, endpoint: str, host: str, num_cpus: float,
                 num_gpus: float, conn: NodeConnection) -> NodeState:
        """Add a member (idempotent per ``node_id``); names are made unique."""
        existing = self.nodes.get(node_id)
        if existing is not None:
            existing.last_heartbeat = time.monotonic()
            return existing
        taken = {n.name for n in self.nodes.values()}
        unique, i = name, 2
        while unique in taken:
            unique, i = f"{name}-{i}", i + 1
        node = NodeState(node_id, unique, endpoint, host, float(num_cpus), float(num_gpus),
                         conn, next(self._seq))
        self.nodes[node_id] = node
        log.info("node %s joined: %g cpus, %g gpus at %s", unique, num_cpus, num_gpus, host)
        self._changed()
        return node

    def add_local_node(self, local: LocalNode, name: str = "local") -> NodeState:
        """Make an in-process :class:`LocalNode` a member (no heartbeats needed)."""
        node = self.add_node(f"local-{id(local):x}", name, self.runtime.address, "localhost",
                             local.num_cpus, local.num_gpus, InProcessNode(local))
        local.on_death.append(self._actor_lost)
        return node

    def register(self, node_id: str, name: str, endpoint: str, host: str, num_cpus: float,
                 num_gpus: float) -> NodeState:
        """A node agent registering (or registering again): connect to its control
        endpoint the first time, and count the call as a heartbeat."""
        node = self.nodes.get(node_id)
        if node is None:
            # The same agent (its control endpoint) under an older id: it lost the
            # coordinator (a partition, a freeze), stopped its actors and registers again
            # before its old registration was lost here. The new one replaces it, keeping
            # its name; left alone, the old one would stay a member with actors that are
            # gone (a ping to the endpoint is answered, by the new registration's agent).
            for old in [n for n in self.nodes.values()
                        if n.endpoint == endpoint and n.alive
                        and not isinstance(n.conn, InProcessNode)]:
                self.node_lost(old, "it registered again (its agent lost the coordinator "
                                    "and stopped its actors); the new registration replaces "
                                    "this one")
            client = self.runtime.connect(endpoint, connect_timeout_s=10)
            node = self.add_node(node_id, name, endpoint, host, num_cpus, num_gpus,
                                 RemoteNode(client))
            client.on_lost.append(lambda exc, n=node: self.suspect(n, str(exc)))
        node.last_heartbeat = time.monotonic()
        return node

    def heartbeat(self, node_id: Any) -> bool:
        """A heartbeat from ``node_id``; whether it is a member."""
        node = self.nodes.get(node_id)
        if node is not None:
            node.last_heartbeat = time.monotonic()
        return node is not None

    def node_lost(self, node: NodeState, reason: str) -> None:
        """Declare ``node`` lost: every actor on it is dead."""
        if not node.alive or self.closing:
            return
        node.alive = False
        self.nodes.pop(node.node_id, None)
        if reason == LEFT:
            log.info("node %s left the cluster", node.name)
        else:
            log.warning("node %s lost: %s", node.name, reason)
        self.lost_nodes.append({**node.describe(), "reason": reason, "lost_at": time.time()})
        for actor_id in list(node.actor_ids):
            self._actor_lost(actor_id, f"its node {node.name} was lost ({reason})")
        node.conn.close()
        for callback in list(self.on_node_lost):
            callback(node, reason)
        self._changed()

    def suspect(self, node: NodeState, why: str) -> None:
        """The control connection dropped, a call failed or the heartbeats stopped: ping
        once, lose it if silent (an answer counts as a heartbeat)."""
        if not node.alive or node.probing or self.closing or isinstance(node.conn,
                                                                        InProcessNode):
            return
        node.probing = True

        async def probe() -> None:
            # A refused connect (the agent's process is gone, its host still up) decides
            # at once; a silent host takes the connect timeout.
            client = self.runtime.connect(node.endpoint, connect_timeout_s=1.5,
                                          refused_is_lost=True)
            try:
                await client.call("__ping__", timeout_s=1.5)
            except Exception as exc:
                self.node_lost(node, f"{why}; ping failed: {exc}")
            else:
                node.last_heartbeat = time.monotonic()  # it answered: alive
            finally:
                client.close()
                node.probing = False

        self._spawn(probe())

    def check_heartbeats(self, now: float, stall: float) -> None:
        """Lose the nodes silent for longer than the timeout at time ``now``; ``stall``:
        how much later than due the watcher woke up."""
        if stall > self.heartbeat_s:
            # The watcher was held up (a saturated machine: 256 actor processes starting
            # on 2 cores held it ~3 s): the heartbeats that came meanwhile wait unread in
            # the socket, and every node would be declared lost at once. The time the
            # coordinator could not listen is not the nodes' silence.
            for node in self.nodes.values():
                node.last_heartbeat += stall
        for node in list(self.nodes.values()):
            if isinstance(node.conn, InProcessNode):
                continue
            if now - node.last_heartbeat > self.heartbeat_timeout_s:
                # Silent is not yet dead: a node agent starved of CPU (hundreds of actors
                # on a saturated host, a node's actors dying at once) misses heartbeats
                # while alive, and losing it would kill its actors. One ping decides.
                self.suspect(node, f"no heartbeat for {now - node.last_heartbeat:.1f} s")
