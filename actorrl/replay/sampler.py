"""How a replay buffer picks rows: the :class:`Sampler` protocol and :class:`UniformSampler`.

A sampler keeps whatever per-slot state its strategy needs (priorities, say), is told of
every write, retirement and priority update, and draws slots. It never touches the rows:
the buffer gathers them from its :class:`~actorrl.replay.storage.Storage`. A new strategy is
one class implementing this protocol.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from actorrl.replay.storage import Storage, Written


class Sampler(Protocol):
    """A sampling strategy over the slots of one buffer's storage. Not thread-safe."""

    def bind(self, capacity: int) -> None:
        """Size for a storage of ``capacity`` slots; called once, by the buffer."""

    def on_write(self, written: Written) -> None:
        """Rows were written at ``written``'s slots with the default priority (rows added
        with explicit priorities arrive through :meth:`update_priorities` instead)."""

    def on_retire(self, slots: np.ndarray) -> None:
        """The rows at ``slots`` were retired: never draw them again."""

    def sample(self, num_items: int, storage: Storage,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        """``num_items`` live slots (int64) and their importance weights (float32), or None
        for no weights. ``storage`` holds at least one live row."""

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set priorities of live held ``slots`` (1-D intp; finite, > 0 float64 priorities,
        already checked by the buffer; duplicates possible, the last one wins)."""

    def stats(self, debug: bool) -> dict[str, Any]:
        """The sampler's figures for the buffer's ``stats``."""


class UniformSampler:
    """Uniform sampling with replacement over the live rows; priorities are ignored."""

    def bind(self, capacity: int) -> None:
        """Nothing to size."""

    def on_write(self, written: Written) -> None:
        """Nothing to record."""

    def on_retire(self, slots: np.ndarray) -> None:
        """Nothing to record: the storage's live window excludes retired rows."""

    def sample(self, num_items: int, storage: Storage,
               rng: np.random.Generator) -> tuple[np.ndarray, None]:
        """Live slots drawn uniformly; no weights."""
        live = storage.num_live
        # Scaling a uniform float is ~5x cheaper than Generator.integers for small draws;
        # the bias is below 2**-53 * live.
        offsets = (rng.random(num_items) * live).astype(np.int64)
        np.minimum(offsets, live - 1, out=offsets)
        return storage.live_slots(offsets), None

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Uniform sampling has no priorities."""

    def stats(self, debug: bool) -> dict[str, Any]:
        """No figures of its own."""
        return {}
