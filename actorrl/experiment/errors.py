"""Errors of the command-line layer and their one-line summaries.

:class:`UsageError` is bad input (exit code 2): an unknown algorithm or env, a bad config
key or value, a missing file. :func:`error_summary` turns any exception, including the
runtime's multi-line remote errors, into one line for the terminal; the full text and
traceback go to the run's log file.
"""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input on the command line or in a file it names; reported as one line, exit 2."""


def error_summary(exc: BaseException) -> str:
    """One line naming the problem: the exception's type (unless it is generic) and the
    first line of its message (a remote error's traceback and an actor start's log tail
    are never part of that: they follow its first line, or are fields of their own)."""
    # lazily: this module loads before numpy
    from actorrl.runtime.errors import ActorCreationError
    from transport.errors import RemoteError

    if isinstance(exc, RemoteError):
        text = f"{exc.type_name}: {exc.message}"
    else:
        text = exc.reason if isinstance(exc, ActorCreationError) else str(exc)
        if not text:
            return type(exc).__name__
        if not type(exc).__module__.startswith("actorrl"):
            text = f"{type(exc).__name__}: {text}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else text
    if first.endswith(":") and len(lines) > 1:
        # A header over its listed problems (ConfigError): the problems are the point.
        problems = []
        for line in lines[1:]:
            if not line.startswith("- "):
                break
            problems.append(line[2:])
        if problems:
            return f"{first} {'; '.join(problems)}"
    return first
