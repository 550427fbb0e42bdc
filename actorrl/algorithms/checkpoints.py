"""Checkpoints on disk: ``checkpoint_<iteration>/`` folders written atomically.

A checkpoint folder holds

``state.bin``
    the trainer's state (:meth:`actorrl.algorithms.Trainer.get_state`: policy weights,
    optimizer states, counters, config, algorithm name) in the wire codec's format: a small
    binary index followed by the codec's frames (msgpack header, then raw array buffers).
    No pickle.
``metadata.json``
    what a person or a script wants without loading arrays: algorithm, env, iteration,
    timesteps, reward, time written, format version and the actorrl version that wrote it.

Format versions: the state file's index and ``metadata.json`` carry
:data:`FORMAT_VERSION`, and the state itself ``format_version`` and ``actorrl_version``
(format 2, actorrl 0.3). A checkpoint of an older format is decoded and migrated on reading
(:data:`MIGRATIONS`, one step per format), so checkpoints written by earlier releases keep
restoring, evaluating and exporting; a checkpoint of a newer format is refused, naming both
versions (upgrade actorrl to read it).

Each checkpoint is first written into a hidden temporary folder next to its final place,
flushed to disk (:func:`actorrl.util.files.write_synced`), then renamed and the parent folder
fsynced; a folder named ``checkpoint_*`` is therefore always complete, and a crash
mid-write leaves only a ``.tmp`` folder that readers ignore (a checkpoint of the same
iteration written again is first moved aside under a hidden name, never deleted in place).

Training does not wait for the disk: :class:`BackgroundWriter` runs the writes in a
thread, one at a time, while the event loop and training go on; the caller only waits for
the state to be copied (the learner's ``get_state``).

Both ``actorrl train`` (the results folder's ``checkpoints/``) and cluster jobs (the job
folder's ``checkpoints/``) write this format, and ``actorrl evaluate`` reads either. A
checkpoint that cannot be found, read or decoded raises :class:`CheckpointError`; the
command line reports it as bad input when the user named the checkpoint, and a cluster job
as a failure of the job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actorrl import __version__
from actorrl.util.files import fsync_dir, jsonable, write_synced
from transport.codec import Codec, DecodeError, encode

log = logging.getLogger(__name__)

STATE_FILE = "state.bin"
METADATA_FILE = "metadata.json"
CHECKPOINTS_DIR = "checkpoints"
FORMAT_VERSION = 2
"""The checkpoint format this actorrl writes (1: actorrl 0.2; 2: the state records its
``format_version`` and ``actorrl_version``)."""
_MAGIC = b"ACTORRL\x00"
_INDEX_HEAD = struct.Struct("<8sII")  # magic, format version, frame count
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")
_FILE_CODEC = Codec(max_header_bytes=None)
"""Decodes state files: one's own files are trusted input, so no header cap (checkpoints
written before the cap existed may inline more than it allows)."""


class CheckpointError(Exception):
    """A checkpoint could not be found, read or decoded (missing, truncated, corrupt, of
    another format)."""


def _from_format_1(state: dict[str, Any]) -> dict[str, Any]:
    """Format 1 (actorrl 0.2) -> 2: the state learns its versions (0.2 wrote no
    ``actorrl_version``; every 0.2 release wrote format 1)."""
    return {**state, "format_version": 2, "actorrl_version": "0.2"}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_format_1}
"""Format ``n`` -> a function turning a decoded state of format ``n`` into format ``n + 1``."""


def migrate_state(state: dict[str, Any], version: int, path: str = STATE_FILE
                  ) -> dict[str, Any]:
    """``state`` (decoded from a file of format ``version``) in :data:`FORMAT_VERSION`;
    a migrated state records ``migrated_from_format``. :class:`CheckpointError` for a
    version that cannot be migrated."""
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {version}, written by a newer "
                              f"actorrl; this actorrl {__version__} reads formats 1 to "
                              f"{FORMAT_VERSION}: upgrade actorrl to load it")
    start = version
    while version < FORMAT_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise CheckpointError(f"{path} has checkpoint format {version}, which this "
                                  f"actorrl cannot migrate (it reads formats "
                                  f"{min(MIGRATIONS)} to {FORMAT_VERSION})")
        state = step(state)
        version += 1
    if start != FORMAT_VERSION:
        state["migrated_from_format"] = start
    return state


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
    """Parse what :func:`encode_state_file` wrote (an older format migrated, see the module
    docstring); :class:`CheckpointError` if it is not one."""
    view = memoryview(data)
    if len(view) < _INDEX_HEAD.size:
        raise CheckpointError(f"{path} is not an actorrl checkpoint (file too short)")
    magic, version, count = _INDEX_HEAD.unpack_from(view)
    if magic != _MAGIC:
        raise CheckpointError(f"{path} is not an actorrl checkpoint (bad magic bytes)")
    if version > FORMAT_VERSION or (version < FORMAT_VERSION and version not in MIGRATIONS):
        migrate_state({}, version, path)  # raises, naming the versions
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
    return migrate_state(state, version, path)


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
    versions = {"format_version": FORMAT_VERSION, "actorrl_version": __version__}
    try:
        write_synced(tmp / STATE_FILE, encode_state_file({**state, **versions}))
        meta = {**versions, "written_at": time.time(), **metadata}
        write_synced(tmp / METADATA_FILE, json.dumps(jsonable(meta), indent=2,
                                                     sort_keys=True))
        old = None
        if final.exists():  # the same iteration saved again (e.g. final == periodic):
            # moved aside, not deleted in place (a crash mid-delete would leave a folder
            # named checkpoint_* with some of its files gone)
            old = parent / f".{final.name}.old-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass
class WriteStats:
    """What a :class:`BackgroundWriter` did: writes done, superseded (a newer state came
    before the write started) and failed, and the last write's duration."""

    written: int = 0
    superseded: int = 0
    failed: int = 0
    last_write_s: float = 0.0


class BackgroundWriter:
    """Writes checkpoints in a thread, one at a time, so that the event loop (and the
    training it drives) never waits for the disk.

    :meth:`submit` hands over a write (a blocking function, typically
    :func:`write_checkpoint` of a state already copied in memory) and returns at once. A
    write submitted while another runs waits for it; a newer submission replaces one still
    waiting (it is counted as superseded: only the newest state matters). ``on_done`` runs
    on the event loop with the write's result once it is on disk. A failed write is logged
    as a warning and training goes on (the previous checkpoint stays the latest);
    :meth:`flush` waits for everything submitted and raises the last failure of what it
    waited for, so the final checkpoint's failure is not silent.
    """

    def __init__(self, what: str = "checkpoint") -> None:
        self.what = what
        self.stats = WriteStats()
        self._pending: tuple[Callable[[], Any], Callable[[Any], None] | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    @property
    def busy(self) -> bool:
        """Whether a write runs or waits."""
        return self._task is not None and not self._task.done()

    def submit(self, write: Callable[[], Any],
               on_done: Callable[[Any], None] | None = None) -> None:
        """Run ``write()`` in a thread after the write in progress (if any); ``on_done``
        gets its result on the event loop. Must be called on the event loop."""
        if self._pending is not None:
            self.stats.superseded += 1
        self._pending = (write, on_done)
        if not self.busy:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def flush(self) -> None:
        """Wait until every submitted write is done; raise the last one's error if the
        last write failed."""
        while self.busy:
            assert self._task is not None
            await asyncio.shield(self._task)
        error, self._error = self._error, None
        if error is not None:
            raise error

    async def _drain(self) -> None:
        while self._pending is not None:
            write, on_done = self._pending
            self._pending = None
            started = time.perf_counter()
            try:
                result = await asyncio.to_thread(write)
            except Exception as exc:  # noqa: BLE001 - a failed write must not stop training
                self.stats.failed += 1
                self._error = exc
                log.warning("writing a %s failed (training goes on; the previous one stays "
                            "the latest): %s", self.what, exc)
                continue
            self._error = None
            self.stats.written += 1
            self.stats.last_write_s = time.perf_counter() - started
            if on_done is not None:
                try:
                    on_done(result)
                except Exception:  # noqa: BLE001 - bookkeeping after the write
                    log.warning("after writing a %s", self.what, exc_info=True)


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
