"""Optional extras (``pip install -e ".[NAME]"``): checked before use, imported on demand.

``import actorrl`` and ``actorrl train`` without a tracker never import wandb, mlflow, onnx
or safetensors; a feature that needs one calls :func:`require_extra` first, which fails with
a :class:`~actorrl.experiment.errors.UsageError` naming the extra to install.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from actorrl.experiment.errors import UsageError


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` into a source checkout (and from PyPI)."""
    return f'pip install -e ".[{extra}]" (or pip install "actorrl[{extra}]")'


def require_extra(modules: str | tuple[str, ...], extra: str, feature: str) -> None:
    """:class:`UsageError` when a module of ``modules`` is not installed: ``feature`` (what
    the user asked for, e.g. ``--wandb``) needs the ``extra`` extra. Imports nothing."""
    for module in (modules,) if isinstance(modules, str) else modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UsageError(f"{feature} needs the {extra!r} extra, and {module} is not "
                             f"installed: {install_hint(extra)}")


def import_extra(module: str, extra: str, feature: str) -> ModuleType:
    """``module``, imported; :class:`UsageError` naming the extra when it is missing."""
    require_extra(module.split(".")[0], extra, feature)
    return importlib.import_module(module)
