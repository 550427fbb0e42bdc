"""Columnar experience batches: ``SampleBatch`` and ``MultiAgentBatch``.

Both are registered with the transport codec, so their arrays cross processes as
zero-copy frames. Frame-stacked image columns (``obs``/``new_obs`` of uint8 frame stacks,
see :mod:`actorrl.data.frames`) cross as a :class:`~actorrl.data.frames.FramePack`, each distinct
frame once, and arrive rebuilt bit for bit; the receiving batch keeps the pack as
``frame_pack`` so a replay shard can store the frames once without packing them again.

Sequences (recurrent policies, RLlib's layout)
    A batch of a recurrent policy holds its rows unpadded, cut into sequences: the
    ``seq_lens`` column gives each sequence's length (they sum to ``count``) and the
    ``state_in_0``, ``state_in_1``... columns each sequence's start state, one row per
    sequence. Sequences are contiguous and never span two episodes (see
    :func:`chop_into_sequences`). Concatenation keeps them; :meth:`SampleBatch.slice` cuts
    only at sequence boundaries; :meth:`SampleBatch.slice_sequences`,
    :meth:`SampleBatch.take_sequences` and :meth:`SampleBatch.split_sequences` work in
    whole sequences. Padding happens only where a loss lays sequences out in time
    (:mod:`actorrl.policy.recurrent`). Before chopping (a trajectory on its way to
    postprocessing) ``state_in_*`` columns are ordinary per-row columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from actorrl.data.frames import FramePack, pack_frames, packable_columns
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
    SEQ_LENS = "seq_lens"
    STATE_IN = "state_in_"
    """Prefix of the start-state columns (``state_in_0``, ``state_in_1``...)."""
    STATE_OUT = "state_out_"
    """Prefix of a recurrent policy's state outputs among ``compute_actions``' extras
    (carried to the next step by the sampler, not stored)."""
    PREV_ACTIONS = "prev_actions"
    PREV_REWARDS = "prev_rewards"

    def __init__(self, columns: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        data = dict(columns or {}, **kwargs)
        for key, value in data.items():
            self[key] = value if isinstance(value, np.ndarray) else np.asarray(value)
        sequenced = self.SEQ_LENS in self
        lengths = {len(v) for k, v in self.items()
                   if v.ndim > 0 and not (sequenced and is_sequence_column(k))}
        if len(lengths) > 1:
            sizes = {k: len(v) for k, v in self.items()}
            raise ValueError(f"SampleBatch columns have different lengths: {sizes}")
        self.count = lengths.pop() if lengths else 0
        if sequenced:
            self._check_sequences()
        self._frame_pack: tuple[FramePack, tuple[np.ndarray, ...]] | None = None

    def _check_sequences(self) -> None:
        seq_lens = dict.__getitem__(self, self.SEQ_LENS)
        if seq_lens.ndim != 1 or (seq_lens.size and seq_lens.dtype.kind not in "iu"):
            raise ValueError(f"seq_lens must be a 1-d integer array, got {seq_lens.dtype}"
                             f"{list(seq_lens.shape)}")
        if seq_lens.size and int(seq_lens.min()) < 1:
            raise ValueError("every sequence in seq_lens must be at least 1 step long")
        if int(seq_lens.sum()) != self.count:
            raise ValueError(f"seq_lens sum to {int(seq_lens.sum())} but the batch has "
                             f"{self.count} rows")
        for key, value in self.items():
            if key.startswith(self.STATE_IN) and len(value) != len(seq_lens):
                raise ValueError(f"{key} has {len(value)} rows for {len(seq_lens)} sequences")

    # ---- sequences ----------------------------------------------------------------------
    @property
    def is_sequenced(self) -> bool:
        """Whether the rows are cut into sequences (a ``seq_lens`` column is present)."""
        return self.SEQ_LENS in self

    @property
    def num_sequences(self) -> int:
        """Number of sequences (0 for a batch that is not sequenced)."""
        return len(dict.__getitem__(self, self.SEQ_LENS)) if self.is_sequenced else 0

    def sequence_starts(self) -> np.ndarray:
        """Row offset of every sequence, plus ``count`` at the end (``[S + 1]``)."""
        seq_lens = dict.__getitem__(self, self.SEQ_LENS)
        return np.concatenate([[0], np.cumsum(seq_lens, dtype=np.int64)])

    def state_columns(self) -> list[str]:
        """The ``state_in_*`` columns in index order."""
        names = [k for k in self if k.startswith(self.STATE_IN)]
        return sorted(names, key=lambda k: int(k[len(self.STATE_IN):]))

    def slice_sequences(self, first: int, last: int) -> SampleBatch:
        """Sequences ``first:last`` (their rows and start states) as a new batch sharing
        memory with this one."""
        starts = self.sequence_starts()
        lo, hi = int(starts[first]), int(starts[last])
        return SampleBatch({k: (v[first:last] if is_sequence_column(k) else v[lo:hi])
                            for k, v in self.items()})

    def take_sequences(self, indices: np.ndarray) -> SampleBatch:
        """The sequences at ``indices``, whole, in that order (a gather; copies)."""
        starts = self.sequence_starts()
        indices = np.asarray(indices, dtype=np.int64)
        seq_lens = dict.__getitem__(self, self.SEQ_LENS)[indices]
        rows = (np.repeat(starts[indices] - np.cumsum(seq_lens) + seq_lens, seq_lens)
                + np.arange(int(seq_lens.sum())))
        return SampleBatch({k: (v[indices] if is_sequence_column(k) else v[rows])
                            for k, v in self.items()})

    def split_sequences(self, num_parts: int) -> list[SampleBatch]:
        """``num_parts`` consecutive pieces of whole sequences, as equal in rows as the
        sequence boundaries allow; ValueError with fewer sequences than pieces."""
        if self.num_sequences < num_parts:
            raise ValueError(f"{self.num_sequences} sequences cannot be split into "
                             f"{num_parts} parts; give every part at least one sequence "
                             "(a larger train_batch_size, or fewer towers)")
        starts = self.sequence_starts()
        cuts = [0]
        for part in range(1, num_parts):
            target = self.count * part / num_parts
            index = int(np.abs(starts - target).argmin())
            # keep at least one sequence per part on each side
            index = min(max(index, cuts[-1] + 1), self.num_sequences - (num_parts - part))
            cuts.append(index)
        cuts.append(self.num_sequences)
        return [self.slice_sequences(a, b) for a, b in zip(cuts[:-1], cuts[1:])]

    @property
    def frame_pack(self) -> FramePack | None:
        """This batch's frame-stack columns as a :class:`~actorrl.data.frames.FramePack`, when
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
        """Iterate over rows as ``{column: value}`` dicts (slow; for tests and debugging);
        a sequenced batch's sequence columns are left out."""
        sequenced = self.is_sequenced
        columns = {k: v for k, v in self.items() if not (sequenced and is_sequence_column(k))}
        for i in range(self.count):
            yield {k: v[i] for k, v in columns.items()}

    def slice(self, start: int, end: int) -> SampleBatch:
        """Rows ``start:end`` as a new batch sharing memory with this one. A sequenced
        batch is cut only at sequence boundaries (ValueError otherwise)."""
        if self.is_sequenced:
            starts = self.sequence_starts()
            first, last = np.searchsorted(starts, [start, end])
            if (first >= len(starts) or last >= len(starts) or starts[first] != start
                    or starts[last] != end):
                raise ValueError(f"rows {start}:{end} cut a sequence; slice a sequenced "
                                 "batch at sequence boundaries (slice_sequences)")
            return self.slice_sequences(int(first), int(last))
        return SampleBatch({k: v[start:end] for k, v in self.items()})

    def take(self, indices: np.ndarray) -> SampleBatch:
        """Rows at ``indices`` (a gather; copies). A sequenced batch refuses: rows taken
        apart lose their sequences (use :meth:`take_sequences`)."""
        if self.is_sequenced:
            raise ValueError("take() would break the sequences of a sequenced batch; use "
                             "take_sequences()")
        return SampleBatch({k: v[indices] for k, v in self.items()})

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self.slice(*key.indices(self.count)[:2])
        return super().__getitem__(key)

    def shuffle(self, rng: np.random.Generator | None = None) -> SampleBatch:
        """Return the rows (a sequenced batch: the whole sequences) in a random order."""
        rng = rng or np.random.default_rng()
        if self.is_sequenced:
            return self.take_sequences(rng.permutation(self.num_sequences))
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
        """Split into consecutive slices of at most ``size`` rows (a sequenced batch: of
        whole sequences, at most ``size`` rows unless one sequence is longer)."""
        if self.is_sequenced:
            pieces, first, rows = [], 0, 0
            for index, length in enumerate(dict.__getitem__(self, self.SEQ_LENS).tolist()):
                if rows and rows + length > size:
                    pieces.append(self.slice_sequences(first, index))
                    first, rows = index, 0
                rows += length
            if rows:
                pieces.append(self.slice_sequences(first, self.num_sequences))
            return pieces
        return [self.slice(i, min(i + size, self.count)) for i in range(0, self.count, size)]

    def size_bytes(self) -> int:
        """Total bytes of all column arrays."""
        return sum(v.nbytes for v in self.values())

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.items())
        return f"SampleBatch({self.count}: {cols})"


def is_sequence_column(name: str) -> bool:
    """Whether column ``name`` has one row per sequence in a sequenced batch (``seq_lens``,
    ``state_in_*``)."""
    return name == SampleBatch.SEQ_LENS or name.startswith(SampleBatch.STATE_IN)


def chop_into_sequences(trajectory: SampleBatch, max_seq_len: int) -> SampleBatch:
    """One trajectory fragment (one env's consecutive steps of one episode, with a per-row
    ``state_in_*`` column for every state tensor) as a sequenced batch: sequences of
    ``max_seq_len`` steps from its start (the last one shorter), each keeping the state
    input of its first step."""
    if trajectory.is_sequenced:
        raise ValueError("the trajectory is already cut into sequences")
    count = trajectory.count
    starts = np.arange(0, count, max_seq_len)
    seq_lens = np.minimum(max_seq_len, count - starts).astype(np.int32)
    columns = {k: (v[starts] if k.startswith(SampleBatch.STATE_IN) else v)
               for k, v in trajectory.items()}
    columns[SampleBatch.SEQ_LENS] = seq_lens
    return SampleBatch(columns)


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

    def held_values(self) -> Iterable[SampleBatch]:
        """The per-policy batches: what the runtime counts when it estimates the size of
        a result holding this batch (``actorrl.runtime.process.hosting.HoldsValues``)."""
        return self.policy_batches.values()

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
