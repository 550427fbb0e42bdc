"""Resolve ``"pkg.module:attr"`` strings to Python objects, with errors that name the problem.

Env factories, custom models and policy classes are named this way in configs, because
configs cross process boundaries as plain data.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any


def resolve(path: str, what: str) -> Any:
    """Import ``"pkg.module:attr"`` (``attr`` may be dotted, ``"mod:Outer.Inner"``).

    ``what`` names the role in error messages (``"env factory"``, ``"custom_model"``).
    Raises ``ValueError`` for a malformed path, an unimportable module or a missing attribute
    (with close-match suggestions from the module's names).
    """
    if not isinstance(path, str) or path.count(":") != 1:
        raise ValueError(f"{what} must be a 'pkg.module:name' string, got {path!r}")
    module_name, attr_path = path.split(":")
    if not module_name or not attr_path:
        raise ValueError(f"{what} must be a 'pkg.module:name' string, got {path!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"{what} {path!r}: cannot import module {module_name!r} ({exc})"
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{what} {path!r}: {obj.__name__!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def resolve_callable(spec: Any, what: str) -> Any:
    """``spec`` itself when callable, else :func:`resolve` it and check it is callable."""
    if callable(spec):
        return spec
    obj = resolve(spec, what)
    if not callable(obj):
        raise ValueError(f"{what} {spec!r} is a {type(obj).__name__}, not a callable")
    return obj
