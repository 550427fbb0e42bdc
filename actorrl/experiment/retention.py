"""Which checkpoints a local ``actorrl train`` keeps: the newest ``keep`` and the best.

Every checkpoint records its score (the value of ``score_attr`` in the result of its
iteration, ``episode_reward_mean`` by default) in its ``metadata.json``. After each new
checkpoint, :meth:`Retention.prune` deletes all but the newest ``keep`` checkpoints and
the best-scored one (the highest score; with Tune's ``min-`` prefix, the lowest). The
newest always stays, so ``--restore RUN`` and a restart after a failure continue from it.
``keep`` 0 keeps every checkpoint.

Tune's ``keep_checkpoints_num`` and ``checkpoint_score_attr`` in an RLlib file set
``keep`` and ``score_attr``; ``--keep-checkpoints`` overrides the first.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actorrl.algorithms.checkpoints import METADATA_FILE, list_checkpoints

DEFAULT_KEEP = 5
"""Checkpoints kept besides the best (the newest ones)."""
DEFAULT_SCORE_ATTR = "episode_reward_mean"
"""The result key that ranks checkpoints."""
SCORE_KEY = "checkpoint_score"
"""The ``metadata.json`` key holding a checkpoint's ``{"attr": ..., "value": ...}``."""
MIN_PREFIX = "min-"
"""Tune's prefix for a score where lower is better (``min-episode_len_mean``)."""


@dataclass(frozen=True)
class Retention:
    """The newest ``keep`` checkpoints and the best by ``score_attr`` stay (module
    docstring)."""

    keep: int = DEFAULT_KEEP
    """Newest checkpoints kept; 0 keeps them all."""
    score_attr: str = DEFAULT_SCORE_ATTR
    """Result key ranking the checkpoints (``a/b`` for nested keys; ``min-`` prefix:
    lower is better)."""

    def __post_init__(self) -> None:
        if not isinstance(self.keep, int) or isinstance(self.keep, bool) or self.keep < 0:
            raise ValueError(f"the number of checkpoints to keep must be an integer >= 0 "
                             f"(0: all), got {self.keep!r}")
        if not isinstance(self.score_attr, str) or not self.attr:
            raise ValueError(f"checkpoint_score_attr must name a result key, got "
                             f"{self.score_attr!r}")

    @property
    def attr(self) -> str:
        """The result key, without Tune's ``min-`` prefix."""
        return self.score_attr.removeprefix(MIN_PREFIX)

    @property
    def lower_is_better(self) -> bool:
        """Whether the lowest score is the best (``min-`` prefix)."""
        return self.score_attr.startswith(MIN_PREFIX)

    def score_of(self, result: Mapping[str, Any] | None) -> dict[str, Any]:
        """The ``metadata.json`` entry for a checkpoint taken after ``result`` (its value
        None when the result lacks the key or it is not a finite number)."""
        value: Any = result
        for part in self.attr.split("/"):
            value = value.get(part) if isinstance(value, Mapping) else None
        finite = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value))
        return {"attr": self.attr, "value": float(value) if finite else None}

    def best(self, checkpoints_dir: str | Path) -> Path | None:
        """The best-scored checkpoint under ``checkpoints_dir`` (the newest of equals;
        None when none has a score for this attribute)."""
        best: tuple[float, Path] | None = None
        for folder in list_checkpoints(checkpoints_dir):
            value = self._recorded_score(folder)
            if value is None:
                continue
            key = -value if self.lower_is_better else value
            if best is None or key >= best[0]:
                best = (key, folder)
        return best[1] if best else None

    def prune(self, checkpoints_dir: str | Path) -> list[Path]:
        """Delete every checkpoint but the newest ``keep`` and the best; returns the
        deleted folders."""
        folders = list_checkpoints(checkpoints_dir)
        if self.keep == 0 or len(folders) <= self.keep:
            return []
        kept = set(folders[-self.keep:])
        best = self.best(checkpoints_dir)
        if best is not None:
            kept.add(best)
        deleted = [f for f in folders if f not in kept]
        for folder in deleted:
            shutil.rmtree(folder, ignore_errors=True)
        return deleted

    def _recorded_score(self, folder: Path) -> float | None:
        try:
            metadata = json.loads((folder / METADATA_FILE).read_text())
        except (OSError, ValueError):
            return None
        score = metadata.get(SCORE_KEY) if isinstance(metadata, dict) else None
        if not isinstance(score, dict) or score.get("attr") != self.attr:
            return None
        value = score.get("value")
        return float(value) if isinstance(value, (int, float)) else None
