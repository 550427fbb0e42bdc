"""Waiting for processes to exit, for tests that check nothing is left behind."""

from __future__ import annotations

import os
import select
import time


def pids_alive(pids: list[int], timeout_s: float) -> list[int]:
    """Wait (pidfds, no polling) until every pid has exited or ``timeout_s`` passed;
    returns the pids still running (a zombie awaiting its reaper counts as exited)."""
    fds = {}
    for pid in set(pids):
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    alive = set(fds)
    deadline = time.monotonic() + timeout_s
    try:
        while alive and (remaining := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(alive), [], [], remaining)
            alive -= set(ready)
    finally:
        for fd in fds:
            os.close(fd)
    return [fds[fd] for fd in alive if _running(fds[fd])]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
