"""The replies that pass between pipelines, rollout workers, replay shards and the learner.

Each is a frozen dataclass registered with the codec, so it crosses the wire as a map of
its fields and comes back as the same type: a pipeline tells replies apart by type and
reads fields by name, never by dict key. Data stays with its owner; a reply carries refs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actorrl.runtime import ObjectRef
from transport.codec import register_dataclass

__all__ = [
    "EnqueueReply",
    "GradientsApplied",
    "GradientsReply",
    "SampleReply",
    "TrainedBatch",
    "TrainedNotice",
]


@register_dataclass
@dataclass(frozen=True)
class SampleReply:
    """A rollout worker sampled and kept the batch (``RolloutWorkerActor.sample_ref``)."""

    batch: ObjectRef
    """The sample batch, held by the worker until its consumer fetches it."""
    count: int
    """Env steps in the batch."""
    agent_steps: int
    """Agent steps in the batch (equal to ``count`` for a single-agent batch)."""
    worker_index: int
    """The sampling worker's index."""


@register_dataclass
@dataclass(frozen=True)
class GradientsReply:
    """A rollout worker computed gradients and kept them
    (``RolloutWorkerActor.compute_gradients_ref``)."""

    grads: ObjectRef
    """The gradients, held by the worker until the learner fetches them."""
    info: dict[str, Any]
    """The policy's info, with ``batch_count`` (the env steps the gradients cover)."""

    @property
    def batch_count(self) -> int:
        """Env steps the gradients were computed on."""
        return int(self.info["batch_count"])


@register_dataclass
@dataclass(frozen=True)
class GradientsApplied:
    """The learner applied one gradient (``LearnerActor.apply_gradients_refs``)."""

    version: int
    """The learner's weights version after the apply."""
    apply_time_s: float
    """How long applying took at the learner (fetching the gradient not included)."""


@register_dataclass
@dataclass(frozen=True)
class EnqueueReply:
    """What became of a train batch sent to the learner (``LearnerActor.enqueue_refs``)."""

    queued: bool
    """The batch is in the learner's in-queue: a :class:`TrainedBatch` will follow."""
    dropped: bool
    """Refused because the in-queue was full (a drop to count)."""
    count: int
    """Rows in the batch (0 when dropped unfetched or when there was nothing to queue)."""
    queue_size: int
    """Batches in the learner's in-queue after this one."""
    fetch_time_s: float = 0.0
    """Time the learner spent fetching the batch from its owners."""


@register_dataclass
@dataclass(frozen=True)
class TrainedBatch:
    """One learning step's outcome for the batch sent with ``tag``."""

    tag: Any
    """The tag the batch was enqueued with (Ape-X: the replay shard's id)."""
    env_steps: int
    """Env steps trained on."""
    agent_steps: int
    """Agent steps trained on."""
    per_sample: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Policy id -> per-row outputs (``td_error``) and the rows' ``batch_indexes``."""


@register_dataclass
@dataclass(frozen=True)
class TrainedNotice:
    """The learner trained (``LearnerActor.wait_trained``): the batches finished since the
    last notice (none when the wait timed out or the learner stopped)."""

    results: tuple[TrainedBatch, ...]
    """Each batch trained on since the previous notice, in order."""
    weights_version: int
    """The learner's weights version now."""
    num_steps_trained: int
    """Env steps the learner has trained on in total."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "results", tuple(self.results))

    @property
    def env_steps(self) -> int:
        """Env steps trained on in this notice."""
        return sum(r.env_steps for r in self.results)
