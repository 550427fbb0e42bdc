"""Process limits that bound what peers can make a server hold: file descriptors.

libzmq accepts tcp connections eagerly and has no cap of its own; at the fd limit its
accept loop spins (``accept`` fails with EMFILE, the listener stays readable) and starves
every other socket of the process. :func:`raise_fd_limit` lifts the soft ``RLIMIT_NOFILE``
to the hard one at the start of a long-running server, and :func:`peer_budget` bounds the
peer cap (:class:`transport.rpc.RpcServer` ``max_peers``) so that the cap is reached long
before the fd limit: connections past the cap are refused in the handshake and closed, and
those that never handshake are closed after ``handshake_timeout_s``.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

FD_RESERVE = 256
"""Descriptors kept for the process's own files, pipes, children and outbound sockets."""


def fd_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` of this process (a large number when unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_fd_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (never lower it); returns the
    soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft and (hard == resource.RLIM_INFINITY or soft != resource.RLIM_INFINITY
                         and hard > soft):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:  # e.g. above the kernel's nr_open
            log.debug("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
    return fd_limit()


def peer_budget(max_peers: int) -> int:
    """``max_peers`` lowered, if need be, so that twice that many connections (the peers,
    plus as many not yet handshaken) still leave :data:`FD_RESERVE` descriptors free."""
    return max(1, min(max_peers, (fd_limit() - FD_RESERVE) // 2))
