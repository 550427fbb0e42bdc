"""Where an actor goes: among the live nodes with room for its ``num_cpus``/``num_gpus``,
the one with the most free CPUs (CPU-only actors avoid nodes with free GPUs when they can,
and nodes late with heartbeats come last). A request may name a node (hard), prefer one
(soft: used when it has room) or ask to sit next to another actor (``colocate_with``:
replay shards next to the learner)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from actorrl.runtime.cluster.connections import InProcessNode
from actorrl.runtime.cluster.records import EPS, ActorRecord, NodeState
from actorrl.runtime.process.handles import ActorSpec


def find_node(nodes: Iterable[NodeState], name_or_id: str) -> NodeState | None:
    """The node with that name or id, or None."""
    for node in nodes:
        if name_or_id in (node.node_id, node.name):
            return node
    return None


def choose_node(nodes: Mapping[str, NodeState], actors: Mapping[str, ActorRecord],
                spec: ActorSpec, heartbeat_s: float, node: str | None = None,
                prefer: str | None = None, colocate_with: str | None = None,
                exclude: set[str] | frozenset[str] = frozenset()) -> NodeState | None:
    """The node (of ``nodes``, by id) for ``spec``, or None when none has room now.
    ``node``: a name or id, the only choice; ``prefer``: a name or id, first choice;
    ``colocate_with``: the id of an actor (of ``actors``) whose node is first choice;
    ``exclude``: node ids not to use."""
    candidates = [n for n in nodes.values() if n.alive and n.node_id not in exclude]
    if node is not None:
        target = find_node(nodes.values(), node)
        return target if target in candidates and target.fits(spec) else None
    anchor = actors.get(colocate_with) if colocate_with else None
    if anchor is not None and anchor.state == "alive":
        target = nodes.get(anchor.node_id)
        if target in candidates and target.fits(spec):
            return target
    if prefer is not None:
        target = find_node(nodes.values(), prefer)
        if target in candidates and target.fits(spec):
            return target
    fitting = [n for n in candidates if n.fits(spec)]
    if not fitting:
        return None

    now = time.monotonic()

    def key(n: NodeState) -> tuple:
        # A node that missed its last heartbeats may be dying (its actors just died
        # with it): others first, so a replacement does not try it and time out.
        responsive = isinstance(n.conn, InProcessNode) or \
            now - n.last_heartbeat <= 2 * heartbeat_s
        keeps_gpus_free = spec.num_gpus > 0 or n.free_gpus <= EPS
        return (responsive, keeps_gpus_free, n.free_cpus, -n.seq)

    return max(fitting, key=key)


def no_room_message(nodes: Iterable[NodeState], spec: ActorSpec, node: str | None) -> str:
    """Why ``spec`` found no room (on ``node``, when one was named), and what to do."""
    members = list(nodes)
    what = f"{spec.num_cpus:g} CPUs and {spec.num_gpus:g} GPUs"
    if not members:
        return f"no node has joined the cluster to run {spec.name or spec.class_path}"
    free = ", ".join(f"{n.name}: {n.free_cpus:g} CPUs/{n.free_gpus:g} GPUs free"
                     for n in members)
    where = f"node {node!r}" if node else "no node"
    return (f"{where} has room for {spec.name or spec.class_path} ({what}); {free}. "
            "Add a node (`actorrl node join`) or lower the request.")
