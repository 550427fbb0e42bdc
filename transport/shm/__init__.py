"""Shared memory for bulk arrays moving between processes of one host.

The codec (:mod:`transport.codec`) places arrays at or above a threshold (256 KiB by
default) bound for a process on this host in a segment and sends only a *handle*; the
receiver maps the segment and reads the array in place. Across hosts nothing changes:
arrays travel as zero-copy ZeroMQ frames. The files, by job:

- :mod:`~transport.shm.segments`: the segment files this process owns (names, header,
  creation, unlinking, the sweep of dead owners' segments).
- :mod:`~transport.shm.pool`: pooled segments, reused for data a sender copies out.
- :mod:`~transport.shm.arrays`: numpy arrays over segments; arrays allocated in one.
- :mod:`~transport.shm.placers`: where the big arrays of an outgoing message go.
- :mod:`~transport.shm.mappings`: the receiver's side: checking handles, mapping segments.

Every name below is importable from ``transport.shm``; module state (e.g. the once-per-
process fallback warning) lives in the file that uses it.
"""

from transport.shm.arrays import empty, region_of
from transport.shm.mappings import (
    MAPPING_CACHE_BYTES,
    MAPPING_CACHE_ENTRIES,
    Mapped,
    check_name,
    forget_mappings,
    map_region,
    mapping_count,
    open_segment,
)
from transport.shm.placers import DEFAULT_THRESHOLD, CallPlacer, Handle, Placer, StoredPlacer
from transport.shm.pool import DEFAULT_POOL_BYTES, DEFAULT_POOL_IDLE_S, SegmentPool
from transport.shm.segments import (
    HEADER_BYTES,
    MAGIC,
    PREFIX,
    SHM_DIR,
    SLOTS,
    Segment,
    ShmError,
    available,
    enabled_by_env,
    list_segments,
    sweep_dead_owner_segments,
    unlink_owned,
    warn_fallback,
)

__all__ = [
    "DEFAULT_POOL_BYTES",
    "DEFAULT_POOL_IDLE_S",
    "DEFAULT_THRESHOLD",
    "HEADER_BYTES",
    "MAGIC",
    "MAPPING_CACHE_BYTES",
    "MAPPING_CACHE_ENTRIES",
    "PREFIX",
    "SHM_DIR",
    "SLOTS",
    "CallPlacer",
    "Handle",
    "Mapped",
    "Placer",
    "Segment",
    "SegmentPool",
    "ShmError",
    "StoredPlacer",
    "available",
    "check_name",
    "empty",
    "enabled_by_env",
    "forget_mappings",
    "list_segments",
    "map_region",
    "mapping_count",
    "open_segment",
    "region_of",
    "sweep_dead_owner_segments",
    "unlink_owned",
    "warn_fallback",
]
