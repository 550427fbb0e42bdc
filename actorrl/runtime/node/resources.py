"""What a node has (CPUs, GPUs) and what the actors it runs asked for: the part the
process node (:class:`~actorrl.runtime.node.node.LocalNode`) and the serial one
(:class:`~actorrl.runtime.process.serial.SerialNode`) share."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def count_gpus() -> float:
    """CUDA devices visible to this process, without importing torch here."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return float(len([d for d in visible.split(",") if d.strip()]))
    return float(len([d for d in os.listdir("/dev") if d.startswith("nvidia") and
                      d[6:].isdigit()])) if os.path.isdir("/dev") else 0.0


class NodeResources:
    """A node's CPUs and GPUs (``None``: this host's) and the sums its live actors asked
    for. Subclasses keep their actors in :attr:`actors`, each with a ``spec``."""

    actors: Mapping[str, Any]

    def __init__(self, num_cpus: float | None = None, num_gpus: float | None = None) -> None:
        self.num_cpus = float(num_cpus if num_cpus is not None else os.cpu_count() or 1)
        self.num_gpus = float(num_gpus if num_gpus is not None else count_gpus())

    @property
    def used_cpus(self) -> float:
        """CPUs requested by the live actors."""
        return sum(a.spec.num_cpus for a in self.actors.values())

    @property
    def used_gpus(self) -> float:
        """GPUs requested by the live actors."""
        return sum(a.spec.num_gpus for a in self.actors.values())
