"""Shared-memory segments this process owns: their files, names, header, and cleanup.

Segments are files in ``/dev/shm`` named ``actorrl-shm.<uid>.<pid>.<start>.<n>``: the
owner's uid and pid, the owner's start time (``/proc/<pid>/stat`` field 22, so a reused
pid is never mistaken for the owner) and a counter. Any process of the user can therefore
find and unlink the segments of owners that are gone (:func:`sweep_dead_owner_segments`,
run where a death is noticed and when runtimes start and close), and an owner unlinks its
own when it is done with them and at exit (:func:`unlink_owned`). A mapping stays valid
after its file is unlinked, so an owner may unlink a segment as soon as its receivers have
mapped it.

The first :data:`HEADER_BYTES` (64) bytes of every segment are a header: the 8 bytes
:data:`MAGIC`, then :data:`SLOTS` (56) *lent* bytes, one per receiver a pooled segment is
handed to at once (:mod:`transport.shm.pool`): the owner sets one when it hands the segment
out, the receiver clears it when it dropped what it read. The data follows the header.

A segment is created empty (:meth:`Segment.create`, for pooled and allocated segments) or
*placed*: holding one array written with ``pwrite`` (:meth:`Segment.from_array`), unlinked
when its object is freed (stored objects of an owner without a pool).
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import logging
import mmap
import os
import re
import threading
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "actorrl-shm."
HEADER_BYTES = 64
"""Bytes before the data of every segment: 8 magic bytes, then the lent bytes."""
MAGIC = b"ACTRLSHM"
LENT_OFFSET = len(MAGIC)
"""Offset of the first lent byte in a segment's header."""
SLOTS = HEADER_BYTES - LENT_OFFSET
"""Receivers one pooled segment can be lent to at once (one lent byte each)."""
NAME_PATTERN = re.compile(r"actorrl-shm\.(\d{1,10})\.(\d{1,10})\.(\d{1,20})\.(\d{1,20})")
"""A segment name: groups uid, owner pid, owner start time, counter."""
_NO_SLOT_LENT = bytes(SLOTS)
_lock = threading.Lock()
_owned: dict[str, Segment] = {}
_counter = itertools.count()
_identity: tuple[int, str] | None = None
_warned = False
_dir_fd: int | None = None


class ShmError(ValueError):
    """A handle names no acceptable segment (bad name, other user, too small, gone)."""


def enabled_by_env() -> bool:
    """False when ``ACTORRL_SHM=0`` (or ``false``/``off``/``no``) turns shared memory off."""
    return os.environ.get("ACTORRL_SHM", "1").strip().lower() not in ("0", "false", "off", "no")


def _proc_start(pid: int) -> tuple[str, str] | None:
    """``(state, start time)`` of process ``pid`` from ``/proc``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    if len(fields) < 20:
        return None
    return fields[0], fields[19]


def _my_identity() -> tuple[int, str]:
    global _identity
    if _identity is None or _identity[0] != os.getpid():
        pid = os.getpid()
        found = _proc_start(pid)
        _identity = (pid, found[1] if found else "0")
    return _identity


def _after_fork_in_child() -> None:
    """A forked child owns none of its parent's segments (and must not unlink them); the
    directory descriptor stays valid."""
    global _identity, _counter
    _owned.clear()
    _identity = None
    _counter = itertools.count()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _new_name() -> str:
    pid, start = _my_identity()
    return f"{PREFIX}{os.getuid()}.{pid}.{start}.{next(_counter)}"


def shm_dir_fd() -> int:
    """A descriptor of :data:`SHM_DIR`, opened once per process: segment files are opened
    relative to it, so a name off the wire can never be a path elsewhere."""
    global _dir_fd
    if _dir_fd is None:
        _dir_fd = os.open(SHM_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return _dir_fd


def available() -> bool:
    """Whether ``/dev/shm`` exists and this user can create files in it."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK)


def warn_fallback(exc: BaseException) -> None:
    """Log (once per process) that shared memory failed and ZeroMQ frames are used."""
    global _warned
    if not _warned:
        _warned = True
        log.warning("shared memory unavailable (%s): bulk arrays to same-host peers travel "
                    "as ZeroMQ frames instead", exc)


def _address(mm: mmap.mmap) -> int:
    buf = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(buf)
    finally:
        del buf


class Segment:
    """A segment this process created (and owns): a file in ``/dev/shm``, mapped
    read-write. Thread-safe to create and unlink."""

    __slots__ = ("name", "capacity", "mm", "address", "in_flight", "unlinked", "used_at",
                 "__weakref__")

    def __init__(self, name: str, capacity: int, mm: mmap.mmap) -> None:
        self.name = name
        self.capacity = capacity
        """Data bytes (the file is :data:`HEADER_BYTES` longer)."""
        self.mm = mm
        self.address = _address(mm)
        self.in_flight = False
        self.unlinked = False
        self.used_at = 0.0

    @classmethod
    def create(cls, capacity: int, reserve: bool = True) -> Segment:
        """A new segment of ``capacity`` data bytes. ``reserve``: allocate its pages now
        (``posix_fallocate``), so a full ``/dev/shm`` raises OSError here instead of
        SIGBUS on a later write."""

        def fill(fd: int) -> int:
            size = HEADER_BYTES + capacity
            if reserve:
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            os.pwrite(fd, MAGIC, 0)
            return capacity

        return cls._new_file(fill)

    @classmethod
    def from_array(cls, flat: np.ndarray) -> Segment:
        """A new segment holding the bytes of the contiguous uint8 array ``flat``, written
        with one ``pwrite`` (tmpfs does not zero pages a write covers whole)."""

        def fill(fd: int) -> int:
            os.pwrite(fd, MAGIC + bytes(HEADER_BYTES - len(MAGIC)), 0)
            view = memoryview(flat)
            done = 0
            while done < len(view):  # pwrite may write less than asked
                done += os.pwrite(fd, view[done:], HEADER_BYTES + done)
            return len(view)

        return cls._new_file(fill)

    @classmethod
    def _new_file(cls, fill: Callable[[int], int]) -> Segment:
        """A segment in a new file of a fresh name: ``fill(fd)`` writes its header and
        data and returns its data bytes; it is then mapped and counted as owned. The file
        is unlinked again when any of that fails."""
        name = _new_name()
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=shm_dir_fd())
        try:
            capacity = fill(fd)
            mm = mmap.mmap(fd, HEADER_BYTES + capacity)
        except BaseException:
            _unlink_name(name)
            raise
        finally:
            os.close(fd)
        segment = cls(name, capacity, mm)
        with _lock:
            _owned[name] = segment
        return segment

    @property
    def lent(self) -> bool:
        """Whether a receiver still reads data handed out (a lent byte is set)."""
        return self.mm[LENT_OFFSET:HEADER_BYTES] != _NO_SLOT_LENT

    def lend(self, slot: int = 0) -> None:
        """Mark the segment handed out to a receiver through lent byte ``slot`` (the
        receiver clears it when done)."""
        self.mm[LENT_OFFSET + slot] = 1

    def free_slot(self) -> int | None:
        """A lent byte no receiver holds, or None when all are held."""
        found = self.mm[LENT_OFFSET:HEADER_BYTES].find(0)
        return None if found < 0 else found

    def write(self, flat: np.ndarray, offset: int = 0) -> None:
        """Copy the uint8 array ``flat`` to data offset ``offset``."""
        dst = np.frombuffer(self.mm, np.uint8, count=flat.size, offset=HEADER_BYTES + offset)
        np.copyto(dst, flat)

    def unlink(self) -> None:
        """Remove the name (mappings, this one included, stay valid until unmapped)."""
        if self.unlinked:
            return
        self.unlinked = True
        with _lock:
            _owned.pop(self.name, None)
        _unlink_name(self.name)

    def __repr__(self) -> str:
        return f"Segment({self.name}, {self.capacity} bytes)"


def _unlink_name(name: str) -> None:
    try:
        os.unlink(name, dir_fd=shm_dir_fd())
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.debug("could not unlink shared-memory segment %s: %s", name, exc)


def list_segments(uid: int | None = None) -> list[str]:
    """Names of actorrl segments in ``/dev/shm`` (of ``uid``, this user by default)."""
    uid = os.getuid() if uid is None else uid
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    out = []
    for entry in entries:
        match = NAME_PATTERN.fullmatch(entry)
        if match is not None and int(match.group(1)) == uid:
            out.append(entry)
    return out


def _owner_alive(pid: int, start: str) -> bool:
    found = _proc_start(pid)
    return found is not None and found[0] not in ("Z", "X") and found[1] == start


def sweep_dead_owner_segments() -> list[str]:
    """Unlink this user's segments whose owner process is gone (or a zombie, or a
    different process reusing its pid); returns their names. Cheap: one directory listing
    and one ``/proc`` read per distinct owner."""
    removed = []
    verdict: dict[tuple[int, str], bool] = {}
    for name in list_segments():
        match = NAME_PATTERN.fullmatch(name)
        assert match is not None
        owner = (int(match.group(2)), match.group(3))
        alive = verdict.get(owner)
        if alive is None:
            alive = verdict[owner] = _owner_alive(*owner)
        if not alive:
            _unlink_name(name)
            removed.append(name)
    return removed


def unlink_owned() -> None:
    """Unlink every segment this process created and still names (at exit)."""
    with _lock:
        segments = list(_owned.values())
    for seg in segments:
        seg.unlink()


atexit.register(unlink_owned)
