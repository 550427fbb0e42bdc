"""Child processes for tests: starting one and waiting for its ready line, finding the
processes below one, waiting for processes to exit (tests check nothing is left behind)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from actorrl.runtime.node.fork_server import PRELOAD_ENV
from actorrl.runtime.node.process import descendant_pids

NO_TORCH_PRELOAD = {PRELOAD_ENV: "numpy"}
"""Environment for a node or driver whose actors are plain test actors: its fork server
preloads numpy only, not torch (~2 s of CPU per start saved)."""

REPO = Path(__file__).resolve().parent.parent.parent
"""The repository root (children run there, with it on PYTHONPATH)."""


def child_env(**extra: str) -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH, plus ``extra``."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def start_python(args: Sequence[str], log_path: Path | str, *, stdin: int | None =
                 subprocess.PIPE, stdout: int | None = subprocess.PIPE,
                 pass_fds: tuple[int, ...] = (),
                 preexec_fn: Callable[[], None] | None = None,
                 env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """``python ARGS`` in the repository with its stderr (and, unless piped, stdout) in
    ``log_path``; ``env``: variables set for it over :func:`child_env`'s."""
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, *args], cwd=REPO,
                                env=child_env(**(env or {})),
                                stdin=stdin, stdout=log if stdout is None else stdout,
                                stderr=log if stdout is not None else subprocess.STDOUT,
                                pass_fds=pass_fds, preexec_fn=preexec_fn)


def ready_line(proc: subprocess.Popen, source: IO[bytes] | int, prefix: str,
               timeout_s: float, log_path: Path | str) -> str:
    """The first line a starting child writes to ``source`` (its stdout pipe, or the read
    end of a ``--ready-fd`` pipe), which must start with ``prefix``. Otherwise the child
    is killed and the test fails with what it said and its log's tail."""
    fd = source if isinstance(source, int) else source.fileno()
    ready, _, _ = select.select([fd], [], [], timeout_s)
    if not ready:
        line = ""
    elif isinstance(source, int):
        line = os.read(fd, 4096).decode()
    else:
        line = source.readline().decode()
    if not line.startswith(prefix):
        proc.kill()
        proc.wait(10)
        tail = Path(log_path).read_text(errors="replace")[-3000:]
        raise AssertionError(f"{proc.args[1:3]} did not start within {timeout_s:g} s: "
                             f"{line!r}\n{tail}")
    return line.strip()


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    return descendant_pids(pid)


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
