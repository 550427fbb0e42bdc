"""One short line for an error, for logs that say what failed (what died, why) without
tracebacks or socket paths: :func:`failure_line`."""

from __future__ import annotations

import re

_HANDLE_DIED = re.compile(r"ActorHandle\((?P<name>\S+) #\w+ @ [^)]*\)(?: at \S+)? died"
                          r"(?P<colon>:?)\s*(?P<reason>.*)")
_OWNER_DIED = re.compile(r"owner of ObjectRef\([^)]*\)(?: at \S+)? died: (?P<reason>.*)")


def failure_line(exc: BaseException) -> str:
    """``learner died: <reason>`` for an actor's death (without its handle's endpoints),
    ``an object's owner died: <reason>`` for a lost object, else the error's type (unless
    it is actorrl's own) and the first line of its message (a remote error's traceback
    left out)."""
    type_name, message = getattr(exc, "type_name", None), getattr(exc, "message", None)
    if isinstance(type_name, str) and isinstance(message, str):  # a RemoteError
        text = f"{type_name}: {message}"
    else:
        text = str(exc) or type(exc).__name__
        if not type(exc).__module__.startswith("actorrl") and str(exc):
            text = f"{type(exc).__name__}: {text}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    match = _HANDLE_DIED.search(first)
    if match:
        return f"{match['name']} died{match['colon']} {match['reason']}"
    match = _OWNER_DIED.search(first)
    if match:
        return f"an object's owner died: {match['reason']}"
    return first
