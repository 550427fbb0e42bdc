"""Shared-memory segments for bulk arrays moving between processes of one host.

The codec (:mod:`transport.codec`) places arrays at or above a threshold (default
:data:`DEFAULT_THRESHOLD`, 256 KiB) bound for a process on this host in a segment here and
sends only a *handle* (segment name, offset); the receiver maps the segment and reads the
array in place (``np.asarray`` over the mapping, read-only). Across hosts nothing changes:
arrays travel as zero-copy ZeroMQ frames.

Segments are files in ``/dev/shm`` named ``actorrl-shm.<uid>.<pid>.<start>.<n>``: the
owner's uid and pid, the owner's start time (``/proc/<pid>/stat`` field 22, so a reused
pid is never mistaken for the owner) and a counter. Any process of the user can therefore
find and unlink the segments of owners that are gone (:func:`sweep_dead_owner_segments`,
run where a death is noticed and when runtimes start and close), and an owner unlinks its
own when it is done with them and at exit. A mapping stays valid after its file is
unlinked, so an owner may unlink a segment as soon as its receivers have mapped it.

Three kinds of segment, by who decides their lifetime:

- *Pooled* (:class:`SegmentPool`: call arguments, and stored objects fetched by others):
  the owner copies the array into a segment it keeps mapped and reuses. The first 64
  bytes of every segment are a header: 8 magic bytes, then 56 *lent* bytes. The owner sets
  one when it hands the segment to a receiver (the handle names it), the receiver clears
  it when the last array it read from the segment is garbage collected. A segment is
  reused only when it is neither in flight (call not answered, object not freed) nor
  lent. Creating a fresh segment costs page allocation (on this VM ~2.7 ms per 8 MiB, more
  than sending it through a ZeroMQ frame); refilling a pooled one costs one ``memcpy``.
  Receivers cache the mappings of pooled segments, so a refilled one costs them nothing.
- *Placed* (:meth:`Segment.from_array`): one segment per array written with ``pwrite``,
  unlinked when its object is freed (stored objects of an owner without a pool).
- *Allocated* (:func:`empty`): the producer builds its array directly in a segment;
  sending it copies nothing. Unlinked when the producer's array is garbage collected.

Handles read off the wire are checked (:func:`open_segment`): only names of the expected
form with this process's uid, opened inside ``/dev/shm`` without following links, owned by
this uid, with the header magic and a size that covers what the handle names.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import logging
import mmap
import os
import re
import stat
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_POOL_BYTES",
    "DEFAULT_THRESHOLD",
    "HEADER_BYTES",
    "PREFIX",
    "SHM_DIR",
    "CallPlacer",
    "Handle",
    "Placer",
    "Segment",
    "SegmentPool",
    "ShmError",
    "StoredPlacer",
    "available",
    "empty",
    "enabled_by_env",
    "forget_mappings",
    "mapping_count",
    "list_segments",
    "map_region",
    "open_segment",
    "region_of",
    "sweep_dead_owner_segments",
    "unlink_owned",
]

SHM_DIR = "/dev/shm"
PREFIX = "actorrl-shm."
DEFAULT_THRESHOLD = 256 * 1024
"""Arrays of at least this many bytes go through shared memory to same-host peers."""
DEFAULT_POOL_BYTES = 256 * 2**20
"""Segment bytes a :class:`SegmentPool` keeps named at most (older ones are unlinked)."""
DEFAULT_POOL_IDLE_S = 10.0
"""Pooled segments unused this long are unlinked by :meth:`SegmentPool.trim`."""
HEADER_BYTES = 64
"""Bytes before the data of every segment: 8 magic bytes, then the lent bytes."""
MAGIC = b"ACTRLSHM"
_LENT = 8
SLOTS = HEADER_BYTES - _LENT
"""Receivers one pooled segment can be lent to at once (one lent byte each)."""
_NO_SLOT_LENT = bytes(SLOTS)
_ALIGN = 64
_NAME = re.compile(r"actorrl-shm\.(\d{1,10})\.(\d{1,10})\.(\d{1,20})\.(\d{1,20})")
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
    global _identity, _counter, _mappings_bytes
    _owned.clear()
    _mappings.clear()
    _mappings_bytes = 0
    _identity = None
    _counter = itertools.count()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _new_name() -> str:
    pid, start = _my_identity()
    return f"{PREFIX}{os.getuid()}.{pid}.{start}.{next(_counter)}"


def _shm_dir_fd() -> int:
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
        name = _new_name()
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=_shm_dir_fd())
        try:
            size = HEADER_BYTES + capacity
            if reserve:
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            os.pwrite(fd, MAGIC, 0)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            _unlink_name(name)
            raise
        os.close(fd)
        segment = cls(name, capacity, mm)
        with _lock:
            _owned[name] = segment
        return segment

    @classmethod
    def from_array(cls, flat: np.ndarray) -> Segment:
        """A new segment holding the bytes of the contiguous uint8 array ``flat``, written
        with one ``pwrite`` (tmpfs does not zero pages a write covers whole)."""
        name = _new_name()
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=_shm_dir_fd())
        try:
            os.pwrite(fd, MAGIC + bytes(HEADER_BYTES - len(MAGIC)), 0)
            view = memoryview(flat)
            done = 0
            while done < len(view):  # pwrite may write less than asked
                done += os.pwrite(fd, view[done:], HEADER_BYTES + done)
            size = HEADER_BYTES + len(view)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            _unlink_name(name)
            raise
        os.close(fd)
        segment = cls(name, len(view), mm)
        with _lock:
            _owned[name] = segment
        return segment

    @property
    def lent(self) -> bool:
        """Whether a receiver still reads data handed out (a lent byte is set)."""
        return self.mm[_LENT:HEADER_BYTES] != _NO_SLOT_LENT

    def lend(self, slot: int = 0) -> None:
        """Mark the segment handed out to a receiver through lent byte ``slot`` (the
        receiver clears it when done)."""
        self.mm[_LENT + slot] = 1

    def free_slot(self) -> int | None:
        """A lent byte no receiver holds, or None when all are held."""
        found = self.mm[_LENT:HEADER_BYTES].find(0)
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
        os.unlink(name, dir_fd=_shm_dir_fd())
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.debug("could not unlink shared-memory segment %s: %s", name, exc)


class SegmentPool:
    """Reusable segments for data a sender copies out (call arguments).

    :meth:`acquire` returns a segment not in flight and not lent (its last receiver
    dropped what it read), creating one when none fits; :meth:`finish` hands it back when
    the call is answered or the stored object freed (``ok``), or unlinks it (the call
    failed: whether the receiver will ever read it is unknown). At most ``max_bytes`` of
    segments stay named: past that the least recently used ones not in flight are unlinked
    (a receiver still reading one keeps its mapping). Thread-safe.
    """

    def __init__(self, max_bytes: int = DEFAULT_POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self._segments: list[Segment] = []  # least recently used first
        self._bytes = 0
        self._lock = threading.Lock()
        self.created = 0
        self.reused = 0

    def acquire(self, nbytes: int) -> Segment:
        """A segment of at least ``nbytes`` data bytes, marked in flight (lend it with
        :meth:`Segment.lend`). Raises OSError when none can be created (``/dev/shm``
        missing or full)."""
        need = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        with self._lock:
            for i, seg in enumerate(self._segments):
                if (not seg.in_flight and need <= seg.capacity <= 2 * need
                        and not seg.lent):
                    del self._segments[i]
                    self._segments.append(seg)
                    seg.in_flight = True
                    self.reused += 1
                    return seg
            self._evict(self.max_bytes - need)
        seg = Segment.create(need)
        seg.in_flight = True
        with self._lock:
            self._segments.append(seg)
            self._bytes += seg.capacity
            self.created += 1
        return seg

    def _evict(self, limit: int) -> None:
        """Unlink idle segments, oldest first, until at most ``limit`` bytes stay."""
        i = 0
        while self._bytes > limit and i < len(self._segments):
            seg = self._segments[i]
            if seg.in_flight:
                i += 1
                continue
            del self._segments[i]
            self._bytes -= seg.capacity
            seg.unlink()

    def finish(self, segments: Iterable[Segment], ok: bool) -> None:
        """The call that carried ``segments`` is over: reuse them (``ok``) or drop them."""
        now = time.monotonic()
        with self._lock:
            for seg in segments:
                seg.in_flight = False
                seg.used_at = now
                if not ok and seg in self._segments:
                    self._segments.remove(seg)
                    self._bytes -= seg.capacity
                    seg.unlink()

    def trim(self, max_idle_s: float = DEFAULT_POOL_IDLE_S) -> int:
        """Unlink the segments not in flight and unused for ``max_idle_s``; returns how
        many stay (a burst of big calls does not keep its memory named for good)."""
        limit = time.monotonic() - max_idle_s
        with self._lock:
            keep = []
            for seg in self._segments:
                if seg.in_flight or seg.used_at > limit:
                    keep.append(seg)
                else:
                    self._bytes -= seg.capacity
                    seg.unlink()
            self._segments = keep
            return len(keep)

    @property
    def nbytes(self) -> int:
        """Bytes of the segments the pool keeps named."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        """Unlink every segment of the pool."""
        with self._lock:
            segments, self._segments, self._bytes = self._segments, [], 0
        for seg in segments:
            seg.unlink()


# ---------------------------------------------------------------------------- allocated


class _Region:
    """Base object of arrays over a mapping: keeps the mapping alive as long as any array
    (or view) over it is, and knows the segment it came from."""

    __slots__ = ("__array_interface__", "segment", "name", "address", "mm", "__weakref__")


def _region_array(mm: mmap.mmap, address: int, name: str, segment: Segment | None,
                  offset: int, nbytes: int, readonly: bool) -> tuple[_Region, np.ndarray]:
    region = _Region()
    region.segment = segment
    region.name = name
    region.address = address
    region.mm = mm
    region.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "version": 3,
                                  "data": (address + HEADER_BYTES + offset, readonly)}
    return region, np.asarray(region)


def empty(shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """A new writable C-contiguous array allocated in a shared-memory segment owned by this
    process: sent to a same-host peer it travels as a handle, with no copy at all (e.g. a
    replay shard gathering a sampled batch into it). The segment is unlinked when the array
    (and every view of it) is garbage collected; receivers that mapped it keep their
    mapping. Raises OSError when ``/dev/shm`` cannot hold it."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    segment = Segment.create(max(nbytes, 1))
    region, flat = _region_array(segment.mm, segment.address, segment.name, segment, 0,
                                 nbytes, readonly=False)
    weakref.finalize(region, segment.unlink)
    return flat.view(dtype).reshape(shape)


def region_of(arr: np.ndarray) -> tuple[Segment, int] | None:
    """``(segment, data offset)`` when ``arr`` lies in a segment this process allocated
    with :func:`empty`, else None."""
    base = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    if type(base) is not _Region or base.segment is None or base.segment.unlinked:
        return None
    offset = arr.__array_interface__["data"][0] - base.address - HEADER_BYTES
    if offset < 0 or offset + arr.nbytes > base.segment.capacity:
        return None
    return base.segment, offset


# ---------------------------------------------------------------------------- placing


Handle = tuple[str, int, int]
"""``(segment name, data offset, lent slot + 1 or 0)``: what the wire carries instead of
an array; a receiver clears the lent byte it names once it dropped the data."""


class Placer:
    """Decides where the big arrays of one message go (the codec asks :meth:`place` for
    each array of at least :attr:`threshold` bytes; None means "as a ZeroMQ frame")."""

    threshold: int = DEFAULT_THRESHOLD

    def place(self, arr: np.ndarray, flat: np.ndarray) -> Handle | None:
        """Put ``arr`` (whose bytes are the contiguous uint8 ``flat``) in shared memory and
        return its handle, or None to send it as a frame."""
        raise NotImplementedError


class CallPlacer(Placer):
    """Arrays of one outgoing call: copied into segments of ``pool`` (arrays allocated
    with :func:`empty` go as they are), all held until :meth:`finish`."""

    __slots__ = ("pool", "threshold", "segments", "keep")

    def __init__(self, pool: SegmentPool, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.pool = pool
        self.threshold = threshold
        self.segments: list[Segment] = []
        self.keep: list[np.ndarray] = []

    def place(self, arr: np.ndarray, flat: np.ndarray) -> Handle | None:
        """See :meth:`Placer.place`."""
        found = region_of(arr)
        if found is not None:
            self.keep.append(arr)  # alive (named) until the call is answered
            return found[0].name, found[1], 0
        try:
            seg = self.pool.acquire(flat.nbytes)
        except OSError as exc:
            warn_fallback(exc)
            return None
        self.segments.append(seg)
        seg.write(flat)
        seg.lend(0)
        return seg.name, 0, 1

    def finish(self, ok: bool) -> None:
        """The call was answered (``ok``) or failed: release what it held."""
        if self.segments:
            self.pool.finish(self.segments, ok)
            self.segments = []
        self.keep = []


class StoredPlacer(Placer):
    """Arrays of a stored object answered to same-host fetches: each copied once into a
    segment of ``pool`` (or, without a pool, a segment of its own written with
    ``pwrite``), remembered in ``cache`` (keyed by the address and size of the array's
    bytes, which the stored object keeps alive) and handed to every later fetch through a
    lent byte of its own (:data:`SLOTS` fetchers at once; more get frames). When the object
    is freed the owner calls :meth:`release`: pooled segments go back to the pool (reused
    once every fetcher dropped its data), others are unlinked. One placer per reply."""

    __slots__ = ("cache", "threshold", "pool", "slots")

    def __init__(self, cache: dict[tuple[int, int], tuple[np.ndarray, Segment]],
                 threshold: int = DEFAULT_THRESHOLD, pool: SegmentPool | None = None) -> None:
        self.cache = cache
        self.threshold = threshold
        self.pool = pool
        self.slots: dict[str, int] = {}  # segment -> slot lent to this reply

    def place(self, arr: np.ndarray, flat: np.ndarray) -> Handle | None:
        """See :meth:`Placer.place`."""
        found = region_of(arr)
        key = (flat.__array_interface__["data"][0], flat.nbytes)
        if found is not None:
            self.cache.setdefault(key, (arr, found[0]))  # keeps it alive, not unlinked
            return found[0].name, found[1], 0
        hit = self.cache.get(key)
        if hit is None:
            try:
                if self.pool is not None:
                    seg = self.pool.acquire(flat.nbytes)
                    seg.write(flat)
                else:
                    seg = Segment.from_array(flat)
            except OSError as exc:
                warn_fallback(exc)
                return None
            # flat stays alive: its address is not reused while the entry exists
            hit = self.cache[key] = (flat, seg)
        seg = hit[1]
        if self.pool is None:
            return seg.name, 0, 0
        slot = self.slots.get(seg.name)
        if slot is None:
            slot = seg.free_slot()
            if slot is None:
                return None
            seg.lend(slot)
            self.slots[seg.name] = slot
        return seg.name, 0, slot + 1

    @staticmethod
    def release(cache: dict[tuple[int, int], tuple[np.ndarray, Segment]],
                pool: SegmentPool | None = None) -> None:
        """The object was freed: hand its pooled segments back to ``pool``, unlink the
        others it placed (arrays allocated with :func:`empty` unlink when collected)."""
        pooled = []
        for arr, seg in cache.values():
            if region_of(arr) is not None:
                continue
            if pool is not None and seg.in_flight:
                pooled.append(seg)
            else:
                seg.unlink()
        if pooled:
            pool.finish(pooled, ok=True)
        cache.clear()


# ---------------------------------------------------------------------------- receiving


def _clear_lent(name: str, slot: int) -> None:
    """Tell the owner of pooled segment ``name`` that its data is no longer read here: a
    ``pwrite`` of lent byte ``slot`` by name (a store through the mapping would fault the page in
    writable, and unmapping a written page costs a TLB shootdown, ~20 us on a VM). The name
    is never reused; gone means the owner dropped it."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=_shm_dir_fd())
    except OSError:
        return
    try:
        os.pwrite(fd, b"\0", _LENT + slot)
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
        region = _Region()
        region.segment = None
        region.name = mapping.name
        region.address = mapping.address
        region.mm = self  # its finalizer runs once every array of this message is gone
        region.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "version": 3,
                                      "data": (mapping.address + HEADER_BYTES + offset, True)}
        return np.asarray(region)


MAPPING_CACHE_ENTRIES = 32
MAPPING_CACHE_BYTES = 256 * 2**20
"""Receivers keep the mappings of up to this many (and this many bytes of) pooled
segments: a sender refills the same few segments, so the next message that names one
costs no open/mmap and no page faults (a fresh mapping faults its pages in as they are
read, ~0.5 ms per 8 MiB here, and unmapping read pages costs TLB shootdowns). Entries
whose segment was unlinked are dropped at the next miss."""
_mappings: OrderedDict[str, _Mapping] = OrderedDict()
_mappings_bytes = 0


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
        os.stat(name, dir_fd=_shm_dir_fd(), follow_symlinks=False)
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
    match = _NAME.fullmatch(name)
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
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=_shm_dir_fd())
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


# ---------------------------------------------------------------------------- cleanup


def list_segments(uid: int | None = None) -> list[str]:
    """Names of actorrl segments in ``/dev/shm`` (of ``uid``, this user by default)."""
    uid = os.getuid() if uid is None else uid
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    out = []
    for entry in entries:
        match = _NAME.fullmatch(entry)
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
        match = _NAME.fullmatch(name)
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
