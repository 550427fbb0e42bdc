"""Experience replay, composed: a :class:`ReplayBuffer` holds a storage (plain rows, or
frame stacks stored each frame once) and a sampler (uniform, or proportional prioritized
over numpy segment trees).

Plain code: nothing here imports asyncio or the transport layer (the config module
registers itself with the codec only).
"""

from actorrl.replay.buffer import ReplayBuffer
from actorrl.replay.frame_storage import FrameStackStorage, FrameStore
from actorrl.replay.prioritized import PrioritizedSampler
from actorrl.replay.sampler import Sampler, UniformSampler
from actorrl.replay.segment_tree import MinSegmentTree, SegmentTree, SumSegmentTree
from actorrl.replay.storage import RowStorage, Storage, Written

__all__ = [
    "FrameStackStorage",
    "FrameStore",
    "MinSegmentTree",
    "PrioritizedSampler",
    "ReplayBuffer",
    "RowStorage",
    "Sampler",
    "SegmentTree",
    "Storage",
    "SumSegmentTree",
    "UniformSampler",
    "Written",
]
