"""Waiting for processes to exit, for tests that check nothing is left behind."""

from __future__ import annotations

import os
import select
import subprocess
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


def tcp_listeners(pid: int) -> int:
    """How many listening tcp sockets (IPv4 and IPv6) process ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                count += 1
    return count


def terminate(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM ``proc`` and reap it; SIGKILL it if it has not exited within ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
