"""Algorithms: a typed config, a policy and a pipeline each, run by the Trainer.

Modules: :mod:`~actorrl.algorithms.registry` (the algorithms by name),
:mod:`~actorrl.algorithms.trainer` (the Trainer), :mod:`~actorrl.algorithms.run_loop`,
:mod:`~actorrl.algorithms.stop`, :mod:`~actorrl.algorithms.checkpoints` and
:mod:`~actorrl.algorithms.evaluation` (running one), and one module per algorithm. The
names below load on first use, so importing a light module of this package (stop
criteria, checkpoints) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "AlgorithmSpec": "actorrl.algorithms.trainer",
    "Trainer": "actorrl.algorithms.trainer",
    "algorithm_names": "actorrl.algorithms.registry",
    "get_algorithm": "actorrl.algorithms.registry",
}


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'actorrl.algorithms' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_NAMES)
