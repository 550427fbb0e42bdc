"""Experience replay: columnar buffers (uniform and prioritized) over numpy segment trees.

Plain code: nothing here imports asyncio or the transport layer.
"""

from actorrl.replay.buffer import PrioritizedReplayBuffer, ReplayBuffer
from actorrl.replay.segment_tree import MinSegmentTree, SegmentTree, SumSegmentTree

__all__ = [
    "MinSegmentTree",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "SegmentTree",
    "SumSegmentTree",
]
