"""The receiving side: mapping the segments that handles off the wire name.

A received message's handle (segment name, offset, lent slot) is checked before anything
is mapped (:func:`open_segment`): only names of the expected form with this process's uid,
opened inside ``/dev/shm`` without following links, owned by this uid, with the header
magic and a size that covers what the handle names. Arrays are then read in place
(``np.asarray`` over the mapping, read-only). For a pooled segment the receiver clears its
lent byte once the last array it read from the segment is garbage collected, and keeps the
mapping cached (:data:`MAPPING_CACHE_BYTES`), so a segment its sender refills costs
nothing the next time.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
import weakref
from collections import OrderedDict

import numpy as np

from transport.shm.arrays import region_array
from transport.shm.segments import (
    HEADER_BYTES,
    LENT_OFFSET,
    MAGIC,
    NAME_PATTERN,
    SLOTS,
    ShmError,
    shm_dir_fd,
)

_lock = threading.Lock()


def _clear_lent(name: str, slot: int) -> None:
    """Tell the owner of pooled segment ``name`` that its data is no longer read here: a
    ``pwrite`` of lent byte ``slot`` by name (a store through the mapping would fault the page in
    writable, and unmapping a written page costs a TLB shootdown, ~20 us on a VM). The name
    is never reused; gone means the owner dropped it."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=shm_dir_fd())
    except OSError:
        return
    try:
        os.pwrite(fd, b"\0", LENT_OFFSET + slot)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Mapping:
    """One read-only mapping of a received segment (shared by the uses of a cached one)."""

    __slots__ = ("name", "mm", "view", "address", "size", "__weakref__")

    def __init__(self, name: str, mm: mmap.mmap, size: int) -> None:
        self.name = name
        self.mm = mm
        self.size = size
        self.view = np.frombuffer(mm, np.uint8)
        self.address = self.view.__array_interface__["data"][0]


class Mapped:
    """A received segment, mapped read-only, for one message: hand out arrays with
    :meth:`array`. For a pooled segment its lent byte ``slot`` is cleared once the last of
    them is garbage collected."""

    __slots__ = ("mapping", "__weakref__")

    def __init__(self, mapping: _Mapping, slot: int | None) -> None:
        self.mapping = mapping
        if slot is not None:
            weakref.finalize(self, _clear_lent, mapping.name, slot)

    @property
    def name(self) -> str:
        """The segment's name."""
        return self.mapping.name

    def array(self, offset: int, nbytes: int) -> np.ndarray:
        """A read-only uint8 array over data bytes ``[offset, offset + nbytes)``."""
        mapping = self.mapping
        if offset < 0 or nbytes < 0 or HEADER_BYTES + offset + nbytes > mapping.size:
            raise ShmError(f"handle names bytes {offset}..{offset + nbytes} of segment "
                           f"{mapping.name} whose data is {mapping.size - HEADER_BYTES} "
                           "bytes")
        # self is what the arrays keep alive: its finalizer runs once every array of this
        # message is gone
        return region_array(self, mapping.address, mapping.name, None, offset, nbytes,
                            readonly=True)[1]


MAPPING_CACHE_ENTRIES = 32
MAPPING_CACHE_BYTES = 256 * 2**20
"""Receivers keep the mappings of up to this many (and this many bytes of) pooled
segments: a sender refills the same few segments, so the next message that names one
costs no open/mmap and no page faults (a fresh mapping faults its pages in as they are
read, ~0.5 ms per 8 MiB here, and unmapping read pages costs TLB shootdowns). Entries
whose segment was unlinked are dropped at the next miss."""
_mappings: OrderedDict[str, _Mapping] = OrderedDict()
_mappings_bytes = 0


def _after_fork_in_child() -> None:
    """A forked child starts with no cached mappings (its parent's arrays keep theirs)."""
    global _mappings_bytes
    _mappings.clear()
    _mappings_bytes = 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def _cached_mapping(name: str) -> _Mapping:
    global _mappings_bytes
    with _lock:
        found = _mappings.get(name)
        if found is not None:
            _mappings.move_to_end(name)
            return found
    mapping = _map(name)
    with _lock:
        for stale in [n for n in _mappings if not _exists(n)]:
            _mappings_bytes -= _mappings.pop(stale).size
        _mappings[name] = mapping
        _mappings_bytes += mapping.size
        while len(_mappings) > 1 and (len(_mappings) > MAPPING_CACHE_ENTRIES
                                      or _mappings_bytes > MAPPING_CACHE_BYTES):
            _mappings_bytes -= _mappings.popitem(last=False)[1].size
    return mapping


def _exists(name: str) -> bool:
    try:
        os.stat(name, dir_fd=shm_dir_fd(), follow_symlinks=False)
    except OSError:
        return False
    return True


def mapping_count() -> int:
    """How many received pooled segments this process keeps mapped (a cache bounded
    by bytes; unlinked segments are dropped at the next miss)."""
    with _lock:
        return len(_mappings)


def forget_mappings() -> None:
    """Drop the cached mappings of received pooled segments (arrays still using one keep
    it until they are collected)."""
    global _mappings_bytes
    with _lock:
        _mappings.clear()
        _mappings_bytes = 0


def check_name(name: str) -> None:
    """ShmError unless ``name`` is a segment name of this user (never a path)."""
    match = NAME_PATTERN.fullmatch(name)
    if match is None:
        raise ShmError(f"not a shared-memory segment name: {name[:80]!r}")
    if int(match.group(1)) != os.getuid():
        raise ShmError(f"segment {name!r} belongs to another user")


def open_segment(name: str, slot: int | None = None) -> Mapped:
    """Map the segment ``name`` (a name off the wire: checked, see the module docstring)
    for one message. ``slot``: the lent byte of a pooled segment this receiver clears when
    done (its mapping is cached). Raises ShmError."""
    check_name(name)
    if slot is None:
        return Mapped(_map(name), None)
    if not 0 <= slot < SLOTS:
        raise ShmError(f"lent slot {slot} out of range")
    return Mapped(_cached_mapping(name), slot)


def _map(name: str) -> _Mapping:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=shm_dir_fd())
    except OSError as exc:
        raise ShmError(f"cannot open segment {name!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ShmError(f"segment {name!r} is not a regular file of this user")
        if info.st_size < HEADER_BYTES or os.pread(fd, len(MAGIC), 0) != MAGIC:
            raise ShmError(f"segment {name!r} has no valid header")
        try:
            mm = mmap.mmap(fd, info.st_size, prot=mmap.PROT_READ)
        except (OSError, ValueError) as exc:
            raise ShmError(f"cannot map segment {name!r}: {exc}") from None
    finally:
        os.close(fd)
    return _Mapping(name, mm, info.st_size)


def map_region(name: str, offset: int, nbytes: int, slot: int | None = None) -> np.ndarray:
    """Open ``name`` and return a read-only uint8 array over the data bytes it names."""
    return open_segment(name, slot).array(offset, nbytes)
