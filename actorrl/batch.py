"""Columnar experience batches: ``SampleBatch`` and ``MultiAgentBatch``.

Both are registered with the transport codec, so their arrays cross processes as
zero-copy frames. Frame-stacked image columns (``obs``/``new_obs`` of uint8 frame stacks,
see :mod:`actorrl.frames`) cross as a :class:`~actorrl.frames.FramePack`, each distinct
frame once, and arrive rebuilt bit for bit; the receiving batch keeps the pack as
``frame_pack`` so a replay shard can store the frames once without packing them again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from actorrl.frames import FramePack, pack_frames, packable_columns
from transport.codec import register_type

DEFAULT_POLICY_ID = "default_policy"
_FRAMES_KEY = "\x00frames"


class SampleBatch(dict):
    """A batch of experience: column name -> numpy array, all with the same first dimension.

    Column names follow RLlib (``obs``, ``actions``, ``rewards``, ``new_obs``, ``terminateds``,
    ``truncateds``, ``eps_id``, ...). ``count`` is the number of rows.
    """

    OBS = "obs"
    NEXT_OBS = "new_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    EPS_ID = "eps_id"
    AGENT_INDEX = "agent_index"
    T = "t"
    ACTION_LOGP = "action_logp"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    VF_PREDS = "vf_preds"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"
    WEIGHTS = "weights"
    BATCH_INDEXES = "batch_indexes"

    def __init__(self, columns: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        data = dict(columns or {}, **kwargs)
        for key, value in data.items():
            self[key] = value if isinstance(value, np.ndarray) else np.asarray(value)
        lengths = {len(v) for v in self.values() if v.ndim > 0}
        if len(lengths) > 1:
            sizes = {k: len(v) for k, v in self.items()}
            raise ValueError(f"SampleBatch columns have different lengths: {sizes}")
        self.count = lengths.pop() if lengths else 0
        self._frame_pack: tuple[FramePack, tuple[np.ndarray, ...]] | None = None

    @property
    def frame_pack(self) -> FramePack | None:
        """This batch's frame-stack columns as a :class:`~actorrl.frames.FramePack`, when
        one was attached (decoded from the wire, or built by a replay buffer) and those
        columns were not replaced since."""
        if self._frame_pack is None:
            return None
        pack, arrays = self._frame_pack
        if not arrays:  # a packed batch: valid while the columns were not added
            return None if any(name in self for name in pack.indices) else pack
        if any(dict.get(self, name) is not array
               for name, array in zip(pack.indices, arrays, strict=True)):
            return None
        return pack

    @property
    def is_packed(self) -> bool:
        """Whether the frame-stack columns are held only as the attached pack (see
        :meth:`packed`); :meth:`unpacked` rebuilds them."""
        return self._frame_pack is not None and not self._frame_pack[1] \
            and self.frame_pack is not None

    def attach_frame_pack(self, pack: FramePack) -> None:
        """Record that ``pack`` encodes this batch's columns ``pack.indices`` (as they are
        now): the wire sends the pack instead of packing them again."""
        self._frame_pack = (pack, tuple(dict.__getitem__(self, n) for n in pack.indices))

    @classmethod
    def from_frame_pack(cls, columns: Mapping[str, Any], pack: FramePack) -> SampleBatch:
        """``columns`` plus the frame-stack columns rebuilt from ``pack`` (kept attached)."""
        batch = cls({**columns, **pack.columns()})
        batch.attach_frame_pack(pack)
        return batch

    @classmethod
    def packed(cls, columns: Mapping[str, Any], pack: FramePack) -> SampleBatch:
        """``columns`` with the frame-stack columns held only as ``pack``: what a replay
        shard sends (the receiver gets them rebuilt); a consumer in the same process
        calls :meth:`unpacked` first."""
        batch = cls(columns)
        batch._frame_pack = (pack, ())
        return batch

    def packed_form(self) -> SampleBatch:
        """This batch holding its frame-stack columns only as its attached pack (itself
        when no pack is attached): what keeps a stored batch's frames once in memory."""
        pack = self.frame_pack
        if pack is None or self.is_packed:
            return self
        return SampleBatch.packed(
            {k: v for k, v in dict.items(self) if k not in pack.indices}, pack)

    def unpacked(self) -> SampleBatch:
        """This batch with packed frame-stack columns rebuilt (itself if none are)."""
        if not self.is_packed:
            return self
        assert self._frame_pack is not None
        return SampleBatch.from_frame_pack(dict(self), self._frame_pack[0])

    @property
    def env_steps(self) -> int:
        """Number of environment steps in the batch (equal to ``count``)."""
        return self.count

    @staticmethod
    def concat_samples(batches: Sequence[SampleBatch | MultiAgentBatch]) -> Any:
        """Concatenate batches row-wise; MultiAgentBatches are concatenated per policy."""
        batches = [b for b in batches if b.count > 0] or list(batches[:1])
        if not batches:
            return SampleBatch()
        if any(isinstance(b, MultiAgentBatch) for b in batches):
            return MultiAgentBatch.concat_samples(batches)
        if len(batches) == 1:
            return batches[0]
        keys = batches[0].keys()
        for b in batches[1:]:
            if b.keys() != keys:
                raise ValueError(
                    f"cannot concat SampleBatches with different columns: "
                    f"{sorted(keys)} vs {sorted(b.keys())}"
                )
        return SampleBatch({k: np.concatenate([b[k] for b in batches]) for k in keys})

    def concat(self, other: SampleBatch) -> SampleBatch:
        """Return a new batch with ``other``'s rows appended."""
        return SampleBatch.concat_samples([self, other])

    def copy(self) -> SampleBatch:  # type: ignore[override]
        """Deep copy: every column array is copied."""
        return SampleBatch({k: np.array(v, copy=True) for k, v in self.items()})

    def rows(self) -> Iterator[dict[str, Any]]:
        """Iterate over rows as ``{column: value}`` dicts (slow; for tests and debugging)."""
        for i in range(self.count):
            yield {k: v[i] for k, v in self.items()}

    def slice(self, start: int, end: int) -> SampleBatch:
        """Rows ``start:end`` as a new batch sharing memory with this one."""
        return SampleBatch({k: v[start:end] for k, v in self.items()})

    def take(self, indices: np.ndarray) -> SampleBatch:
        """Rows at ``indices`` (a gather; copies)."""
        return SampleBatch({k: v[indices] for k, v in self.items()})

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self.slice(*key.indices(self.count)[:2])
        return super().__getitem__(key)

    def shuffle(self, rng: np.random.Generator | None = None) -> SampleBatch:
        """Return the rows in a random order."""
        rng = rng or np.random.default_rng()
        return self.take(rng.permutation(self.count))

    def split_by_episode(self) -> list[SampleBatch]:
        """Split into one batch per contiguous run of ``eps_id``."""
        if self.count == 0:
            return []
        eps = self[self.EPS_ID]
        cuts = np.flatnonzero(eps[1:] != eps[:-1]) + 1
        bounds = [0, *cuts.tolist(), self.count]
        return [self.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def timeslices(self, size: int) -> list[SampleBatch]:
        """Split into consecutive slices of at most ``size`` rows."""
        return [self.slice(i, min(i + size, self.count)) for i in range(0, self.count, size)]

    def size_bytes(self) -> int:
        """Total bytes of all column arrays."""
        return sum(v.nbytes for v in self.values())

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.items())
        return f"SampleBatch({self.count}: {cols})"


class MultiAgentBatch:
    """Per-policy batches: policy id -> ``SampleBatch``; ``count`` counts env steps."""

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int) -> None:
        self.policy_batches = dict(policy_batches)
        self.count = int(env_steps)

    @property
    def env_steps(self) -> int:
        """Number of environment steps the batch covers."""
        return self.count

    def agent_steps(self) -> int:
        """Rows over all policies (one row per agent step)."""
        return sum(b.count for b in self.policy_batches.values())

    @staticmethod
    def wrap_as_needed(
        policy_batches: Mapping[str, SampleBatch], env_steps: int
    ) -> SampleBatch | MultiAgentBatch:
        """A plain SampleBatch when only the default policy is present, else a MultiAgentBatch."""
        if len(policy_batches) == 1 and DEFAULT_POLICY_ID in policy_batches:
            return policy_batches[DEFAULT_POLICY_ID]
        return MultiAgentBatch(policy_batches, env_steps)

    @staticmethod
    def concat_samples(batches: Sequence[SampleBatch | MultiAgentBatch]) -> MultiAgentBatch:
        """Concatenate per policy; plain SampleBatches count as the default policy."""
        per_policy: dict[str, list[SampleBatch]] = {}
        env_steps = 0
        for b in batches:
            ma = as_multi_agent(b)
            for pid, pb in ma.policy_batches.items():
                per_policy.setdefault(pid, []).append(pb)
            env_steps += ma.count
        return MultiAgentBatch(
            {pid: SampleBatch.concat_samples(bs) for pid, bs in per_policy.items()}, env_steps
        )

    def copy(self) -> MultiAgentBatch:
        """Deep copy of every policy batch."""
        return MultiAgentBatch({k: v.copy() for k, v in self.policy_batches.items()}, self.count)

    def size_bytes(self) -> int:
        """Total bytes of all arrays."""
        return sum(b.size_bytes() for b in self.policy_batches.values())

    def __repr__(self) -> str:
        return f"MultiAgentBatch({self.count}: {self.policy_batches})"


def as_multi_agent(batch: SampleBatch | MultiAgentBatch) -> MultiAgentBatch:
    """View any batch as a MultiAgentBatch (a SampleBatch becomes the default policy's)."""
    if isinstance(batch, MultiAgentBatch):
        return batch
    return MultiAgentBatch({DEFAULT_POLICY_ID: batch}, batch.count)


def _batch_to_wire(batch: SampleBatch) -> dict[str, Any]:
    """Columns, with frame-stack columns as one :class:`FramePack` (each frame once)."""
    columns = dict(batch)
    pack = batch.frame_pack
    if pack is None:
        packable = packable_columns(columns)
        if packable is None:
            return columns
        names, axis = packable
        pack = pack_frames({name: columns[name] for name in names}, axis)
    for name in pack.indices:
        columns.pop(name, None)
    columns[_FRAMES_KEY] = pack
    return columns


def _batch_from_wire(columns: dict[str, Any]) -> SampleBatch:
    pack = columns.pop(_FRAMES_KEY, None)
    if pack is None:
        return SampleBatch(columns)
    if not isinstance(pack, FramePack):
        raise ValueError("malformed sample batch: bad frame pack")
    return SampleBatch.from_frame_pack(columns, pack)


register_type(SampleBatch, "actorrl.SampleBatch", _batch_to_wire, _batch_from_wire)
register_type(
    MultiAgentBatch,
    "actorrl.MultiAgentBatch",
    lambda b: [b.policy_batches, b.count],
    lambda state: MultiAgentBatch(state[0], state[1]),
)
