"""Frame-stacked observations carried with each distinct frame once.

A frame-stacked image observation (``[84, 84, 4]`` HWC or ``[4, 84, 84]`` CHW, uint8)
shares all but one frame with the next step's, and ``new_obs`` repeats ``obs`` one step
later: a batch of T steps holds 8T frames of which only about T + 4 differ. A
:class:`FramePack` holds those distinct frames once plus, per column and row, the index
of each stacked frame, and rebuilds the columns bit for bit.

Packing does not rely on how the env wrapper stacks frames: frames are matched by
content (a 64-bit fingerprint per frame, then an exact comparison with the frame it
matched), so resets that repeat the first frame, n-step ``new_obs`` and episode
boundaries inside a batch all come out exact; two frames share an index only when they
are byte-for-byte equal.

Plain numpy; registered with the wire codec so a pack crosses processes as a few
zero-copy frames.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport.codec import register_type

FRAME_COLUMNS = ("obs", "new_obs")
"""The columns packed when they hold frame stacks (``new_obs`` when present)."""

_FINGERPRINT_SEED = 0x5EED_F4A3


def stack_axis(row_shape: tuple[int, ...], dtype: np.dtype) -> int | None:
    """The axis of the frame stack within a row of a frame-stacked image column (2 for
    HWC, 0 for CHW), or None when the column is not one: uint8 rows of rank 3 whose
    stack axis is the one outer axis smaller than both others."""
    if dtype != np.uint8 or len(row_shape) != 3:
        return None
    a, b, c = row_shape
    if c < min(a, b) and not a < min(b, c):
        return 2
    if a < min(b, c) and not c < min(a, b):
        return 0
    return None


@dataclass(frozen=True, eq=False)
class FramePack:
    """Frame-stack columns as distinct frames plus indices.

    ``frames``: ``[M, *frame_shape]`` distinct frames, in order of first appearance.
    ``indices``: column name -> ``[T, stack]`` int32, the frame at each stack position.
    ``axis``: where the stack axis sits within a row (2: HWC, 0: CHW).
    """

    frames: np.ndarray
    indices: Mapping[str, np.ndarray]
    axis: int

    @property
    def count(self) -> int:
        """Rows of each packed column."""
        return len(next(iter(self.indices.values()))) if self.indices else 0

    @property
    def nbytes(self) -> int:
        """Bytes of the frames and indices."""
        return self.frames.nbytes + sum(ix.nbytes for ix in self.indices.values())

    def column(self, name: str) -> np.ndarray:
        """Column ``name`` rebuilt: ``[T, *row_shape]``, equal to the packed one (a view of
        one gather for HWC, the gather itself for CHW)."""
        stacked = self.frames[self.indices[name]]  # [T, stack, *frame_shape]
        return np.moveaxis(stacked, 1, self.axis + 1) if self.axis else stacked

    def columns(self) -> dict[str, np.ndarray]:
        """Every packed column rebuilt."""
        return {name: self.column(name) for name in self.indices}


def _words(flat: np.ndarray) -> np.ndarray:
    """``flat``'s rows as the widest unsigned words their length allows (a view): hashing
    and comparing 8-byte words is ~3x faster than bytes."""
    width = flat.shape[1]
    word = 8 if width % 8 == 0 else 4 if width % 4 == 0 else 1
    return flat.view({8: np.uint64, 4: np.uint32, 1: np.uint8}[word])


def _fingerprints(words: np.ndarray) -> np.ndarray:
    """A 64-bit fingerprint per row of ``words`` (a linear hash with fixed odd weights:
    equal rows always agree; unequal ones are told apart by the exact check after)."""
    weights = np.random.default_rng(_FINGERPRINT_SEED).integers(
        0, 2**63, size=words.shape[1], dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    return np.einsum("ij,j->i", words, weights)  # wraps mod 2**64; 4x the multiply+sum


def pack_frames(columns: Mapping[str, np.ndarray], axis: int) -> FramePack:
    """Pack frame-stack ``columns`` (same row shape, stack along ``axis`` of a row)."""
    names = list(columns)
    arrays = [columns[name] for name in names]
    rows, stack = arrays[0].shape[0], arrays[0].shape[axis + 1]
    frame_shape = tuple(d for i, d in enumerate(arrays[0].shape[1:]) if i != axis)
    per_column = rows * stack
    flat = np.empty((len(arrays) * per_column, int(np.prod(frame_shape))), np.uint8)
    for i, array in enumerate(arrays):  # each column's frames straight into place
        stacked = np.moveaxis(array, axis + 1, 1) if axis else array
        np.copyto(flat[i * per_column:(i + 1) * per_column].reshape(stacked.shape), stacked)
    if len(flat) == 0:
        empty = np.zeros((0, stack), np.int32)
        return FramePack(np.zeros((0, *frame_shape), np.uint8), dict.fromkeys(names, empty),
                         axis)
    words = _words(flat)
    _, first, inverse = np.unique(_fingerprints(words), return_index=True,
                                  return_inverse=True)
    representative = first[inverse.reshape(-1)]
    # Exact: a frame shares its representative's index only if byte-for-byte equal.
    differs = np.flatnonzero(~np.all(words == words[representative], axis=1))
    representative[differs] = differs
    kept = np.unique(representative)  # first appearances, in order
    position = np.empty(len(flat), np.int32)
    position[kept] = np.arange(len(kept), dtype=np.int32)
    ids = position[representative].reshape(len(names), rows, stack)
    frames = flat[kept].reshape(len(kept), *frame_shape)
    return FramePack(frames, {name: ids[i] for i, name in enumerate(names)}, axis)


def packable_columns(columns: Mapping[str, np.ndarray]) -> tuple[list[str], int] | None:
    """The :data:`FRAME_COLUMNS` of ``columns`` that hold frame stacks of one row shape,
    and their stack axis; None when there are none."""
    present = [name for name in FRAME_COLUMNS if name in columns]
    if not present:
        return None
    first = columns[present[0]]
    if first.ndim != 4:
        return None
    axis = stack_axis(first.shape[1:], first.dtype)
    if axis is None:
        return None
    if any(columns[n].shape != first.shape or columns[n].dtype != first.dtype
           for n in present[1:]):
        return None
    return present, axis


def _pack_to_wire(pack: FramePack) -> list[Any]:
    return [pack.frames, dict(pack.indices), pack.axis]


def _pack_from_wire(state: list[Any]) -> FramePack:
    frames, indices, axis = state
    if not (isinstance(frames, np.ndarray) and isinstance(indices, dict)
            and axis in (0, 2) and frames.ndim == 3):
        raise ValueError("malformed frame pack")
    for ix in indices.values():
        if not (isinstance(ix, np.ndarray) and ix.ndim == 2 and ix.dtype.kind in "iu"):
            raise ValueError("malformed frame pack indices")
        if ix.size and (ix.min() < 0 or ix.max() >= len(frames)):
            raise ValueError("frame pack index out of range")
    return FramePack(frames, indices, int(axis))


register_type(FramePack, "actorrl.FramePack", _pack_to_wire, _pack_from_wire)
