"""The wire codec: exact round trips, zero-copy frames, clear refusals, and decode never
raising anything but DecodeError on malformed input."""

from __future__ import annotations

import struct
import threading

import msgpack
import numpy as np
import pytest
import torch
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import transport.codec as codec_module
from actorrl.data.batch import MultiAgentBatch, SampleBatch
from tests.helpers.wire import colliding_key_map
from transport.codec import (
    DEFAULT_INLINE_THRESHOLD,
    EXT_ARRAY,
    Codec,
    DecodeError,
    EncodeError,
    decode,
    encode,
)

INLINE = Codec()  # arrays below 64 KB travel inside the header
OUT_OF_BAND = Codec(inline_threshold=0)  # every array travels as its own frame

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
    "datetime64[ns]", "datetime64[D]", "timedelta64[us]", "timedelta64[s]",
    "S7", "U5", ">f8", ">i4", "<u2",
]


def _sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Deterministic non-trivial contents of ``dtype`` (every byte pattern matters)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dt.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(info.min, info.max, n, dtype=np.int64 if dt.kind == "i" else
                            np.uint64, endpoint=True).astype(dt)
    elif dt.kind == "f":
        flat = (rng.standard_normal(n) * 1e3).astype(dt)
        if n > 2:
            flat[:3] = [np.nan, np.inf, -0.0]
    elif dt.kind == "c":
        flat = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    elif dt.kind in "mM":
        flat = rng.integers(-(2**40), 2**40, n).astype(dt)
        if n > 1:
            flat[0] = np.array("NaT", dtype=dt)
    elif dt.kind == "S":
        flat = np.array([bytes(rng.integers(1, 255, rng.integers(0, dt.itemsize + 1),
                                            dtype=np.uint8)) for _ in range(n)], dtype=dt)
    elif dt.kind == "U":
        alphabet = "abcÅλ中😀 "
        flat = np.array(["".join(rng.choice(list(alphabet), dt.itemsize // 4))
                         for _ in range(n)], dtype=dt)
    else:  # pragma: no cover - the list above is exhaustive
        raise AssertionError(dtype)
    return flat.reshape(shape)


def _assert_same_array(decoded: object, original: np.ndarray) -> None:
    """Same type, dtype (byte order included), shape and bytes (NaN payloads included)."""
    assert isinstance(decoded, np.ndarray), type(decoded)
    assert decoded.dtype == original.dtype and decoded.dtype.str == original.dtype.str
    assert decoded.shape == original.shape
    assert decoded.tobytes() == original.tobytes()


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("codec", [INLINE, OUT_OF_BAND], ids=["inline", "out-of-band"])
def test_every_dtype_round_trips_exactly(dtype: str, codec: Codec) -> None:
    """Every plain dtype (byte order included) comes back with identical dtype, shape and
    bytes, whether packed in the header or sent as its own frame."""
    arr = _sample(dtype, (3, 5), seed=len(dtype))
    frames = codec.encode(arr)
    assert len(frames) == (1 if codec is INLINE else 2)
    _assert_same_array(codec.decode(frames), arr)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (0, 0), (1,), (7,), (3, 4), (2, 3, 4),
                                   (2, 3, 4, 5), (1, 1, 1, 1)])
@pytest.mark.parametrize("codec", [INLINE, OUT_OF_BAND], ids=["inline", "out-of-band"])
@pytest.mark.parametrize("dtype", ["float64", "U3", "bool"])
def test_shapes_round_trip(shape: tuple[int, ...], codec: Codec, dtype: str) -> None:
    """0-d, empty and 1-d..4-d arrays keep their exact shape and contents."""
    arr = _sample(dtype, shape, seed=sum(shape))
    _assert_same_array(codec.decode(codec.encode(arr)), arr)


def _views() -> dict[str, np.ndarray]:
    base = _sample("float32", (6, 8, 10), seed=3)
    return {
        "strided_1d": base.reshape(-1)[::3],
        "reversed": base.reshape(-1)[::-1],
        "strided_inner": base[:, :, ::2],
        "strided_outer": base[::2],
        "transpose_2d": base[0].T,
        "transpose_3d": base.transpose(2, 0, 1),
        "swapaxes": base.swapaxes(0, 1),
        "fortran": np.asfortranarray(base),
        "fortran_slice": np.asfortranarray(base)[:, :, 1:4],
        "broadcast": np.broadcast_to(base[0, 0], (5, 10)),
        "column": base[:, 3, 4],
        "size_one_dims": base[:1, 2:3, :],
    }


@pytest.mark.parametrize("name", list(_views()))
@pytest.mark.parametrize("codec", [INLINE, OUT_OF_BAND], ids=["inline", "out-of-band"])
def test_non_contiguous_views_round_trip(name: str, codec: Codec) -> None:
    """Strided slices, transposes, Fortran-ordered and broadcast views decode to arrays equal
    element by element to the view (not to its base)."""
    view = _views()[name]
    decoded = codec.decode(codec.encode(view))
    _assert_same_array(decoded, view)
    np.testing.assert_array_equal(decoded, view)


def test_fortran_array_travels_without_copy_and_stays_fortran() -> None:
    """A Fortran-ordered array is sent as its own memory (no copy to C order) and decodes
    Fortran-ordered, sharing memory with the frame."""
    arr = np.asfortranarray(_sample("float64", (300, 200), seed=1))
    frames = OUT_OF_BAND.encode(arr)
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), arr)
    decoded = OUT_OF_BAND.decode(frames)
    assert decoded.flags.f_contiguous and not decoded.flags.c_contiguous
    assert np.shares_memory(decoded, arr)
    np.testing.assert_array_equal(decoded, arr)


@pytest.mark.parametrize(("dtype", "count", "frames_expected"), [
    ("uint8", DEFAULT_INLINE_THRESHOLD - 1, 1),
    ("uint8", DEFAULT_INLINE_THRESHOLD, 2),
    ("float64", DEFAULT_INLINE_THRESHOLD // 8 - 1, 1),
    ("float64", DEFAULT_INLINE_THRESHOLD // 8, 2),
    ("complex128", DEFAULT_INLINE_THRESHOLD // 16 + 1, 2),
])
def test_inline_threshold_is_exactly_64_kib(dtype: str, count: int,
                                            frames_expected: int) -> None:
    """Arrays strictly below 64 KiB ride in the header; from 64 KiB on they get a frame."""
    arr = _sample(dtype, (count,), seed=count)
    frames = encode(arr)
    assert len(frames) == frames_expected
    if frames_expected == 2:
        assert memoryview(frames[1]).nbytes == arr.nbytes
    else:
        assert len(frames[0]) > arr.nbytes  # the data is in the header
    _assert_same_array(decode(frames), arr)


def test_frames_reference_arrays_in_order_of_appearance() -> None:
    """Each large array gets its own frame, numbered in encoding order, and a message
    mixing inline and out-of-band arrays decodes every one to the right value."""
    big = [_sample("int32", (20_000 + i,), seed=i) for i in range(3)]
    small = [_sample("int16", (10 + i,), seed=10 + i) for i in range(3)]
    msg = {"x": [big[0], small[0]], "y": {"z": big[1], "w": small[1]}, "v": (small[2], big[2])}
    frames = encode(msg)
    assert len(frames) == 4
    for frame, arr in zip(frames[1:], big):
        assert np.shares_memory(np.frombuffer(frame, np.uint8), arr)
    out = decode(frames)
    _assert_same_array(out["x"][0], big[0])
    _assert_same_array(out["x"][1], small[0])
    _assert_same_array(out["y"]["z"], big[1])
    _assert_same_array(out["y"]["w"], small[1])
    _assert_same_array(out["v"][0], small[2])
    _assert_same_array(out["v"][1], big[2])


def test_nested_natives_round_trip() -> None:
    """msgpack natives nest freely; tuples come back as lists, int dict keys stay ints,
    numpy scalars come back as Python numbers."""
    value = {
        "none": None, "t": True, "f": False, "int": -(2**63), "uint": 2**64 - 1,
        "float": 1.5e300, "str": "héllo 😀", "bytes": b"\x00\xff" * 10, "empty": {},
        "list": [1, [2, [3, [4, [5, {"deep": "yes"}]]]]], "tuple": (1, "a", (2.5,)),
        7: "int key", b"raw": "bytes key",
        "np_scalars": [np.int8(-3), np.uint64(2**64 - 1), np.float32(0.25), np.bool_(True)],
    }
    out = decode(encode(value))
    expected = dict(value)
    expected["tuple"] = [1, "a", [2.5]]
    expected["np_scalars"] = [-3, 2**64 - 1, 0.25, True]
    assert out == expected
    assert type(out["np_scalars"][3]) is bool and type(out["np_scalars"][0]) is int


@pytest.mark.parametrize("codec", [INLINE, OUT_OF_BAND], ids=["inline", "out-of-band"])
def test_cpu_torch_tensors_round_trip(codec: Codec) -> None:
    """CPU tensors of common dtypes (0-d, empty, non-contiguous, requiring grad) come back as
    tensors with the same dtype, shape and values."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = [
        base, base.T, base[:, ::2], torch.tensor(3.5, dtype=torch.float64),
        torch.zeros(0, 3, dtype=torch.int64), torch.tensor([True, False]),
        torch.arange(10, dtype=torch.int16), base.to(torch.float16),
        torch.ones(3, requires_grad=True), torch.tensor([1 + 2j], dtype=torch.complex64),
    ]
    out = codec.decode(codec.encode({"t": tensors}))["t"]
    for got, want in zip(out, tensors):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want.detach())


def test_torch_tensor_frame_is_zero_copy() -> None:
    """A large CPU tensor is sent from its own memory, and the decoded tensor is built over
    the received buffer without a copy."""
    t = torch.arange(100_000, dtype=torch.float32)
    frames = encode(t)
    assert len(frames) == 2
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), t.numpy())
    out = decode(frames)
    assert out.data_ptr() == t.data_ptr()


def test_unsupported_torch_dtype_is_refused_at_sender() -> None:
    """A tensor numpy cannot represent (bfloat16) fails at encode with EncodeError."""
    with pytest.raises(EncodeError, match="(?i)bfloat16"):
        encode(torch.zeros(3, dtype=torch.bfloat16))


def test_sample_batch_round_trips_as_sample_batch() -> None:
    """A SampleBatch comes back as a SampleBatch with the same columns and count; its large
    columns travel as frames."""
    batch = SampleBatch(obs=_sample("float32", (5000, 4), seed=1),
                        actions=_sample("int64", (5000,), seed=2),
                        rewards=_sample("float32", (5000,), seed=3),
                        terminateds=_sample("bool", (5000,), seed=4))
    frames = encode(batch)
    assert len(frames) == 2  # obs (80 kB) gets a frame; the small columns ride inline
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), batch["obs"])
    out = decode(frames)
    assert type(out) is SampleBatch and out.count == 5000
    assert set(out) == set(batch)
    for key in batch:
        _assert_same_array(out[key], batch[key])


def test_multi_agent_batch_round_trips() -> None:
    """A MultiAgentBatch keeps its policy ids, env-step count and per-policy SampleBatches."""
    ma = MultiAgentBatch({
        "p0": SampleBatch(obs=_sample("float64", (50_000,), seed=5), t=np.arange(50_000)),
        "p1": SampleBatch(obs=_sample("float32", (3, 2), seed=6), t=np.arange(3)),
    }, env_steps=50_001)
    out = decode(encode({"batch": ma, "other": [ma.policy_batches["p1"]]}))
    got = out["batch"]
    assert type(got) is MultiAgentBatch and got.count == 50_001
    assert set(got.policy_batches) == {"p0", "p1"}
    for pid, pb in ma.policy_batches.items():
        assert type(got.policy_batches[pid]) is SampleBatch
        assert got.policy_batches[pid].count == pb.count
        for key in pb:
            _assert_same_array(got.policy_batches[pid][key], pb[key])
    assert type(out["other"][0]) is SampleBatch


def test_codec_is_usable_from_many_threads_at_once() -> None:
    """One Codec shared by threads encodes each thread's messages independently (frames
    of one thread never leak into another's message)."""
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(seed: int) -> None:
        try:
            start.wait(timeout=10)
            for i in range(200):
                arr = np.full(20_000 + seed, seed * 1000 + i, dtype=np.int64)
                frames = INLINE.encode({"seed": seed, "a": arr, "b": [arr[:5]]})
                assert len(frames) == 2
                out = INLINE.decode(frames)
                assert out["seed"] == seed
                _assert_same_array(out["a"], arr)
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "encoder thread hung"
    assert not errors, errors[0]


# ---------------------------------------------------------------------------- property tests


def _maybe_view(draw, arr: np.ndarray) -> np.ndarray:
    """Optionally turn ``arr`` into a non-contiguous or Fortran view of itself."""
    kind = draw(st.sampled_from(["as_is", "transpose", "step", "reverse", "fortran"]))
    if arr.ndim == 0 or kind == "as_is":
        return arr
    if kind == "transpose":
        return arr.T
    if kind == "fortran":
        return np.asfortranarray(arr)
    axis = draw(st.integers(0, arr.ndim - 1))
    index = [slice(None)] * arr.ndim
    index[axis] = slice(None, None, 2) if kind == "step" else slice(None, None, -1)
    return arr[tuple(index)]


_dtypes = (hnp.boolean_dtypes() | hnp.integer_dtypes(endianness="=")
           | hnp.unsigned_integer_dtypes(endianness="=") | hnp.floating_dtypes(endianness="=")
           | hnp.complex_number_dtypes(endianness="=") | hnp.datetime64_dtypes(endianness="=")
           | hnp.timedelta64_dtypes(endianness="=") | hnp.byte_string_dtypes(max_len=6)
           | hnp.unicode_string_dtypes(max_len=6))


@st.composite
def _arrays(draw) -> np.ndarray:
    arr = draw(hnp.arrays(_dtypes, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0,
                                                    max_side=6)))
    return _maybe_view(draw, arr)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arr=_arrays(), threshold=st.sampled_from([0, 1, 64, DEFAULT_INLINE_THRESHOLD]))
def test_property_any_plain_array_round_trips(arr: np.ndarray, threshold: int) -> None:
    """For any plain-dtype array or view of it and any inline threshold, decode(encode(a))
    has a's dtype, shape and exact bytes, and is writable."""
    codec = Codec(inline_threshold=threshold)
    frames = codec.encode({"a": arr})
    assert len(frames) == (1 if arr.nbytes < threshold else 2)
    out = codec.decode([bytearray(f) for f in frames])["a"]  # as if received: own buffers
    _assert_same_array(out, arr)
    assert out.flags.writeable


_leaves = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20)
           | hnp.arrays(st.sampled_from(["f4", "i8", "u1", "?", "c16"]),
                        hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)))
_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=5),
    max_leaves=30)


def _assert_same_value(got: object, want: object) -> None:
    if isinstance(want, np.ndarray):
        _assert_same_array(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want)
        for key in want:
            _assert_same_value(got[key], want[key])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same_value(g, w)
    else:
        assert type(got) is type(want) and got == want


@settings(max_examples=100, deadline=None)
@given(value=_values, threshold=st.sampled_from([0, 16, DEFAULT_INLINE_THRESHOLD]))
def test_property_nested_values_round_trip(value: object, threshold: int) -> None:
    """Any nesting of msgpack natives and arrays decodes to an equal value of the same
    types (lists stay lists, bytes stay bytes, arrays keep dtype/shape/bytes)."""
    codec = Codec(inline_threshold=threshold)
    _assert_same_value(codec.decode(codec.encode(value)), value)


# ---------------------------------------------------------------------------- zero copy


def test_encoded_frame_is_a_view_of_the_array() -> None:
    """The out-of-band frame is a memoryview on the array's own memory: writing to the array
    after encoding is visible in the frame (nothing was copied)."""
    arr = np.zeros(100_000, dtype=np.float64)
    frames = encode(arr)
    assert isinstance(frames[1], memoryview)
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), arr)
    arr[12345] = 42.0
    assert np.frombuffer(frames[1], np.float64)[12345] == 42.0


@pytest.fixture
def zmq_pair(tmp_path):
    """A connected PAIR socket pair over ipc (linger 0, closed after the test)."""
    ctx = zmq.Context()
    a = ctx.socket(zmq.PAIR)
    b = ctx.socket(zmq.PAIR)
    for s in (a, b):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 10_000)
        s.setsockopt(zmq.SNDTIMEO, 10_000)
    a.bind(f"ipc://{tmp_path}/pair.sock")
    b.connect(f"ipc://{tmp_path}/pair.sock")
    yield a, b
    a.close(linger=0)
    b.close(linger=0)
    ctx.term()


def test_decoded_array_lives_in_the_received_frame(zmq_pair) -> None:
    """After a real ZeroMQ transfer (copy=False), the decoded array's memory is the received
    frame's buffer (no copy on receive), and it is writable."""
    sender, receiver = zmq_pair
    arr = _sample("float64", (500, 40), seed=9)
    small = np.arange(10, dtype=np.int32)
    sender.send_multipart(encode({"big": arr, "small": small}), copy=False)
    frames = receiver.recv_multipart(copy=False)
    assert len(frames) == 2
    out = decode(frames)
    frame_bytes = np.frombuffer(frames[1].buffer, np.uint8)
    assert np.shares_memory(out["big"], frame_bytes)
    assert out["big"].ctypes.data == frame_bytes.ctypes.data
    _assert_same_array(out["big"], arr)
    assert out["big"].flags.writeable and out["small"].flags.writeable
    out["big"][0, 0] = -1.0  # really writable
    out["small"][0] = 99
    assert frame_bytes[:8].view(np.float64)[0] == -1.0
    _assert_same_array(out["small"], np.array([99, *range(1, 10)], dtype=np.int32))


def test_decoded_tensor_lives_in_the_received_frame(zmq_pair) -> None:
    """A received tensor is built over the frame's buffer and is writable."""
    sender, receiver = zmq_pair
    t = torch.randn(200, 100)
    sender.send_multipart(encode(t), copy=False)
    frames = receiver.recv_multipart(copy=False)
    out = decode(frames)
    assert out.data_ptr() == np.frombuffer(frames[1].buffer, np.uint8).ctypes.data
    assert torch.equal(out, t)
    out[0, 0] = 7.0


# ---------------------------------------------------------------------------- refusals


def test_object_dtype_is_refused_naming_the_problem() -> None:
    """Object arrays never cross the wire: EncodeError says which dtype and why."""
    with pytest.raises(EncodeError, match=r"dtype\('O'\).*object"):
        encode({"ok": 1, "bad": [np.array([1, "a", None], dtype=object)]})


def test_structured_dtype_is_refused() -> None:
    """Structured dtypes are refused at the sender with EncodeError."""
    with pytest.raises(EncodeError, match="structured"):
        encode(np.zeros(3, dtype=[("a", "f4"), ("b", "i8")]))


class _Unregistered:
    pass


@pytest.mark.parametrize("value", [
    _Unregistered(), [1, {"x": _Unregistered()}], {_Unregistered: 1}, object(),
    iter({1, 2}), complex(1, 2),
], ids=["instance", "nested", "class-as-key", "object", "iterator", "complex"])
def test_unknown_types_are_refused_naming_the_type(value: object) -> None:
    """Anything not native, array or registered fails at encode with an EncodeError that
    names the offending type."""
    with pytest.raises(EncodeError) as info:
        encode(value)
    message = str(info.value)
    assert "cannot encode" in message
    if isinstance(value, list):
        assert "_Unregistered" in message and __name__ in message


def test_failed_encode_leaves_the_codec_clean() -> None:
    """After an encode fails halfway (a large array already framed), the next message has no
    stale frames and decodes correctly."""
    codec = Codec()
    big = np.ones(100_000, dtype=np.uint8)
    with pytest.raises(EncodeError, match="cannot encode object of type test_codec._Unregistered"):
        codec.encode([big, _Unregistered()])
    frames = codec.encode({"x": 1})
    assert len(frames) == 1 and codec.decode(frames) == {"x": 1}


def test_arrays_above_2_gib_are_refused_without_allocating(monkeypatch) -> None:
    """A 2 GiB zero-strided view (no memory behind it) is refused by the size check before
    the codec copies anything: the test makes any copy attempt fail loudly."""
    big_view = np.broadcast_to(np.zeros(1, dtype=np.float64), (2**28,))  # 2 GiB, 8 bytes real
    assert big_view.nbytes == 2**31 > codec_module.MAX_ARRAY_BYTES

    def no_copy(*_a, **_k):
        raise AssertionError("the codec copied a >2 GiB array before checking its size")

    monkeypatch.setattr(np, "ascontiguousarray", no_copy)
    with pytest.raises(EncodeError, match="2 GiB"):
        encode({"obs": big_view})
    with pytest.raises(EncodeError, match="2 GiB"):
        Codec(inline_threshold=0).encode([np.broadcast_to(np.zeros((1, 1)), (2**14, 2**14))])


def test_contiguous_array_above_2_gib_is_refused() -> None:
    """A C-contiguous array of 2**31 bytes (np.zeros: calloc'd, untouched pages cost no
    memory) is refused too."""
    arr = np.zeros(2**31, dtype=np.uint8)
    with pytest.raises(EncodeError, match="2 GiB"):
        encode(arr)


def test_size_limit_boundary_and_allow_large(monkeypatch) -> None:
    """The limit is inclusive (exactly MAX bytes passes, MAX + 1 fails), and
    ``allow_large=True`` lifts it. (MAX is lowered so the boundary is cheap to test.)"""
    monkeypatch.setattr(codec_module, "MAX_ARRAY_BYTES", 1000)
    ok = np.arange(1000, dtype=np.uint8)
    too_big = np.arange(1001, dtype=np.uint8)
    _assert_same_array(decode(encode(ok)), ok)
    with pytest.raises(EncodeError, match="exceeds"):
        encode(too_big)
    with pytest.raises(EncodeError, match="exceeds"):
        encode(torch.zeros(1001, dtype=torch.uint8))
    _assert_same_array(Codec(allow_large=True).decode(Codec(allow_large=True).encode(too_big)),
                       too_big)


# ---------------------------------------------------------------------------- malformed input


def _ext_header(dtype: bytes, shape: tuple[int, ...], index: int, flags: int = 0) -> bytes:
    return codec_module._HEAD.pack(len(dtype), len(shape), flags, index) + dtype + struct.pack(
        f"<{len(shape)}q", *shape)


def _message(ext_payload: bytes, code: int = EXT_ARRAY) -> bytes:
    return msgpack.packb({"a": msgpack.ExtType(code, ext_payload)}, use_bin_type=True)


def _decode_or_decode_error(frames: list) -> None:
    """Decoding either succeeds or raises DecodeError; any other exception fails the test."""
    try:
        decode(frames)
    except DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(header=st.binary(max_size=200),
       extra=st.lists(st.binary(max_size=64), max_size=3))
def test_random_bytes_never_raise_anything_but_decode_error(header: bytes,
                                                             extra: list[bytes]) -> None:
    """Random header bytes (and random extra frames) decode or raise DecodeError."""
    _decode_or_decode_error([header, *extra])


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_mutated_valid_messages_never_raise_anything_but_decode_error(data) -> None:
    """Valid messages with bytes flipped, cut or inserted decode or raise DecodeError."""
    value = {"obs": np.arange(30, dtype=np.float32).reshape(5, 6), "n": 3,
             "b": SampleBatch(x=np.arange(4)), "big": np.arange(20_000, dtype=np.int16)}
    frames = encode(value)
    header = bytearray(frames[0])
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(len(header) - 1, 0)))
        if op == "flip" and header:
            header[pos] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del header[pos:pos + data.draw(st.integers(1, 8))]
        else:
            header[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    _decode_or_decode_error([bytes(header), *frames[1:]])


@pytest.mark.parametrize("codec", [INLINE, OUT_OF_BAND], ids=["inline", "out-of-band"])
def test_every_truncation_of_an_array_ext_raises_decode_error(codec: Codec) -> None:
    """Cutting an array extension's payload at any length is a DecodeError (shape or data
    missing), never a wrong array or another exception."""
    frames = codec.encode(np.arange(12, dtype="<f8").reshape(3, 4))
    ext = msgpack.unpackb(frames[0], ext_hook=lambda code, data: data)
    for cut in range(len(ext)):
        with pytest.raises(DecodeError, match="malformed array header"):
            decode([_message(ext[:cut]), *frames[1:]])


def test_every_truncation_of_a_header_frame_raises_decode_error() -> None:
    """Cutting the msgpack header anywhere is a DecodeError."""
    frames = encode({"a": np.arange(5), "b": ["x", {"c": 1.5}], "s": SampleBatch(x=[1, 2])})
    for cut in range(len(frames[0])):
        with pytest.raises(DecodeError, match="cannot decode message header"):
            decode([frames[0][:cut]])


@pytest.mark.parametrize(("payload", "frames", "match"), [
    (_ext_header(b"<f8", (4,), 1), [b"x" * 32], "malformed array header"),  # index 1 of 1
    (_ext_header(b"<f8", (4,), 7), [], "malformed array header"),
    (_ext_header(b"<f8", (4,), 0), [b"x" * 31], "malformed array header"),  # frame short
    (_ext_header(b"|O", (1,), -1) + b"\0" * 8, [], "object"),
    (_ext_header(b"not-a-dtype", (1,), -1) + b"\0" * 8, [], "malformed array header"),
    (_ext_header(b"<f8", (2, 3), -1) + b"\0" * 47, [], "malformed array header"),
    (_ext_header(b"<f8", (2**40, 2**40), -1), [], "malformed array header"),
    (b"", [], "malformed array header"),
], ids=["index-out-of-range", "index-far-out", "frame-too-short", "object-dtype",
        "bad-dtype", "inline-data-short", "huge-shape", "empty-ext"])
def test_malformed_array_headers_raise_decode_error(payload: bytes, frames: list,
                                                    match: str) -> None:
    """Array headers pointing past the frames, at too-short data, at object or unknown
    dtypes, or with impossible shapes raise DecodeError with a clear message."""
    with pytest.raises(DecodeError, match=match):
        decode([_message(payload), *frames])


def test_negative_dimension_raises_decode_error() -> None:
    """An array header with a negative dimension is malformed and raises DecodeError."""
    payload = _ext_header(b"<f8", (-1,), -1) + np.arange(4.0).tobytes()
    with pytest.raises(DecodeError, match="negative dimension"):
        decode([_message(payload)])


@pytest.mark.parametrize(("header", "match"), [
    (msgpack.packb(msgpack.ExtType(42, b"")), "unknown msgpack extension type 42"),
    (msgpack.packb({codec_module.TYPE_MARKER: "no.such.Type", "v": 1}), "no.such.Type"),
    (msgpack.packb({codec_module.TYPE_MARKER: "actorrl.SampleBatch"}), "cannot decode"),
    (msgpack.packb({codec_module.TYPE_MARKER: "actorrl.SampleBatch",
                    "v": {"a": [1, 2], "b": [1]}}), "different lengths"),
    (msgpack.packb({codec_module.TYPE_MARKER: "actorrl.MultiAgentBatch", "v": 5}),
     "cannot decode"),
    (b"\x81\x80\x01", "cannot decode"),  # a map whose key is a map: unhashable
    (b"\xc1", "cannot decode"),
    (msgpack.packb([1, 2]) + b"trailing", "cannot decode"),
], ids=["unknown-ext", "unknown-tag", "tag-without-state", "bad-sample-batch",
        "bad-multi-agent-batch", "map-key", "reserved-byte", "trailing-bytes"])
def test_malformed_headers_raise_decode_error(header: bytes, match: str) -> None:
    """Unknown extension codes and wire tags, registered types with bad state, unhashable
    keys and invalid msgpack all raise DecodeError naming the problem."""
    with pytest.raises(DecodeError, match=match):
        decode([header])


@pytest.mark.parametrize("frames", [[], [None], [12345], ["text"]],
                         ids=["no-frames", "none", "int", "str"])
def test_non_buffer_frames_raise_decode_error(frames: list) -> None:
    """An empty message or a header that is not a buffer raises DecodeError."""
    with pytest.raises(DecodeError, match="a message header must be a buffer, got"
                       if frames else "empty message"):
        decode(frames)


def test_what_encodes_also_decodes_tuple_keys() -> None:
    """Whatever the sender accepts the receiver decodes: a dict with tuple keys arrives
    intact, its keys tuples again."""
    value = {(1, 2): "a", (3, "x"): "b"}
    decoded = decode(encode(value))
    assert decoded == value
    assert all(type(key) is tuple for key in decoded)


def test_registered_dataclass_round_trips_with_arrays_inside():
    import dataclasses as dc

    from transport.codec import register_dataclass

    @register_dataclass
    @dc.dataclass(frozen=True)
    class Reply:
        count: int
        data: np.ndarray
        note: str | None = None

    frames = encode({"r": Reply(3, np.arange(100_000, dtype=np.int64))})
    out = decode(frames)["r"]
    assert type(out) is Reply and out.count == 3 and out.note is None
    assert np.array_equal(out.data, np.arange(100_000, dtype=np.int64))
    with pytest.raises(TypeError, match="register_dataclass needs a dataclass"):
        register_dataclass(int)


# ------------------------------------------------------------------ remote errors by type
def _over_the_wire(exc: BaseException):
    """``exc`` as the caller raises it: captured, encoded, decoded, typed."""
    from transport.errors import RemoteError

    record = decode(encode(RemoteError.from_exception(exc)))
    assert type(record) is RemoteError  # the wire (and object stores) hold plain records
    return record.typed()


def _raise_here() -> None:
    raise KeyError("missing")


def test_remote_errors_are_instances_of_their_registered_class():
    """Builtins and the project's registered errors arrive as RemoteError and their class,
    with type name, message and remote traceback; `except` of the class catches them."""
    from actorrl.cluster import JobError
    from actorrl.config.sections import ConfigError
    from actorrl.runtime.errors import (
        ActorCreationError,
        ActorDiedError,
        GetTimeoutError,
        ObjectLostError,
    )
    from transport.errors import RemoteError

    try:
        _raise_here()
    except KeyError as exc:
        err = _over_the_wire(exc)
    assert isinstance(err, KeyError) and isinstance(err, RemoteError)
    assert err.type_name == "KeyError" and err.message == "'missing'"
    assert "in _raise_here" in err.remote_traceback
    assert str(err).startswith("KeyError: 'missing'\n\nRemote traceback:")
    for cls in (ValueError, RuntimeError, TimeoutError, FileNotFoundError, ObjectLostError,
                ActorDiedError, ActorCreationError, GetTimeoutError, ConfigError, JobError):
        err = _over_the_wire(cls("it failed"))
        assert isinstance(err, cls) and isinstance(err, RemoteError), cls
        assert err.message == "it failed" and err.type_name.endswith(cls.__qualname__)
        with pytest.raises(cls, match="it failed"):
            raise err
    assert isinstance(_over_the_wire(ObjectLostError("x")), ActorDiedError)  # its base too
    assert not isinstance(_over_the_wire(ActorDiedError("x")), ObjectLostError)
    assert type(_over_the_wire(ValueError("a"))) is type(_over_the_wire(ValueError("b")))


def test_unknown_remote_error_stays_a_plain_remote_error():
    """A class nobody registered (or a made-up name) gives a plain RemoteError; a typed
    error sent on becomes a plain record again with its first type name, message and
    traceback, so forwarding keeps the type."""
    from transport.errors import RemoteError

    class UnknownError(Exception):
        pass

    err = _over_the_wire(UnknownError("odd"))
    assert type(err) is RemoteError and err.type_name.endswith("UnknownError")
    assert type(RemoteError("os.system", "x").typed()) is RemoteError
    first = _over_the_wire(ValueError("first"))
    again = _over_the_wire(first)
    assert isinstance(again, ValueError) and again.message == "first"
    assert again.remote_traceback == first.remote_traceback


def test_typing_a_remote_error_never_runs_the_class_constructor():
    """A registered class whose constructor needs other arguments (or always fails) still
    types the error without running it; one whose __new__ fails leaves it plain."""
    from transport.error_types import register_error
    from transport.errors import RemoteError

    @register_error
    class Strict(Exception):
        def __init__(self, code: int, detail: str) -> None:
            raise AssertionError("constructor ran")

    @register_error
    class NoNew(Exception):
        def __new__(cls, *args: object) -> NoNew:
            raise AssertionError("__new__ ran")

    name = f"{__name__}.{Strict.__qualname__}"
    err = RemoteError(name, "m", "tb").typed()
    assert isinstance(err, Strict) and isinstance(err, RemoteError)
    assert (err.type_name, err.message, err.remote_traceback) == (name, "m", "tb")
    plain = RemoteError(f"{__name__}.{NoNew.__qualname__}", "m").typed()
    assert type(plain) is RemoteError
    with pytest.raises(TypeError, match="register_error needs an Exception subclass"):
        register_error(int)
    with pytest.raises(TypeError, match="register_error needs an Exception subclass"):
        register_error(KeyboardInterrupt)  # a remote one must not stop the caller


def test_colliding_composite_keys_are_refused_fast() -> None:
    """A hash-flooding map (20,000 colliding tuple keys, ~400 KB) is refused as such
    instead of being built (which stalls the event loop for seconds); a few collisions
    pass. How fast the refusal is: ``benchmarks/hostile_input.py``."""
    header = colliding_key_map(20_000)
    assert len(header) < 1 << 20
    with pytest.raises(DecodeError, match="hash-collision"):
        decode([header])
    few = decode([colliding_key_map(8)])
    assert len(few) == 8 and all(isinstance(k, tuple) for k in few)


def test_header_size_is_capped_and_worst_case_decode_is_bounded() -> None:
    """A header above the cap is refused before unpacking; a header just under it of the
    costliest shape (nested empty lists) decodes (its time:
    ``benchmarks/hostile_input.py``); arrays past the inline budget travel as frames, so
    legitimate headers stay small."""
    codec = Codec()
    with pytest.raises(DecodeError, match="exceeds"):
        codec.decode([msgpack.packb(b"x" * (codec.max_header_bytes + 1))])
    nested = msgpack.packb([[[]]] * ((codec.max_header_bytes - 16) // 3))
    assert len(nested) <= codec.max_header_bytes
    assert len(codec.decode([nested])) > 300_000
    arrays = [np.full(60_000, i, np.uint8) for i in range(10)]
    frames = codec.encode(arrays)
    assert len(frames[0]) <= codec.max_inline_bytes + 4096
    assert len(frames) == 1 + 10 - codec.max_inline_bytes // 60_000
    assert all(np.array_equal(a, b) for a, b in zip(codec.decode(frames), arrays, strict=True))
    trusted = Codec(max_header_bytes=None)
    assert trusted.decode([msgpack.packb(b"x" * (2 << 20))]) == b"x" * (2 << 20)
