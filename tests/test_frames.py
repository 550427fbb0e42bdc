"""Frame packing: batches of frame stacks carry each distinct frame once and come back
bit for bit, whatever the episode boundaries, resets, n-step or channel order."""

from __future__ import annotations

import numpy as np
import pytest

from actorrl.data.batch import MultiAgentBatch, SampleBatch
from actorrl.data.frames import pack_frames, packable_columns, stack_axis
from tests.helpers.frame_data import stacked_fragment
from transport.codec import decode, encode


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("channels_first", [False, True])
def test_pack_round_trips_exactly_and_keeps_each_frame_once(seed, channels_first):
    """Random fragment lengths, episode ends and n-step: the rebuilt columns equal the
    originals, and the pack holds no more than T + (stack - 1) + 1 frames per episode
    piece (plus n-step's few), against 2 * stack * T in the columns."""
    rng = np.random.default_rng(seed)
    steps = int(rng.integers(1, 60))
    ends = tuple(sorted(set(rng.integers(0, steps, int(rng.integers(0, 4))).tolist())))
    n_step = int(rng.integers(1, 4))
    batch = stacked_fragment(rng, steps, n_step=n_step, episode_ends=ends,
                             channels_first=channels_first)
    names, axis = packable_columns(batch)
    assert names == ["obs", "new_obs"] and axis == (0 if channels_first else 2)
    pack = pack_frames({n: batch[n] for n in names}, axis)
    for name in names:
        rebuilt = pack.column(name)
        assert rebuilt.shape == batch[name].shape
        assert np.array_equal(rebuilt, batch[name])
    pieces = len(set(batch["eps_id"].tolist()))
    assert len(pack.frames) <= steps + pieces * 4
    assert pack.nbytes < batch["obs"].nbytes + batch["new_obs"].nbytes


def test_equal_fingerprints_never_merge_different_frames():
    """Frames that collide in the linear fingerprint (a top bit flipped in two words)
    are still kept apart by the exact check."""
    base = np.zeros((3, 16, 16, 1), np.uint8)
    flipped = base.copy()
    words = flipped.reshape(3, -1).view(np.uint64)
    words[0, 0] ^= np.uint64(1 << 63)
    words[0, 1] ^= np.uint64(1 << 63)
    column = np.concatenate([base[:1], flipped[:1], base[1:]])
    column = np.repeat(column, 2, axis=3)  # stack of 2 along the last axis
    pack = pack_frames({"obs": column}, 2)
    assert np.array_equal(pack.column("obs"), column)
    # They did collide: a colliding frame is kept per occurrence (2 copies), not merged.
    assert len(pack.frames) == 3


def test_non_image_columns_are_not_packed():
    """Float observations, rank-2 rows and ambiguous shapes travel as they are."""
    assert stack_axis((4,), np.dtype(np.float32)) is None
    assert stack_axis((84, 84, 4), np.dtype(np.float32)) is None
    assert stack_axis((8, 8, 8), np.dtype(np.uint8)) is None
    assert packable_columns({"obs": np.zeros((5, 4), np.float32)}) is None
    batch = SampleBatch(obs=np.zeros((5, 4), np.float32), actions=np.zeros(5, np.int64))
    out = decode(encode(batch))
    assert out.frame_pack is None and np.array_equal(out["obs"], batch["obs"])


@pytest.mark.parametrize("channels_first", [False, True])
def test_wire_carries_each_frame_once(channels_first):
    """A 50-step fragment of 84x84x4 frames crosses in about 51-54 frames' bytes instead
    of 400, arrives equal, and keeps its pack so it is not packed again."""
    rng = np.random.default_rng(0)
    batch = stacked_fragment(rng, 50, frame_shape=(84, 84), channels_first=channels_first)
    frames = encode(batch)
    wire = sum(memoryview(f).nbytes for f in frames)
    naive = batch["obs"].nbytes + batch["new_obs"].nbytes
    assert wire <= 1.25 * 51 * 84 * 84 < naive / 6
    out = decode(frames)
    for name in batch:
        assert np.array_equal(out[name], batch[name]), name
    assert out.frame_pack is not None and len(out.frame_pack.frames) == 51
    again = encode(out)
    assert sum(memoryview(f).nbytes for f in again) == wire
    out["obs"] = out["obs"].copy()  # replaced: the stale pack is not used
    assert out.frame_pack is None
    multi = decode(encode(MultiAgentBatch({"p": batch}, 50)))
    assert np.array_equal(multi.policy_batches["p"]["new_obs"], batch["new_obs"])


def test_a_packed_batch_keeps_frames_once_and_arrives_whole():
    """``packed_form`` drops the rebuilt columns (the pack holds them); such a batch
    crosses the wire like the original and arrives with every column; ``unpacked``
    rebuilds it in place of a wire."""
    rng = np.random.default_rng(4)
    decoded = decode(encode(stacked_fragment(rng, 30, frame_shape=(84, 84))))
    packed = decoded.packed_form()
    assert packed.is_packed and "obs" not in packed and packed.count == 30
    assert packed.size_bytes() < decoded.size_bytes() / 100
    for out in (decode(encode(packed)), packed.unpacked()):
        assert set(out) == set(decoded)
        for name in decoded:
            assert np.array_equal(out[name], decoded[name]), name
