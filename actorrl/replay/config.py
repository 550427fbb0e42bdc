"""The replay shards' settings (the ``replay`` section of Ape-X), RLlib key names."""

from __future__ import annotations

from dataclasses import dataclass

from actorrl.config.sections import ConfigSection, derived


@dataclass(frozen=True, kw_only=True)
class ReplayConfig(ConfigSection):
    """How the replay shards store and replay (``actorrl.replay.actor.ReplayActor``)."""

    buffer_size: int = 50_000
    """Replay capacity in rows, split across the shards."""
    learning_starts: int = 1000
    """Env steps sampled before replay starts (split across the shards)."""
    prioritized_replay: bool = True
    """Proportional prioritized replay (False: uniform)."""
    prioritized_replay_alpha: float = 0.6
    """Priority exponent."""
    prioritized_replay_beta: float = 0.4
    """Importance-weight exponent."""
    final_prioritized_replay_beta: float | None = None
    """Where the importance-weight exponent goes, linearly over
    ``prioritized_replay_beta_annealing_timesteps`` rows replayed (RLlib's DQN; None: it
    stays ``prioritized_replay_beta``, as in RLlib's Ape-X)."""
    prioritized_replay_beta_annealing_timesteps: int = 20_000
    """Rows replayed (trained on) over which beta anneals to its final value."""
    prioritized_replay_eps: float = 1e-6
    """Added to ``|td_error|`` for priorities."""
    num_replay_buffer_shards: int = 1
    """Replay shard actors."""
    batch_replay: bool = False
    """Replay whole sample batches (recurrent models; needs ``prioritized_replay: false``):
    no prioritization."""
    worker_side_prioritization: bool = False
    """Workers compute initial priorities before sending samples; shards use them."""
    compress_observations: bool = False
    """Keep stored frames LZ4-compressed (frame-stack observations only; Pong: ~400 B per
    transition instead of ~8.4 kB, sampling ~2x slower). Needs the ``compress`` extra."""
    train_batch_size: int = derived(32, "train_batch_size")
    """Rows per replayed batch."""

    def beta_after(self, rows_replayed: int) -> float:
        """The importance-weight exponent once ``rows_replayed`` rows were trained on."""
        final = self.final_prioritized_replay_beta
        if final is None:
            return self.prioritized_replay_beta
        done = min(1.0, rows_replayed / self.prioritized_replay_beta_annealing_timesteps)
        return self.prioritized_replay_beta + done * (final - self.prioritized_replay_beta)

    def validate(self) -> list[str]:
        """Shards >= 1 with at least one row each, non-negative starts and exponents, no
        prioritized batch replay."""
        problems = []
        if self.num_replay_buffer_shards < 1:
            problems.append(f"num_replay_buffer_shards must be >= 1, got "
                            f"{self.num_replay_buffer_shards}")
        elif self.buffer_size < self.num_replay_buffer_shards:
            problems.append(f"buffer_size ({self.buffer_size}) must be at least "
                            f"num_replay_buffer_shards ({self.num_replay_buffer_shards})")
        for key in ("learning_starts", "prioritized_replay_alpha", "prioritized_replay_beta",
                    "prioritized_replay_eps"):
            if getattr(self, key) < 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.batch_replay and self.prioritized_replay:
            problems.append("batch_replay replays whole sample batches, without priorities: "
                            "set prioritized_replay: false with batch_replay: true (or "
                            "batch_replay: false for prioritized replay)")
        if self.final_prioritized_replay_beta is not None and \
                self.final_prioritized_replay_beta < 0:
            problems.append(f"final_prioritized_replay_beta must be >= 0, got "
                            f"{self.final_prioritized_replay_beta}")
        if self.prioritized_replay_beta_annealing_timesteps < 1:
            problems.append(f"prioritized_replay_beta_annealing_timesteps must be >= 1, got "
                            f"{self.prioritized_replay_beta_annealing_timesteps}")
        if self.train_batch_size < 1:
            problems.append(f"train_batch_size must be >= 1, got {self.train_batch_size}")
        return problems
