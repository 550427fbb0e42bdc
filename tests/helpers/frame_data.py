"""Synthetic frame-stacked fragments (like gymnasium's FrameStack after a DeepMind
preprocessor), for the frame-packing and frame-replay tests and benchmarks."""

from __future__ import annotations

import numpy as np

from actorrl.data.batch import SampleBatch


def stacked_fragment(rng: np.random.Generator, steps: int, *, stack: int = 4,
                     frame_shape: tuple[int, int] = (12, 10), n_step: int = 1,
                     episode_ends: tuple[int, ...] = (), channels_first: bool = False
                     ) -> SampleBatch:
    """``steps`` transitions of a frame-stacked env: a reset repeats its first frame
    ``stack`` times; ``obs[t]`` is the stack at t and ``new_obs[t]`` the stack ``n_step``
    later, or the episode's last stack when it ends sooner. Episodes end after the step
    indices in ``episode_ends`` (and a fresh one starts)."""
    obs, new_obs, eps, terminated = [], [], [], []
    bounds = [0, *sorted(e + 1 for e in episode_ends if e + 1 < steps), steps]
    for episode, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        length = stop - start
        frames = rng.integers(0, 256, (length + stack, *frame_shape), dtype=np.uint8)
        # Stack at step i (i = 0 .. length): frames[i .. i + stack), the first repeated.
        first = frames[stack - 1]
        frames[: stack - 1] = first
        stacks = np.stack([frames[i: i + stack] for i in range(length + 1)])  # [L+1, k, H, W]
        for i in range(length):
            obs.append(stacks[i])
            new_obs.append(stacks[min(i + n_step, length)])
            eps.append(episode)
            terminated.append(i + n_step >= length and stop != steps)
    obs_arr, new_arr = np.stack(obs), np.stack(new_obs)
    if not channels_first:
        obs_arr = np.ascontiguousarray(np.moveaxis(obs_arr, 1, -1))
        new_arr = np.ascontiguousarray(np.moveaxis(new_arr, 1, -1))
    return SampleBatch(obs=obs_arr, new_obs=new_arr,
                       actions=rng.integers(0, 6, steps).astype(np.int64),
                       rewards=rng.normal(size=steps).astype(np.float32),
                       terminateds=np.array(terminated), eps_id=np.array(eps, np.int64),
                       weights=np.ones(steps, np.float32))
