"""The learner's settings (RLlib key names), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from actorrl.config.sections import ALGORITHM, ConfigSection, derived


@dataclass(frozen=True, kw_only=True)
class LearnerConfig(ConfigSection):
    """How the learner process learns (the ``learner`` section of Ape-X and IMPALA)."""

    num_sgd_iter: int = 1
    """Passes over each train batch."""
    minibatch_buffer_size: int = 1
    """Slots of the minibatch buffer (single-tower learner)."""
    learner_queue_size: int = 16
    """Bound of the learner's in-queue of train batches (drops beyond it)."""
    learner_queue_timeout: float = 300.0
    """Seconds without any batch before the learner raises (Ape-X: counted once its first
    batch arrived, however long replay takes to reach ``learning_starts``)."""
    num_multi_gpu_tower_stacks: int = 1
    """Pre-loaded batch stacks per device (multi-tower learner)."""
    num_data_load_threads: int = 1
    """Threads loading batches into tower stacks (multi-tower learner)."""
    train_batch_size: int = derived(500, "train_batch_size")
    """Rows per SGD step (split evenly across towers)."""
    num_gpus: float = derived(0.0, "num_gpus")
    """Devices for data-parallel towers: 0 = one CPU learner; 0.5 = one GPU shared; 2 = two
    GPUs (two towers). With ``_fake_gpus`` the towers are CPU replicas (for testing)."""
    _fake_gpus: bool = derived(False, "_fake_gpus")
    """Build ``num_gpus`` towers on the CPU instead of CUDA devices."""
    tower_rows_multiple: int = derived(1, ALGORITHM)
    """Each tower's shard must be a multiple of this many rows (IMPALA: the sequence
    length, so no sequence is cut); set by the algorithm."""

    wait_for_first_batch: bool = derived(False, ALGORITHM)
    """Wait for the first train batch without limit (``learner_queue_timeout`` applies only
    once learning started): Ape-X, whose replay first fills to ``learning_starts``."""

    def validate(self) -> list[str]:
        """Sizes >= 1, a positive timeout, a batch that splits across the towers."""
        problems = []
        if self.train_batch_size < 1:
            problems.append(f"train_batch_size must be >= 1, got {self.train_batch_size}")
        if self.num_gpus < 0:
            problems.append(f"num_gpus must be >= 0, got {self.num_gpus}")
        if self._fake_gpus and self.num_gpus != int(self.num_gpus):
            problems.append(f"_fake_gpus needs a whole num_gpus, got {self.num_gpus}")
        for key in ("num_sgd_iter", "minibatch_buffer_size", "learner_queue_size",
                    "num_multi_gpu_tower_stacks", "num_data_load_threads",
                    "tower_rows_multiple"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.learner_queue_timeout <= 0:
            problems.append(
                f"learner_queue_timeout must be > 0, got {self.learner_queue_timeout}")
        if problems:
            return problems
        towers = self.num_towers
        if towers > 1 or self.num_gpus > 0:
            if self.train_batch_size < towers:
                problems.append(f"train_batch_size ({self.train_batch_size}) must be at least "
                                f"the number of towers ({towers})")
            elif self.train_batch_size % towers:
                problems.append(f"train_batch_size ({self.train_batch_size}) must divide "
                                f"evenly across {towers} towers (num_gpus={self.num_gpus})")
        return problems

    @property
    def num_towers(self) -> int:
        """Number of model replicas (1 when learning on one device)."""
        if self.num_gpus <= 0:
            return 1
        return max(1, math.ceil(self.num_gpus)) if not self._fake_gpus else int(self.num_gpus)

    @property
    def multi_tower(self) -> bool:
        """True when the multi-tower (MultiGPULearnerThread) learner is used."""
        return self.num_gpus > 0


@dataclass(frozen=True, kw_only=True)
class PPOLearnerConfig(LearnerConfig):
    """The ``learner`` section of PPO: minibatch SGD epochs over each synchronous train
    batch (RLlib's PPO defaults)."""

    num_sgd_iter: int = 30
    """Epochs over each train batch."""
    sgd_minibatch_size: int = 128
    """Rows per SGD step (split across the towers); each epoch takes
    ``rows // sgd_minibatch_size`` minibatches and drops the partial rest, as RLlib's
    multi-GPU loader does (a recurrent policy's minibatches are whole sequences, at least
    ``sgd_minibatch_size`` rows each)."""
    shuffle_sequences: bool = True
    """Shuffle the rows (a recurrent policy's: whole sequences) before every epoch."""

    def validate(self) -> list[str]:
        """The learner's checks plus sgd_minibatch_size >= 1 (the algorithm checks it
        against train_batch_size and the towers, values this section only derives)."""
        problems = super().validate()
        if self.sgd_minibatch_size < 1:
            problems.append(f"sgd_minibatch_size must be >= 1, got {self.sgd_minibatch_size}")
        return problems
