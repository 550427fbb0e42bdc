"""Message codec: one msgpack header frame plus zero-copy raw frames for bulk arrays.

``encode(obj)`` returns a list of frames ready for ``send_multipart(copy=False)``: frame 0 is
the msgpack header; every numpy array (or CPU torch tensor) at or above
``inline_threshold`` bytes travels as its own frame that references the array's memory,
so nothing is copied on the way out. ``decode(frames)`` rebuilds arrays with
``np.frombuffer`` over the received frames, so nothing is copied on the way in either.
Small arrays are packed inline in the header, which is faster below ~64 KB, up to
``max_inline_bytes`` per message (past that they travel as frames too).

For a receiver on the same host, ``encode(obj, placer)`` sends arrays of at least
``placer.threshold`` bytes (256 KiB by default) as shared-memory *handles* instead
(extension types 3 and 4: dtype, shape, segment name and offset; see
:mod:`transport.shm`): the receiver maps the segment and reads the array in place.
``decode`` accepts handles only when asked to (``allow_shm=True``, which the RPC layer
sets only for requests and replies of ipc peers); a handle is checked like any other
field (name form and uid, no path, segment size) and is a :class:`DecodeError` otherwise.

Decoding is bounded whatever a peer sends: the header frame is at most
``max_header_bytes`` (1 MiB by default; a header of that size decodes in well under
~100 ms here whatever its content, arrays in their own frames cost nothing to decode),
nesting depth is msgpack's own limit, and maps with composite (list) keys whose hashes
collide are refused before a dict is built (crafted collisions made a 490 KB header take
12 s). The cyclic garbage collector is paused while a header is unpacked (it made
deeply nested input ~8x slower).

There is no pickle anywhere. Values that cross the wire are msgpack natives (None, bool,
int, float, str, bytes, list, tuple -> list, dict), numpy arrays and scalars, CPU torch
tensors (decoded as tensors where torch is already imported, else as numpy arrays: a
message never makes a process load torch), and types registered with
:func:`register_type`. Anything else raises
:class:`EncodeError` at the sender naming the type.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import numpy as np

from transport.shm.mappings import open_segment
from transport.shm.placers import Placer
from transport.shm.segments import ShmError

__all__ = [
    "Codec",
    "DecodeError",
    "EncodeError",
    "decode",
    "encode",
    "register_dataclass",
    "set_type_resolver",
    "register_type",
]

EXT_ARRAY = 1
EXT_TENSOR = 2
EXT_SHM_ARRAY = 3
EXT_SHM_TENSOR = 4
TYPE_MARKER = "\x00actorrl.type"
DEFAULT_INLINE_THRESHOLD = 64 * 1024
DEFAULT_MAX_INLINE_BYTES = 256 * 1024
DEFAULT_MAX_HEADER_BYTES = 1 << 20
MAX_KEY_HASH_COLLISIONS = 16
"""Composite map keys sharing a hash beyond this many are refused (no legitimate map has
more than a handful; a flood has thousands)."""
MAX_ARRAY_BYTES = 2**31 - 1

_HEAD = struct.Struct("<BBBi")  # dtype length, ndim, flags, frame index (-1 = inline)
_SHM_HEAD = struct.Struct("<BBBBQ")  # dtype length, ndim, flags, lent slot+1, data offset
_FLAG_FORTRAN = 1


class EncodeError(TypeError):
    """A value cannot be encoded for the wire (unknown type, object dtype, too large)."""


class DecodeError(ValueError):
    """Received frames are not a valid message (bad msgpack, bad array header, ...)."""


@dataclass(frozen=True)
class _Registered:
    cls: type
    tag: str
    to_wire: Callable[[Any], Any]
    from_wire: Callable[[Any], Any]


T = TypeVar("T")

_by_class: dict[type, _Registered] = {}
_by_tag: dict[str, _Registered] = {}


def register_type(
    cls: type,
    tag: str,
    to_wire: Callable[[Any], Any],
    from_wire: Callable[[Any], Any],
) -> None:
    """Let instances of ``cls`` cross the wire.

    ``to_wire(obj)`` returns a codec-serializable state (arrays inside travel zero-copy);
    ``from_wire(state)`` rebuilds the object. ``tag`` names the type on the wire and must
    be unique; the receiving process must have imported the module that registers it.
    Exact-class lookup is used, so subclasses need their own registration.
    """
    existing = _by_tag.get(tag)
    if existing is not None and existing.cls is not cls:
        raise ValueError(f"codec tag {tag!r} is already registered for {existing.cls!r}")
    entry = _Registered(cls, tag, to_wire, from_wire)
    _by_class[cls] = entry
    _by_tag[tag] = entry


_type_resolver: Callable[[str], None] | None = None


def set_type_resolver(resolver: Callable[[str], None] | None) -> None:
    """Install what a decode calls with a wire type's tag before refusing it as unknown
    (e.g. importing the module that registers it, for modules the caller trusts); the
    lookup is retried once after. ``None`` removes it."""
    global _type_resolver
    _type_resolver = resolver


def _lookup_tag(tag: str) -> _Registered | None:
    entry = _by_tag.get(tag)
    if entry is None and _type_resolver is not None and isinstance(tag, str):
        _type_resolver(tag)
        entry = _by_tag.get(tag)
    return entry


def register_dataclass(cls: type[T], tag: str | None = None) -> type[T]:
    """Let a dataclass cross the wire as a map of its fields (usable as a decorator).

    Fields travel through the codec themselves (arrays zero-copy, registered types by tag);
    tuples come back as lists unless the class converts them in ``__post_init__``. The tag
    defaults to ``module.QualName``.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"register_dataclass needs a dataclass, got {cls!r}")
    names = tuple(f.name for f in dataclasses.fields(cls) if f.init)

    def to_wire(obj: Any) -> dict[str, Any]:
        return {name: getattr(obj, name) for name in names}

    def from_wire(state: dict[str, Any]) -> Any:
        return cls(**state)

    register_type(cls, tag or f"{cls.__module__}.{cls.__qualname__}", to_wire, from_wire)
    return cls


def _array_ext(arr: np.ndarray, frames: list, inline_budget: list[int], allow_large: bool,
               code: int, placer: Placer | None = None) -> msgpack.ExtType:
    """The extension record of ``arr``: inline while it is below ``inline_budget[0]``
    (the threshold) and fits ``inline_budget[1]`` (what this message may still inline,
    decremented), else a shared-memory handle when ``placer`` takes it, else a reference
    to a new frame in ``frames``."""
    dtype = arr.dtype
    if dtype.hasobject or dtype.fields is not None:
        raise EncodeError(
            f"numpy arrays of dtype {dtype!r} cannot cross the wire (object and structured "
            "dtypes are refused); convert to a plain numeric dtype first"
        )
    if arr.nbytes > MAX_ARRAY_BYTES and not allow_large:
        raise EncodeError(
            f"array of {arr.nbytes} bytes exceeds the 2 GiB limit; split it, or build the "
            "Codec with allow_large=True"
        )
    flags = 0
    if not arr.flags.c_contiguous:
        if arr.flags.f_contiguous and arr.ndim > 1:
            flags = _FLAG_FORTRAN
        else:
            arr = np.ascontiguousarray(arr)
    dtype_str = dtype.str.encode()
    flat = arr.ravel(order="K").view(np.uint8) if arr.size else np.empty(0, np.uint8)
    shape = struct.pack(f"<{arr.ndim}q", *arr.shape)
    if arr.nbytes < inline_budget[0] and arr.nbytes <= inline_budget[1]:
        inline_budget[1] -= arr.nbytes
        head = _HEAD.pack(len(dtype_str), arr.ndim, flags, -1)
        return msgpack.ExtType(code, head + dtype_str + shape + flat.tobytes())
    if placer is not None and arr.nbytes >= placer.threshold:
        handle = placer.place(arr, flat)
        if handle is not None:
            name, offset, slot = handle
            head = _SHM_HEAD.pack(len(dtype_str), arr.ndim, flags, slot, offset)
            return msgpack.ExtType(code + (EXT_SHM_ARRAY - EXT_ARRAY),
                                   head + dtype_str + shape + name.encode())
    frames.append(flat.data)
    head = _HEAD.pack(len(dtype_str), arr.ndim, flags, len(frames) - 1)
    return msgpack.ExtType(code, head + dtype_str + shape)


def _checked_dtype_and_shape(data: bytes, pos: int, dlen: int,
                             ndim: int) -> tuple[np.dtype, tuple[int, ...], int]:
    """The dtype (text of ``dlen`` bytes at ``pos``) and shape (``ndim`` int64s after it)
    of an array record off the wire, and the position after them. The security checks of
    every array header: DecodeError for an unknown dtype, an object or structured dtype
    (never accepted from the wire), or a negative dimension."""
    dtype_text = data[pos:pos + dlen].decode()
    try:
        dtype = np.dtype(dtype_text)
    except TypeError:  # repr: a name read off the wire never reaches a log unescaped
        raise DecodeError(f"malformed array header: unknown dtype {dtype_text!r}") from None
    pos += dlen
    shape = struct.unpack_from(f"<{ndim}q", data, pos)
    pos += 8 * ndim
    if dtype.hasobject or dtype.fields is not None:
        raise DecodeError("object and structured arrays are never accepted from the wire")
    if any(d < 0 for d in shape):
        raise DecodeError(f"malformed array header: negative dimension in array shape {shape}")
    return dtype, shape, pos


def _array_from_ext(data: bytes, frames: Sequence[Any]) -> np.ndarray:
    try:
        dlen, ndim, flags, index = _HEAD.unpack_from(data)
        dtype, shape, pos = _checked_dtype_and_shape(data, _HEAD.size, dlen, ndim)
        count = math.prod(shape)
        if index < 0:
            buf: Any = bytearray(memoryview(data)[pos:])  # small: copy so it is writable
        else:
            if index >= len(frames):
                raise DecodeError(
                    f"malformed array header: refers to frame {index} of {len(frames)}")
            frame = frames[index]
            buf = frame.buffer if hasattr(frame, "buffer") else frame
        if memoryview(buf).nbytes != count * dtype.itemsize:
            raise DecodeError(f"malformed array header: shape {shape} and dtype {dtype} needs "
                              f"{count * dtype.itemsize} bytes, got {memoryview(buf).nbytes}")
        flat = np.frombuffer(buf, dtype=dtype, count=count)
        order = "F" if flags & _FLAG_FORTRAN else "C"
        return flat.reshape(shape, order=order)
    except DecodeError:
        raise
    except Exception as exc:  # any malformed header is a decode error, never a crash
        raise DecodeError(f"malformed array header: {str(exc)!r}") from exc


def _array_from_shm(data: bytes, mapped: dict[str, Any]) -> np.ndarray:
    """The array a shared-memory record names, mapped (once per segment per message, in
    ``mapped``); every field off the wire is checked (see
    :func:`transport.shm.mappings.open_segment`)."""
    try:
        dlen, ndim, flags, slot, offset = _SHM_HEAD.unpack_from(data)
        dtype, shape, pos = _checked_dtype_and_shape(data, _SHM_HEAD.size, dlen, ndim)
        nbytes = math.prod(shape) * dtype.itemsize
        name = data[pos:].decode("ascii")
        segment = mapped.get(name)
        if segment is None:
            segment = mapped[name] = open_segment(name, slot - 1 if slot else None)
        flat = segment.array(offset, nbytes)
        mapped[""] = mapped.get("", 0) + nbytes  # bytes that arrived through segments
        order = "F" if flags & _FLAG_FORTRAN else "C"
        return flat.view(dtype).reshape(shape, order=order)
    except DecodeError:
        raise
    except ShmError as exc:
        raise DecodeError(f"bad shared-memory handle: {exc}") from None
    except Exception as exc:  # any malformed record is a decode error, never a crash
        raise DecodeError(f"malformed shared-memory array header: {str(exc)!r}") from exc


class Codec:
    """Encoder/decoder of multipart messages; one per process is enough (it is thread-safe).

    ``inline_threshold``: arrays smaller than this many bytes are packed into the header,
    at most ``max_inline_bytes`` of them per message. ``allow_large``: accept arrays above
    2 GiB. ``max_header_bytes``: the largest header frame :meth:`decode` accepts (None: no
    cap, for trusted input such as one's own checkpoint files).
    """

    def __init__(self, inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
                 allow_large: bool = False, *,
                 max_inline_bytes: int = DEFAULT_MAX_INLINE_BYTES,
                 max_header_bytes: int | None = DEFAULT_MAX_HEADER_BYTES) -> None:
        self.inline_threshold = inline_threshold
        self.allow_large = allow_large
        self.max_inline_bytes = max_inline_bytes
        self.max_header_bytes = max_header_bytes
        self._local = threading.local()

    def _state(self) -> tuple[msgpack.Packer, list]:
        local = self._local
        packer = getattr(local, "packer", None)
        if packer is None:
            local.frames = []
            packer = msgpack.Packer(default=self._default, use_bin_type=True, autoreset=True,
                                    strict_types=True)
            local.packer = packer
        return packer, local.frames

    def _default(self, obj: Any) -> Any:
        local = self._local
        frames, budget = local.frames, local.inline_budget
        if isinstance(obj, np.ndarray):
            return _array_ext(obj, frames, budget, self.allow_large, EXT_ARRAY, local.placer)
        if isinstance(obj, np.generic):
            if isinstance(obj, np.bool_):
                return bool(obj)
            if isinstance(obj, np.integer):
                return int(obj)
            if isinstance(obj, np.floating) and obj.dtype.itemsize <= 8:
                return float(obj)
            return _array_ext(np.asarray(obj), frames, budget, self.allow_large, EXT_ARRAY,
                              local.placer)
        entry = _by_class.get(type(obj))
        if entry is not None:
            return {TYPE_MARKER: entry.tag, "v": entry.to_wire(obj)}
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            if obj.device.type != "cpu":
                raise EncodeError(
                    f"torch tensor on {obj.device} cannot cross the wire; call .cpu() first"
                )
            return _array_ext(obj.detach().numpy(), frames, budget, self.allow_large,
                              EXT_TENSOR, local.placer)
        if isinstance(obj, (tuple, list, set, frozenset)):
            return list(obj)
        if isinstance(obj, dict):
            return dict(obj)
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        raise EncodeError(
            f"cannot encode object of type {type(obj).__module__}.{type(obj).__qualname__}: "
            "only msgpack natives, numpy arrays, CPU torch tensors and types registered "
            "with transport.codec.register_type cross the wire"
        )

    def encode(self, obj: Any, placer: Placer | None = None) -> list[Any]:
        """Encode ``obj`` into ``[header, *buffers]``; buffers reference the arrays' memory.

        With ``placer`` (only for a receiver on this host), arrays of at least
        ``placer.threshold`` bytes that it accepts travel as shared-memory handles in the
        header instead of frames (see :mod:`transport.shm`)."""
        packer, frames = self._state()
        frames.clear()
        local = self._local
        local.inline_budget = [self.inline_threshold, self.max_inline_bytes]
        local.placer = placer
        try:
            header = packer.pack(obj)
        except EncodeError:
            packer.reset()
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            packer.reset()
            raise EncodeError(f"cannot encode value: {exc}") from exc
        finally:
            local.placer = None
        out = [header, *frames]
        frames.clear()
        return out

    def take_shm_bytes(self) -> int:
        """Bytes of arrays this thread's decodes read through shared memory since the last
        call (the transport counts them as received)."""
        return self._local.__dict__.pop("shm_bytes", 0)

    def decode(self, frames: Sequence[Any], allow_shm: bool = False) -> Any:
        """Rebuild the value from ``[header, *buffers]`` without copying the buffers.

        ``allow_shm``: accept shared-memory handles (only for a message that came from a
        process of this host, over ipc); otherwise a handle is a DecodeError."""
        if not frames:
            raise DecodeError("empty message")
        header = frames[0]
        if hasattr(header, "buffer"):
            header = header.buffer
        rest = frames[1:]
        try:
            header_bytes = memoryview(header).nbytes
        except TypeError:
            raise DecodeError(f"a message header must be a buffer, got "
                              f"{type(header).__name__}") from None
        if self.max_header_bytes is not None and header_bytes > self.max_header_bytes:
            raise DecodeError(f"message header of {header_bytes} bytes exceeds the "
                              f"{self.max_header_bytes}-byte cap (large arrays travel as "
                              "their own frames; raise Codec max_header_bytes for "
                              "trusted input)")

        mapped: dict[str, Any] = {}  # name -> Mapped; "" -> bytes read through segments

        def ext_hook(code: int, data: bytes) -> Any:
            if code == EXT_ARRAY:
                return _array_from_ext(data, rest)
            if code in (EXT_SHM_ARRAY, EXT_SHM_TENSOR):
                if not allow_shm:
                    raise DecodeError("shared-memory handles are accepted only from "
                                      "processes of this host")
                if code == EXT_SHM_ARRAY:
                    return _array_from_shm(data, mapped)
            if code in (EXT_TENSOR, EXT_SHM_TENSOR):
                arr = (_array_from_ext(data, rest) if code == EXT_TENSOR
                       else _array_from_shm(data, mapped))
                torch = sys.modules.get("torch")
                if torch is None:
                    # A process that never imported torch (the coordinator) gets the
                    # array: a 40-byte message must not load torch into it.
                    return arr
                if not arr.flags.writeable:
                    arr = arr.copy()
                return torch.from_numpy(arr)
            raise DecodeError(f"unknown msgpack extension type {code}")

        def object_pairs_hook(pairs: list[tuple[Any, Any]]) -> Any:
            try:
                obj = dict(pairs)
            except TypeError:  # list keys (tuples on the sender) come back as tuples
                obj = _composite_key_map(pairs)
            tag = obj.get(TYPE_MARKER)
            if tag is None:
                return obj
            entry = _lookup_tag(tag)
            if entry is None:
                raise DecodeError(
                    f"unknown wire type {tag!r}: import the module that registers it "
                    "in the receiving process"
                )
            return entry.from_wire(obj["v"])

        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            value = msgpack.unpackb(header, ext_hook=ext_hook,
                                    object_pairs_hook=object_pairs_hook,
                                    raw=False, strict_map_key=False, use_list=True)
            if mapped:
                self._local.shm_bytes = mapped[""]
            return value
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError(f"cannot decode message header: {exc}") from exc
        finally:
            if collecting:
                gc.enable()


def _composite_key_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A map whose keys include lists, as a dict with tuple keys; refused when the keys'
    hashes collide (tuple hashes are not randomized, so a peer can craft keys that make a
    dict quadratic). Counting distinct hashes is linear: ints of the 64-bit range hash
    into their own buckets but for a handful."""
    keys = [_hashable(k) for k, _ in pairs]
    try:
        distinct = len({hash(k) for k in keys})
    except TypeError as exc:
        raise DecodeError(f"cannot decode a map key: {exc}") from None
    if len(keys) - distinct > MAX_KEY_HASH_COLLISIONS:
        raise DecodeError(f"map of {len(keys)} composite keys with only {distinct} distinct "
                          "hashes refused (hash-collision flooding)")
    return dict(zip(keys, (v for _, v in pairs), strict=True))


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


_default_codec = Codec()


def encode(obj: Any, placer: Placer | None = None) -> list[Any]:
    """Encode with the process-wide default :class:`Codec`."""
    return _default_codec.encode(obj, placer)


def decode(frames: Sequence[Any], allow_shm: bool = False) -> Any:
    """Decode with the process-wide default :class:`Codec`."""
    return _default_codec.decode(frames, allow_shm)
