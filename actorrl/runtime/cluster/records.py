"""The coordinator's records: each member node with its resource ledger, and each actor
it started."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from actorrl.runtime.cluster.connections import NodeConnection
from actorrl.runtime.process.handles import ActorHandle, ActorSpec
from actorrl.runtime.process.runtime import Runtime

EPS = 1e-9
"""Slack in resource comparisons (fractional CPU and GPU requests add up inexactly)."""


@dataclass
class NodeState:
    """One member node and its resource ledger."""

    node_id: str
    name: str
    endpoint: str
    host: str
    num_cpus: float
    num_gpus: float
    conn: NodeConnection
    seq: int
    used_cpus: float = 0.0
    used_gpus: float = 0.0
    alive: bool = True
    last_heartbeat: float = field(default_factory=time.monotonic)
    joined_at: float = field(default_factory=time.time)
    actor_ids: set[str] = field(default_factory=set)
    probing: bool = False
    starting: int = 0
    """Actor starts asked of this node and not answered yet."""

    @property
    def free_cpus(self) -> float:
        """CPUs not asked for by live actors."""
        return self.num_cpus - self.used_cpus

    @property
    def free_gpus(self) -> float:
        """GPUs not asked for by live actors."""
        return self.num_gpus - self.used_gpus

    def fits(self, spec: ActorSpec) -> bool:
        """Whether ``spec``'s request fits in what is free."""
        return (spec.num_cpus <= self.free_cpus + EPS
                and spec.num_gpus <= self.free_gpus + EPS)

    def describe(self) -> dict[str, Any]:
        """A summary for ``nodes()`` / status."""
        return {"node_id": self.node_id, "name": self.name, "host": self.host,
                "endpoint": self.endpoint, "num_cpus": self.num_cpus,
                "num_gpus": self.num_gpus, "used_cpus": self.used_cpus,
                "used_gpus": self.used_gpus, "num_actors": len(self.actor_ids),
                "alive": self.alive, "joined_at": self.joined_at}


@dataclass
class ActorRecord:
    """The coordinator's record of one actor."""

    actor_id: str
    spec: ActorSpec
    node_id: str
    owner: str
    endpoint: str
    pid: int
    state: str = "alive"
    """``alive``, ``stopping``, ``dead`` (crashed or its node was lost) or ``stopped``."""
    reason: str = ""

    def handle(self, runtime: Runtime) -> ActorHandle:
        """A handle that can restart the actor (carries its spec), calling it through
        ``runtime``."""
        return ActorHandle(self.actor_id, self.endpoint, self.spec.class_path, self.spec.name,
                           self.spec, runtime)

    def describe(self, node_name: str) -> dict[str, Any]:
        """A summary for ``actors()``."""
        return {"actor_id": self.actor_id, "name": self.spec.name,
                "class_path": self.spec.class_path, "node_id": self.node_id,
                "node": node_name, "owner": self.owner, "endpoint": self.endpoint,
                "pid": self.pid, "state": self.state, "reason": self.reason,
                "num_cpus": self.spec.num_cpus, "num_gpus": self.spec.num_gpus}

