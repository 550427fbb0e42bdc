"""Whether an optional extra's module can be imported (the atari and minatar extras)."""

from __future__ import annotations

import importlib


def installed(module: str) -> bool:
    """True when ``module`` imports (an optional dependency is installed and loads)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
