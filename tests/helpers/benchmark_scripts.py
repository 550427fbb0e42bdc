"""Load a script of ``benchmarks/`` as a module, so tests can call its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent.parent / "benchmarks"
"""The repository's benchmarks folder."""


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as ``<name>_under_test``, registered in
    ``sys.modules`` (dataclasses defined in a module look it up there); see
    :func:`unload_benchmark`."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test",
                                                  BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def unload_benchmark(module: ModuleType) -> None:
    """Forget a module :func:`load_benchmark` registered."""
    sys.modules.pop(module.__name__, None)
