"""Durable files: the one atomic-write helper, and strict JSON for results and records.

:func:`atomic_write` writes a temporary file next to the target, fsyncs it, renames it over
the target and fsyncs the directory, so after a crash the target holds either the old or
the new content, never a torn mix, and the rename itself survives a power loss.
Checkpoint folders (:mod:`actorrl.algorithms.checkpoints`),
``run.json``/``config.json`` of a results
folder, a job's ``job.json`` and the coordinator's state file all go through it.

Blocking file I/O: call these from a thread when an event loop must stay responsive
(small files such as ``run.json`` are fine on the loop).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

Data = str | bytes | bytearray | memoryview


def write_synced(path: str | os.PathLike[str], data: Data | Iterable[Data]) -> None:
    """Write ``data`` (text, bytes, or an iterable of chunks) to ``path`` and fsync it."""
    chunks = [data] if isinstance(data, (str, bytes, bytearray, memoryview)) else data
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk.encode() if isinstance(chunk, str) else chunk)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make renames inside ``path`` durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: Data | Iterable[Data]) -> None:
    """Replace ``path`` with ``data`` atomically and durably (see the module docstring)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        write_synced(tmp, data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON: numpy scalars/arrays as Python values, NaN/inf as null,
    unknown objects as their ``str``."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def atomic_write_json(path: str | os.PathLike[str], value: Any, indent: int = 2) -> None:
    """:func:`atomic_write` of ``value`` as strict, key-sorted JSON (see :func:`jsonable`)."""
    atomic_write(path, json.dumps(jsonable(value), indent=indent, sort_keys=True,
                                  allow_nan=False) + "\n")
