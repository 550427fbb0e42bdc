"""Temporary session folders (sockets, logs) that do not outlive a killed process.

:func:`make_session_dir` creates ``$TMPDIR/actorrl-<kind>-XXXX`` (mode 0700, as
``mkdtemp``) with the creating process's pid in it. A process that exits normally removes
its folder itself; one killed by SIGKILL cannot, so :func:`remove_stale_session_dirs`
(run whenever a new session starts) removes this user's folders whose process is gone,
and the shared-memory segments (:mod:`transport.shm`) of this user's dead processes.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from transport.shm import sweep_dead_owner_segments

PREFIX = "actorrl-"
_OWNER_FILE = "owner.pid"


def make_session_dir(kind: str = "") -> str:
    """A fresh private folder ``actorrl-[kind-]XXXX`` recording this process as its owner;
    stale folders of dead owners are removed first."""
    remove_stale_session_dirs()
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-" if kind else PREFIX)
    with open(os.path.join(path, _OWNER_FILE), "w") as f:
        f.write(str(os.getpid()))
    return path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_session_dirs() -> list[str]:
    """Remove this user's session folders whose owner process no longer runs; returns
    them. Folders without an owner file are left alone (not ours to judge). Shared-memory
    segments of dead owners are swept too."""
    sweep_dead_owner_segments()
    root = tempfile.gettempdir()
    removed = []
    try:
        entries = os.listdir(root)
    except OSError:
        return removed
    for entry in entries:
        if not entry.startswith(PREFIX):
            continue
        path = os.path.join(root, entry)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            with open(os.path.join(path, _OWNER_FILE)) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
        if pid > 0 and not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
