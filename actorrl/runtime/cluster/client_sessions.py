"""The coordinator's client sessions: when each last pinged, and which are silent.

A client opens a session with its first actor creation and pings it while it holds
actors; a session silent for ``timeout_s`` belongs to a client that went away without
closing, and the coordinator stops its actors. A session waiting on an actor creation is
not silent (its pings start once its first creation returns).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator

DEFAULT_SESSION_TIMEOUT_S = 20.0
"""A client session that has not pinged for this long is ended (its actors stopped)."""


class ClientSessions:
    """The live client sessions and their last pings (monotonic time)."""

    def __init__(self, timeout_s: float = DEFAULT_SESSION_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.pinged: dict[str, float] = {}
        """Client sessions owning actors -> when they last pinged (monotonic)."""
        self._creating: collections.Counter[str] = collections.Counter()
        """Client sessions -> their actor creations under way."""

    def __contains__(self, session: object) -> bool:
        return session in self.pinged

    def touch(self, session: str) -> None:
        """Record a sign of life of ``session`` (opening it if new)."""
        self.pinged[session] = time.monotonic()

    def forget(self, session: str) -> None:
        """End ``session`` (no-op when unknown)."""
        self.pinged.pop(session, None)

    @contextlib.contextmanager
    def creating(self, session: str) -> Iterator[None]:
        """Open ``session`` and keep it from expiring while an actor creation for it runs;
        a creation slower than the timeout must not end the session under it (its actor
        would then belong to no session and outlive a dead client)."""
        self.touch(session)
        self._creating[session] += 1
        try:
            yield
        finally:
            self._creating[session] -= 1
            if not self._creating[session]:
                del self._creating[session]
            if session in self.pinged:
                self.touch(session)

    def expire(self, now: float) -> list[tuple[str, float]]:
        """Forget the sessions silent for longer than the timeout at time ``now`` (none
        waiting on a creation); returns them with their silence in seconds."""
        expired = []
        for session, pinged in list(self.pinged.items()):
            if now - pinged > self.timeout_s and not self._creating[session]:
                del self.pinged[session]
                expired.append((session, now - pinged))
        return expired
