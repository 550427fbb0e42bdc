"""Replay that stores each frame once: every sampled row equals the naive buffer's row at
the same slot bit for bit (random episode lengths, resets, wrap-around, n-step), rows
whose frames were overwritten are never served, priorities stay proportional."""

from __future__ import annotations

import numpy as np
import pytest

from actorrl.data.batch import SampleBatch
from actorrl.replay import FrameStackStorage, PrioritizedSampler, ReplayBuffer
from tests.helpers.frame_data import stacked_fragment
from transport.codec import decode, encode

CHI2_999_DOF7 = 24.322


def _fragments(seed: int, count: int, channels_first: bool = False):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        steps = int(rng.integers(1, 40))
        ends = tuple(rng.integers(0, steps, int(rng.integers(0, 3))).tolist())
        yield stacked_fragment(rng, steps, n_step=int(rng.integers(1, 4)), episode_ends=ends,
                               channels_first=channels_first)


def _assert_rows_equal(got: SampleBatch, expected: SampleBatch) -> None:
    for name in ("obs", "new_obs", "actions", "rewards", "terminateds", "eps_id"):
        assert got[name].shape == expected[name].shape, name
        assert np.array_equal(got[name], expected[name]), name


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("compress", [False, True])
def test_rows_equal_the_naive_layout_through_wrap_around(seed, channels_first, compress):
    """Same adds to both buffers (wrapping several times): every live slot holds the same
    row, rebuilt from single frames (kept LZ4-compressed or not)."""
    naive = ReplayBuffer(300, seed=seed)
    frames = ReplayBuffer(300, storage=FrameStackStorage(compress=compress), seed=seed)
    for fragment in _fragments(seed, 60, channels_first):
        wire = decode(encode(fragment))  # as a shard receives it: the pack attached
        naive.add_batch(fragment)
        frames.add_batch(wire)
        slots = np.random.default_rng(seed).integers(0, len(naive), 64)
        _assert_rows_equal(frames.rows_at(slots), naive.rows_at(slots))
    assert frames.stats()["num_retired"] == 0
    if not compress:  # (tiny random frames do not compress: only the rows are checked)
        assert frames.stats()["bytes_per_transition"] < \
            naive.stats()["allocated_bytes"] / 300 / 3
    assert frames.storage.frame_store.compressed == compress
    batch = frames.sample(128)
    _assert_rows_equal(batch, naive.rows_at(batch["batch_indexes"]))
    assert batch.frame_pack is not None  # goes to the learner with each frame once


def test_overwritten_frames_retire_their_rows_and_are_never_served():
    """A frame ring far too small: old rows lose their frames and are retired; no sample,
    uniform or prioritized, returns one, and what is returned equals the naive rows."""
    rng = np.random.default_rng(3)
    for compress, sampler in ((False, None), (True, None), (False, PrioritizedSampler(0.6))):
        frames_buffer = ReplayBuffer(
            200, sampler=sampler, seed=1,
            storage=FrameStackStorage(frame_capacity=150, compress=compress))
        naive = ReplayBuffer(200, seed=1)
        for _ in range(40):
            fragment = stacked_fragment(rng, int(rng.integers(5, 30)),
                                        episode_ends=(int(rng.integers(0, 5)),))
            naive.add_batch(fragment)
            frames_buffer.add_batch(fragment)
            batch = frames_buffer.sample(64)
            slots = batch["batch_indexes"]
            assert not frames_buffer.is_retired(slots).any()
            _assert_rows_equal(batch, naive.rows_at(slots))
            if sampler is not None:
                # An update for a row retired since does not bring it back.
                frames_buffer.update_priorities(slots, np.full(len(slots), 5.0))
                held = np.arange(len(naive))
                retired = held[frames_buffer.is_retired(held)]
                assert (sampler.priority_mass(retired) == 0).all()
        assert frames_buffer.stats()["num_retired"] > 20  # the ring did run out


def test_priorities_stay_proportional():
    """Counts over 8 rows with priorities 1..8 pass the same chi-square test as the plain
    prioritized buffer (dof 7, p = 0.001)."""
    alpha = 0.7
    buffer = ReplayBuffer(8, sampler=PrioritizedSampler(alpha), storage=FrameStackStorage(),
                          seed=5)
    buffer.add_batch(stacked_fragment(np.random.default_rng(0), 8))
    priorities = np.arange(1, 9, dtype=float)
    buffer.update_priorities(np.arange(8), priorities)
    draws = np.concatenate([buffer.sample(500)["batch_indexes"]
                            for _ in range(100)])
    observed = np.bincount(draws, minlength=8)
    mass = priorities ** alpha
    expected = len(draws) * mass / mass.sum()
    assert float(np.sum((observed - expected) ** 2 / expected)) < CHI2_999_DOF7
    fresh = ReplayBuffer(8, sampler=PrioritizedSampler(alpha), storage=FrameStackStorage(),
                         seed=6)
    plain = ReplayBuffer(8, sampler=PrioritizedSampler(alpha), seed=6)
    for b in (fresh, plain):  # the same draws as the plain buffer, the same rows
        b.add_batch(stacked_fragment(np.random.default_rng(0), 8))
        b.update_priorities(np.arange(8), priorities)
    ours, theirs = fresh.sample(64), plain.sample(64)
    assert np.array_equal(ours["batch_indexes"], theirs["batch_indexes"])
    assert np.allclose(ours["weights"], theirs["weights"])
    _assert_rows_equal(ours, theirs)


def test_non_frame_batches_are_stored_plainly():
    """CartPole-like rows go through unchanged (no frame store)."""
    buffer = ReplayBuffer(16, storage=FrameStackStorage(), seed=0)
    batch = SampleBatch(obs=np.arange(40, dtype=np.float32).reshape(10, 4),
                        actions=np.arange(10))
    buffer.add_batch(batch)
    assert buffer.storage.frame_store is None
    assert np.array_equal(buffer.rows_at(np.arange(10))["obs"], batch["obs"])


def test_compressed_frames_take_a_fraction_of_the_memory():
    """Frames with little detail (like Atari screens) shrink many times under LZ4."""
    rng = np.random.default_rng(0)
    plain = ReplayBuffer(400, storage=FrameStackStorage())
    packed = ReplayBuffer(400, storage=FrameStackStorage(compress=True))
    for _ in range(10):
        fragment = stacked_fragment(rng, 40, frame_shape=(84, 84))
        fragment["obs"] //= 64  # four grey levels: compressible, as screens are
        fragment["new_obs"] //= 64
        for buffer in (plain, packed):
            buffer.add_batch(fragment)
    assert packed.storage.frame_store.nbytes < plain.storage.frame_store.nbytes / 2
    slots = np.arange(400)
    assert np.array_equal(packed.rows_at(slots)["obs"], plain.rows_at(slots)["obs"])
