"""Checkpoints on disk: ``checkpoint_<iteration>/`` folders written atomically.

A checkpoint folder holds

``state.bin``
    the trainer's state (:meth:`actorrl.algorithms.Trainer.get_state`: policy weights,
    optimizer states, counters, config, algorithm name) in the wire codec's format: a small
    binary index followed by the codec's frames (msgpack header, then raw array buffers).
    No pickle.
``metadata.json``
    what a person or a script wants without loading arrays: algorithm, env, iteration,
    timesteps, reward, time written.

Each checkpoint is first written into a hidden temporary folder next to its final place,
flushed to disk (:func:`actorrl.util.files.write_synced`), then renamed and the parent folder
fsynced; a folder named ``checkpoint_*`` is therefore always complete, and a crash
mid-write leaves only a ``.tmp`` folder that readers ignore.

Both ``actorrl train`` (the results folder's ``checkpoints/``) and cluster jobs (the job
folder's ``checkpoints/``) write this format, and ``actorrl evaluate`` reads either. A
checkpoint that cannot be found, read or decoded raises :class:`CheckpointError`; the
command line reports it as bad input when the user named the checkpoint, and a cluster job
as a failure of the job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
from pathlib import Path
from typing import Any

from actorrl.util.files import fsync_dir, jsonable, write_synced
from transport.codec import Codec, DecodeError, encode

STATE_FILE = "state.bin"
METADATA_FILE = "metadata.json"
CHECKPOINTS_DIR = "checkpoints"
FORMAT_VERSION = 1
_MAGIC = b"ACTORRL\x00"
_INDEX_HEAD = struct.Struct("<8sII")  # magic, format version, frame count
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")
_FILE_CODEC = Codec(max_header_bytes=None)
"""Decodes state files: one's own files are trusted input, so no header cap (checkpoints
written before the cap existed may inline more than it allows)."""


class CheckpointError(Exception):
    """A checkpoint could not be found, read or decoded (missing, truncated, corrupt, of
    another format)."""


def checkpoint_name(iteration: int) -> str:
    """The folder name of the checkpoint taken after ``iteration``."""
    return f"checkpoint_{iteration:06d}"


def encode_state_file(state: dict[str, Any]) -> list[Any]:
    """The byte chunks of a state file: index (magic, version, frame sizes), then frames."""
    frames = encode(state)
    sizes = [memoryview(f).nbytes for f in frames]
    index = _INDEX_HEAD.pack(_MAGIC, FORMAT_VERSION, len(frames))
    index += struct.pack(f"<{len(sizes)}Q", *sizes)
    return [index, *frames]


def decode_state_file(data: bytes | bytearray, path: str = STATE_FILE) -> dict[str, Any]:
    """Parse what :func:`encode_state_file` wrote; :class:`CheckpointError` if it is not
    one."""
    view = memoryview(data)
    if len(view) < _INDEX_HEAD.size:
        raise CheckpointError(f"{path} is not an actorrl checkpoint (file too short)")
    magic, version, count = _INDEX_HEAD.unpack_from(view)
    if magic != _MAGIC:
        raise CheckpointError(f"{path} is not an actorrl checkpoint (bad magic bytes)")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {version}; this actorrl reads "
                              f"format {FORMAT_VERSION}")
    pos = _INDEX_HEAD.size
    if len(view) < pos + 8 * count:
        raise CheckpointError(f"{path} is truncated (frame index incomplete)")
    sizes = struct.unpack_from(f"<{count}Q", view, pos)
    pos += 8 * count
    if pos + sum(sizes) != len(view):
        raise CheckpointError(f"{path} is truncated or corrupt: expected {pos + sum(sizes)} "
                              f"bytes, found {len(view)}")
    frames = []
    for size in sizes:
        frames.append(view[pos:pos + size])
        pos += size
    try:
        state = _FILE_CODEC.decode(frames)
    except DecodeError as exc:
        raise CheckpointError(f"{path} is corrupt: {exc}") from None
    if not isinstance(state, dict) or "policies" not in state or "algorithm" not in state:
        raise CheckpointError(f"{path} does not hold a trainer state")
    return state


def write_checkpoint(checkpoints_dir: str | os.PathLike[str], state: dict[str, Any],
                     metadata: dict[str, Any]) -> Path:
    """Write ``state`` (a trainer state) and ``metadata`` as
    ``checkpoints_dir/checkpoint_<iteration>/``, atomically; returns the folder.

    Blocking file I/O: call it from a thread when an event loop is running.
    """
    parent = Path(checkpoints_dir)
    parent.mkdir(parents=True, exist_ok=True)
    final = parent / checkpoint_name(int(state["iteration"]))
    tmp = parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_synced(tmp / STATE_FILE, encode_state_file(state))
        meta = {"format_version": FORMAT_VERSION, "written_at": time.time(), **metadata}
        write_synced(tmp / METADATA_FILE, json.dumps(jsonable(meta), indent=2,
                                                     sort_keys=True))
        if final.exists():  # the same iteration saved again (e.g. final == periodic)
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(parent)
    return final


def list_checkpoints(checkpoints_dir: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoint folders under ``checkpoints_dir``, oldest iteration first."""
    parent = Path(checkpoints_dir)
    if not parent.is_dir():
        return []
    found = []
    for child in parent.iterdir():
        match = _CHECKPOINT_NAME.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def prune_checkpoints(checkpoints_dir: str | os.PathLike[str], keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints under ``checkpoints_dir``."""
    for old in list_checkpoints(checkpoints_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """Resolve ``path`` to one checkpoint folder: a checkpoint folder itself, its
    ``state.bin``, a ``checkpoints/`` folder or a results folder (the latest checkpoint).
    :class:`CheckpointError` naming what was looked for otherwise."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if p.is_file():
        if p.name == STATE_FILE:
            return p.parent
        raise CheckpointError(f"{str(path)!r} is a file, not a checkpoint folder")
    if (p / STATE_FILE).is_file():
        return p
    for candidates in (list_checkpoints(p), list_checkpoints(p / CHECKPOINTS_DIR)):
        if candidates:
            return candidates[-1]
    raise CheckpointError(f"no checkpoint in {str(path)!r}: expected a checkpoint_<n>/ "
                          f"folder holding {STATE_FILE}, or a results folder with "
                          f"{CHECKPOINTS_DIR}/")


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """Find (see :func:`find_checkpoint`) and load a checkpoint: ``(folder, state)``."""
    folder = find_checkpoint(path)
    state_path = folder / STATE_FILE
    try:
        with open(state_path, "rb") as f:
            data = bytearray(f.read())  # writable, so restored arrays are writable too
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {str(state_path)!r}: "
                              f"{exc.strerror}") from None
    return folder, decode_state_file(data, str(state_path))
