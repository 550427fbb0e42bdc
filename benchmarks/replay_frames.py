"""Ape-X replay at Atari scale: frames stored once against the naive layout
(``python benchmarks/replay.py --atari [--quick]``).

Workload: Pong-like transitions (84x84 uint8 frames, stack 4, HWC; n-step 3; 50-step
fragments as an Ape-X worker sends them; episodes of 200-1500 steps), random frame
content (incompressible: the figures do not depend on what Pong looks like).

- ``bytes_per_transition``: bytes the frame-store shard allocates (frame ring + per-row
  columns) per transition of its capacity, full. Naive: one row of ``obs`` + ``new_obs``
  (56,448 B) plus the other columns. Target <= 1.25 x 7,056.
- ``rss_mb_1m``: the process RSS growth while filling ``capacity`` transitions,
  extrapolated linearly to 1M (the shard's memory is linear in capacity: one preallocated
  ring per column). Target < 10,000.
- ``sample_update_per_s``: ``sample(512)`` with the stacks rebuilt as the shard sends them
  (the distinct frames of the 512 rows gathered once, plus indices: the learner rebuilds
  the arrays) + ``update_priorities(512)``; the naive
  layout's rate measured in the same run, interleaved (its buffer is smaller: 56 KB a row
  does not fit 200k rows next to the frame store; sampling cost does not depend on it).
  Targets >= 500/s and >= 0.5 x naive.
- ``replay_wire_bytes_per_transition``: encoded size of a sampled batch per row.
- ``compressed``: the same shard with ``compress_observations`` (frames kept
  LZ4-compressed), filled with real Pong frames (random actions; random bytes would not
  compress): bytes per transition, fill and sample+update rates, against the
  uncompressed store on the same frames.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import numpy as np

from actorrl.data.batch import SampleBatch
from actorrl.data.frames import FramePack, pack_frames
from actorrl.replay import FrameStackStorage, PrioritizedSampler, ReplayBuffer
from transport.codec import encode

FRAME = (84, 84)
STACK = 4
FRAGMENT = 50
N_STEP = 3
SAMPLE = 512
ALPHA, BETA = 0.6, 0.4
FRAME_BYTES = FRAME[0] * FRAME[1]
TARGET_BYTES_PER_TRANSITION = 1.25 * FRAME_BYTES
TARGET_RSS_MB_1M = 10_000
TARGET_SAMPLE_UPDATE_PER_S = 500
TARGET_VS_NAIVE = 0.5


def _template(rng: np.random.Generator, boundary: int | None) -> FramePack:
    """The index structure of one 50-step fragment (an episode ending after step
    ``boundary`` if given), from real stacks."""
    from tests.helpers.frame_data import stacked_fragment

    ends = () if boundary is None else (boundary,)
    batch = stacked_fragment(rng, FRAGMENT, frame_shape=(2, 2), n_step=N_STEP,
                             episode_ends=ends)
    return pack_frames({"obs": batch["obs"], "new_obs": batch["new_obs"]}, 2)


def pong_frames(count: int) -> np.ndarray | None:
    """``count`` preprocessed Pong frames from random play (None without ale-py)."""
    try:
        from actorrl.envs import make_env

        env = make_env("PongNoFrameskip-v4", {"frame_stack": 1})
    except Exception:  # ale-py or opencv missing: the compressed figures are skipped
        return None
    frames = []
    env.reset(seed=0)
    while len(frames) < count:
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        frames.append(np.asarray(obs).reshape(FRAME))
        if terminated or truncated:
            env.reset()
    env.close()
    return np.stack(frames)


class FragmentSource:
    """50-step fragments as a shard receives them: fresh frames (random, or drawn from
    ``frames``) in the index structure of a real fragment, every 200-1500 steps one with
    an episode end."""

    def __init__(self, seed: int = 0, frames: np.ndarray | None = None) -> None:
        self.frames = frames
        self.rng = np.random.default_rng(seed)
        self.plain = _template(self.rng, None)
        self.ending = [_template(self.rng, b) for b in (7, 23, 41)]
        self.until_end = int(self.rng.integers(200, 1500))

    def next(self) -> SampleBatch:
        """The next fragment, as decoded from the wire (columns rebuilt, pack attached)."""
        self.until_end -= FRAGMENT
        template = self.plain
        if self.until_end <= 0:
            template = self.ending[int(self.rng.integers(len(self.ending)))]
            self.until_end = int(self.rng.integers(200, 1500))
        if self.frames is None:
            frames = self.rng.integers(0, 256, (len(template.frames), *FRAME),
                                       dtype=np.uint8)
        else:
            start = int(self.rng.integers(0, len(self.frames) - len(template.frames)))
            frames = self.frames[start:start + len(template.frames)]
        pack = FramePack(frames, template.indices, template.axis)
        columns = {"actions": self.rng.integers(0, 6, FRAGMENT),
                   "rewards": self.rng.normal(size=FRAGMENT).astype(np.float32),
                   "terminateds": np.zeros(FRAGMENT, bool),
                   "weights": np.ones(FRAGMENT, np.float32)}
        return SampleBatch.from_frame_pack(columns, pack)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _fill(buffer: Any, source: FragmentSource, rows: int) -> float:
    """Add fragments until ``rows`` were added; returns seconds taken."""
    started = time.perf_counter()
    added = 0
    while added < rows:
        buffer.add_batch(source.next())
        added += FRAGMENT
    buffer.stats()
    return time.perf_counter() - started


def _rate(round_fn: Any, seconds: float) -> float:
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        round_fn()
        done += 1
    return done / (time.perf_counter() - started)


def run_atari(quick: bool) -> dict[str, Any]:
    """Every measurement of the module docstring, as one JSON-ready dict."""
    capacity = 50_000 if quick else 200_000
    naive_capacity = 5_000 if quick else 20_000
    slices, slice_s = (3, 1.0) if quick else (6, 2.0)
    source = FragmentSource(0)
    rss_before = _rss_mb()
    ours = ReplayBuffer(capacity, sampler=PrioritizedSampler(ALPHA, BETA),
                        storage=FrameStackStorage(unpack=False), seed=0)
    fill_s = _fill(ours, source, capacity + 5 * FRAGMENT)
    rss_growth = _rss_mb() - rss_before
    stats = ours.stats()
    naive = ReplayBuffer(naive_capacity, sampler=PrioritizedSampler(ALPHA, BETA), seed=0)
    _fill(naive, source, naive_capacity)
    naive_bytes = naive.stats()["allocated_bytes"] / naive_capacity
    priorities = np.random.default_rng(1).random(SAMPLE) + 1e-3

    def ours_round() -> None:
        batch = ours.sample(SAMPLE)
        ours.update_priorities(batch["batch_indexes"], priorities)

    def naive_round() -> None:
        batch = naive.sample(SAMPLE)
        naive.update_priorities(batch["batch_indexes"], priorities)

    ours_rates, naive_rates = [], []
    for _ in range(slices):
        ours_rates.append(_rate(ours_round, slice_s))
        naive_rates.append(_rate(naive_round, slice_s))
    ratios = [a / b for a, b in zip(ours_rates, naive_rates, strict=True)]
    sample = ours.sample(SAMPLE)
    wire = sum(memoryview(f).nbytes for f in encode(sample))
    naive_wire = sum(memoryview(f).nbytes for f in encode(naive.sample(SAMPLE)))
    compressed = _compressed_figures(capacity, slices, slice_s, priorities)
    bytes_per_transition = stats["bytes_per_transition"]
    rss_mb_1m = rss_growth * 1_000_000 / capacity
    sample_update = float(np.median(ours_rates))
    vs_naive = float(np.median(ratios))
    return {
        "benchmark": "replay_atari",
        "quick": quick,
        "capacity": capacity,
        "frame": [*FRAME, STACK],
        "fragment": FRAGMENT,
        "n_step": N_STEP,
        "frame_capacity": stats["frame_capacity"],
        "num_retired": stats["num_retired"],
        "bytes_per_transition": round(bytes_per_transition),
        "naive_bytes_per_transition": round(naive_bytes),
        "fill_transitions_per_s": round((capacity + 5 * FRAGMENT) / fill_s),
        "rss_mb_1m": round(rss_mb_1m),
        "rss_method": f"RSS growth filling {capacity:,} transitions, x {1_000_000 // capacity}",
        "sample_update_per_s": round(sample_update, 1),
        "naive_sample_update_per_s": round(float(np.median(naive_rates)), 1),
        "naive_capacity": naive_capacity,
        "sample_update_vs_naive": round(vs_naive, 2),
        "replay_wire_bytes_per_transition": round(wire / SAMPLE),
        "naive_replay_wire_bytes_per_transition": round(naive_wire / SAMPLE),
        "compressed": compressed,
        "targets_met": {
            "bytes_per_transition": bytes_per_transition <= TARGET_BYTES_PER_TRANSITION,
            "rss_mb_1m": rss_mb_1m < TARGET_RSS_MB_1M,
            "sample_update_per_s": sample_update >= TARGET_SAMPLE_UPDATE_PER_S,
            "sample_update_vs_naive": vs_naive >= TARGET_VS_NAIVE,
        },
    }


def _compressed_figures(capacity: int, slices: int, slice_s: float,
                        priorities: np.ndarray) -> dict[str, Any]:
    """LZ4-compressed frame store vs the plain one, both on real Pong frames."""
    frames = pong_frames(4_000)
    if frames is None:
        return {"skipped": "ale-py is not installed (pip install -e '.[atari]')"}
    out: dict[str, Any] = {"frames": "Pong, random play"}
    buffers = {}
    for name, compress in (("plain", False), ("lz4", True)):
        buffer = ReplayBuffer(capacity, sampler=PrioritizedSampler(ALPHA, BETA), seed=0,
                              storage=FrameStackStorage(unpack=False, compress=compress))
        fill_s = _fill(buffer, FragmentSource(1, frames), capacity)
        buffers[name] = buffer
        out[f"{name}_bytes_per_transition"] = round(buffer.stats()["bytes_per_transition"])
        out[f"{name}_fill_transitions_per_s"] = round(capacity / fill_s)
    rates: dict[str, list[float]] = {"plain": [], "lz4": []}
    for _ in range(slices):
        for name, buffer in buffers.items():
            def one_round(b: Any = buffer) -> None:
                batch = b.sample(SAMPLE)
                b.update_priorities(batch["batch_indexes"], priorities)
            rates[name].append(_rate(one_round, slice_s))
    for name, values in rates.items():
        out[f"{name}_sample_update_per_s"] = round(float(np.median(values)), 1)
    return out
