"""Data-parallel SGD over model replicas ("towers"), one per device.

A :class:`TowerSet` wraps one policy. Tower 0 *is* the policy's model; the others are
replicas on their own devices. A batch is split into equal contiguous shards, one per tower,
and pre-loaded into one of ``num_stacks`` stacks (device tensors ready to use). A learning
step computes the policy's loss on every tower's shard, averages the gradients into tower
0, applies them once with the policy's optimizer (clipping included), and copies the new
parameters back to the replicas, so all towers stay identical.

Because each tower's loss is a mean over its shard and the shards are equal in size, the
averaged gradient equals the full-batch gradient: N towers give the same update as one.

A sequenced batch (a recurrent policy's, see :mod:`actorrl.data.batch`) is split only at
sequence boundaries, each tower getting whole sequences with their start states, into
shards as equal as the boundaries allow; the towers' gradients are then averaged weighted
by their shards' row counts, which again equals the full-batch gradient of a mean loss.

Towers on distinct CUDA devices run in parallel threads; CPU towers (``_fake_gpus``) share
the same cores, so they run one after the other rather than fight over them.

Minibatch SGD (PPO) uses the towers differently: :meth:`TowerSet.preload` puts a whole train
batch on every tower device once, and :meth:`TowerSet.learn_on_minibatch` takes one SGD step
on a minibatch given by row (or sequence) indices, gathered on the devices and split
across the towers, weighted by rows as above; :func:`epoch_minibatches` draws an epoch's
minibatches.
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from actorrl.data.batch import SampleBatch, is_sequence_column
from actorrl.policy.base import LossOutput, TorchPolicy


def tower_devices(num_gpus: float, fake_gpus: bool) -> list[torch.device]:
    """Devices for ``num_gpus`` towers (CPU replicas when ``fake_gpus``)."""
    if num_gpus <= 0:
        return [torch.device("cpu")]
    if fake_gpus:
        return [torch.device("cpu")] * int(num_gpus)
    available = torch.cuda.device_count()
    wanted = max(1, int(np.ceil(num_gpus)))
    if available < wanted:
        raise RuntimeError(
            f"num_gpus={num_gpus} needs {wanted} CUDA devices but {available} are visible; "
            "set num_gpus=0 to learn on the CPU, or _fake_gpus=True to test towers on CPU")
    return [torch.device(f"cuda:{i}") for i in range(wanted)]


def move_policy_to(policy: TorchPolicy, device: torch.device) -> None:
    """Move every torch module a policy holds (model, target model...) to ``device``."""
    for value in vars(policy).values():
        if isinstance(value, torch.nn.Module):
            value.to(device)
    policy.device = device


class TowerSet:
    """Towers of one policy plus their pre-loaded batch stacks. Thread-safe per stack: a
    loader thread may fill one stack while the learner learns on another."""

    def __init__(self, policy: TorchPolicy, devices: list[torch.device], num_stacks: int = 1
                 ) -> None:
        if not devices:
            raise ValueError("a TowerSet needs at least one device")
        self.policy = policy
        self.devices = devices
        move_policy_to(policy, devices[0])
        self.replicas: list[torch.nn.Module] = [policy.model]
        for device in devices[1:]:
            self.replicas.append(copy.deepcopy(policy.model).to(device))
        # Flat lists, built once: averaging and syncing then run as fused foreach ops.
        self._params = [list(r.parameters()) for r in self.replicas]
        self._buffers = [list(r.buffers()) for r in self.replicas]
        self.stacks: list[list[dict[str, torch.Tensor]] | None] = [None] * num_stacks
        self.stack_weights: list[list[float]] = [[]] * num_stacks
        self.stack_counts = [0] * num_stacks
        self.stack_batches: list[SampleBatch | None] = [None] * num_stacks
        parallel = len({d for d in devices}) > 1
        self._pool = ThreadPoolExecutor(len(devices), "tower") if parallel else None
        self._lock = threading.Lock()
        self._preloaded: list[dict[str, torch.Tensor]] | None = None
        self._preloaded_starts: np.ndarray | None = None
        self._preloaded_seq_lens: np.ndarray | None = None

    @property
    def num_towers(self) -> int:
        """Number of replicas."""
        return len(self.replicas)

    def load(self, batch: SampleBatch, stack: int) -> int:
        """Split ``batch`` across the towers into stack ``stack``; returns rows loaded."""
        n = self.num_towers
        if batch.is_sequenced:
            parts = batch.split_sequences(n)
        else:
            if batch.count < n or batch.count % n:
                raise ValueError(f"a batch of {batch.count} rows cannot be split evenly "
                                 f"across {n} towers; make train_batch_size a multiple of {n}")
            shard = batch.count // n
            parts = [batch.slice(i * shard, (i + 1) * shard) for i in range(n)]
        tensors = []
        for part, device in zip(parts, self.devices):
            if device.type == "cuda":
                cols = self.policy.batch_to_tensors(part, torch.device("cpu"))
                tensors.append({k: v.pin_memory().to(device, non_blocking=True)
                                for k, v in cols.items()})
            else:
                tensors.append(self.policy.batch_to_tensors(part, device))
        self.stacks[stack] = tensors
        self.stack_weights[stack] = [part.count / batch.count for part in parts]
        self.stack_counts[stack] = batch.count
        self.stack_batches[stack] = batch
        return batch.count

    def release(self, stack: int) -> None:
        """Free a stack's tensors."""
        self.stacks[stack] = None
        self.stack_batches[stack] = None
        self.stack_counts[stack] = 0

    def _tower_loss(self, i: int, tensors: dict[str, torch.Tensor]) -> LossOutput:
        model = self.replicas[i]
        model.train()
        model.zero_grad(set_to_none=True)
        out = self.policy.loss(model, tensors)
        out.loss.backward()
        return out

    def learn_on_loaded(self, stack: int) -> dict[str, Any]:
        """One SGD step on a loaded stack; returns ``learner_stats`` and per-sample outputs
        (concatenated in the batch's row order)."""
        tensors = self.stacks[stack]
        if tensors is None:
            raise RuntimeError(f"tower stack {stack} is not loaded")
        with self._lock:
            if self._pool is not None:
                outs = list(self._pool.map(self._tower_loss, range(self.num_towers), tensors))
            else:
                outs = [self._tower_loss(i, t) for i, t in enumerate(tensors)]
            self._average_gradients_into_tower0(self.stack_weights[stack])
            self.policy._clip_and_step()
            self._sync_replicas()
        keys = list(outs[0].stats)
        values = torch.stack([
            torch.stack([torch.as_tensor(o.stats[k], dtype=torch.float32).detach().cpu()
                         for k in keys]) for o in outs]).mean(dim=0).tolist()
        info: dict[str, Any] = {"learner_stats": dict(zip(keys, values))}
        for key in outs[0].per_sample:
            info[key] = np.concatenate([o.per_sample[key].detach().cpu().numpy() for o in outs])
        return info

    def _average_gradients_into_tower0(self, weights: list[float]) -> None:
        """Tower 0's gradients become ``sum_i weights[i] * grad_i`` (the weights are the
        shards' shares of the batch's rows)."""
        if self.num_towers == 1:
            return
        main = self._params[0]
        for param in main:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        grads = [p.grad for p in main]
        with torch.no_grad():
            torch._foreach_mul_(grads, weights[0])
            for replica, weight in zip(self._params[1:], weights[1:]):
                others = [(p.grad if p.grad is not None else torch.zeros_like(p)).to(
                    g.device, non_blocking=True) for p, g in zip(replica, grads)]
                torch._foreach_add_(grads, others, alpha=weight)

    def _sync_replicas(self) -> None:
        if self.num_towers == 1:
            return
        with torch.no_grad():
            for params, buffers in zip(self._params[1:], self._buffers[1:]):
                torch._foreach_copy_(params, self._params[0])
                if buffers:
                    torch._foreach_copy_(buffers, self._buffers[0])


    # ---- minibatch SGD on a pre-loaded train batch (PPO) --------------------------------
    def preload(self, batch: SampleBatch) -> int:
        """Put the whole ``batch`` on the tower devices once (one copy per distinct
        device; CPU columns are zero-copy views), replacing what was pre-loaded before.
        :meth:`learn_on_minibatch` then gathers minibatches there. Returns rows loaded."""
        copies: dict[torch.device, dict[str, torch.Tensor]] = {}
        for device in self.devices:
            if device in copies:
                continue
            if device.type == "cuda":
                cols = self.policy.batch_to_tensors(batch, torch.device("cpu"))
                copies[device] = {k: v.pin_memory().to(device, non_blocking=True)
                                  for k, v in cols.items()}
            else:
                copies[device] = self.policy.batch_to_tensors(batch, device)
        self._preloaded = [copies[device] for device in self.devices]
        if batch.is_sequenced:
            self._preloaded_seq_lens = np.asarray(batch[SampleBatch.SEQ_LENS], dtype=np.int64)
            self._preloaded_starts = batch.sequence_starts()
        else:
            self._preloaded_seq_lens = self._preloaded_starts = None
        return batch.count

    def release_preloaded(self) -> None:
        """Free the pre-loaded train batch."""
        self._preloaded = None
        self._preloaded_seq_lens = self._preloaded_starts = None

    def _split_minibatch(self, indices: np.ndarray) -> list[np.ndarray]:
        """``indices`` cut into one contiguous part per tower, as equal in rows as the
        rows (or the sequences' lengths) allow; a part may be empty (more towers than
        sequences)."""
        n = self.num_towers
        if self._preloaded_seq_lens is None:
            return list(np.array_split(indices, n))
        lengths = self._preloaded_seq_lens[indices]
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        cuts = [0]
        for part in range(1, n):
            nearest = int(np.abs(bounds - bounds[-1] * part / n).argmin())
            cuts.append(max(nearest, cuts[-1]))
        cuts.append(len(indices))
        return [indices[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    def _gather(self, tower: int, part: np.ndarray) -> tuple[dict[str, torch.Tensor], int]:
        """Tower ``tower``'s minibatch part gathered from its device's pre-loaded batch,
        and its row count."""
        assert self._preloaded is not None
        columns = self._preloaded[tower]
        device = self.devices[tower]
        if self._preloaded_seq_lens is None:
            rows = torch.as_tensor(part, dtype=torch.int64, device=device)
            return {k: v.index_select(0, rows) for k, v in columns.items()}, len(part)
        assert self._preloaded_starts is not None
        lengths = self._preloaded_seq_lens[part]
        row_index = (np.repeat(self._preloaded_starts[part] - np.cumsum(lengths) + lengths,
                               lengths) + np.arange(int(lengths.sum())))
        rows = torch.as_tensor(row_index, dtype=torch.int64, device=device)
        seqs = torch.as_tensor(part, dtype=torch.int64, device=device)
        return ({k: v.index_select(0, seqs if is_sequence_column(k) else rows)
                 for k, v in columns.items()}, len(row_index))

    def learn_on_minibatch(self, indices: np.ndarray) -> dict[str, Any]:
        """One SGD step on the pre-loaded batch's rows ``indices`` (a sequenced batch:
        its sequences ``indices``). The minibatch is split across the towers, each
        tower's loss gradient weighted by its share of the rows, so N towers give the
        update of one device. Returns ``learner_stats`` (the towers' row-weighted means,
        plus ``grad_gnorm`` when the policy measures it)."""
        if self._preloaded is None:
            raise RuntimeError("no train batch is pre-loaded: call preload(batch) first")
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) == 0:
            raise ValueError("a minibatch needs at least one row")
        parts = self._split_minibatch(indices)
        gathered = [self._gather(i, part) if len(part) else ({}, 0)
                    for i, part in enumerate(parts)]
        rows = sum(count for _, count in gathered)
        weights = [count / rows for _, count in gathered]
        active = [i for i, (_, count) in enumerate(gathered) if count]
        with self._lock:
            for i, (_, count) in enumerate(gathered):
                if not count:
                    self.replicas[i].zero_grad(set_to_none=True)
            if self._pool is not None:
                outs = list(self._pool.map(lambda i: self._tower_loss(i, gathered[i][0]),
                                           active))
            else:
                outs = [self._tower_loss(i, gathered[i][0]) for i in active]
            self._average_gradients_into_tower0(weights)
            self.policy._clip_and_step()
            self._sync_replicas()
        keys = list(outs[0].stats)
        per_tower = torch.stack([
            torch.stack([torch.as_tensor(o.stats[k], dtype=torch.float64).detach().cpu()
                         for k in keys]) for o in outs])
        share = torch.tensor([weights[i] for i in active], dtype=torch.float64)
        values = (per_tower * share[:, None]).sum(dim=0).tolist()
        stats = dict(zip(keys, values))
        gnorm = getattr(self.policy, "grad_gnorm", None)
        if gnorm is not None:
            stats["grad_gnorm"] = float(gnorm)
        return {"learner_stats": stats}


def epoch_minibatches(count: int, minibatch_size: int, rng: np.random.Generator, *,
                      shuffle: bool = True, seq_lens: np.ndarray | None = None
                      ) -> list[np.ndarray]:
    """One epoch's minibatches over a train batch of ``count`` rows: arrays of row
    indices (with ``seq_lens``, a sequenced batch's: arrays of sequence indices).

    With ``shuffle`` the rows (sequences) are permuted first; otherwise they keep
    their order and only the minibatches' order is permuted. Rows are cut into
    ``count // minibatch_size`` minibatches of ``minibatch_size`` rows and the partial
    rest is dropped (RLlib's multi-GPU loader); a batch smaller than one minibatch is
    one minibatch. Sequences are grouped into minibatches of at least
    ``minibatch_size`` rows, a trailing group with fewer rows dropped unless it is the
    only one."""
    if minibatch_size < 1:
        raise ValueError(f"minibatch_size must be >= 1, got {minibatch_size}")
    if seq_lens is None:
        order = rng.permutation(count) if shuffle else np.arange(count)
        num = max(1, count // minibatch_size)
        batches = [order[i * minibatch_size:(i + 1) * minibatch_size] for i in range(num)]
    else:
        lengths = np.asarray(seq_lens, dtype=np.int64)
        order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
        batches, first, rows = [], 0, 0
        for position, seq in enumerate(order.tolist()):
            rows += int(lengths[seq])
            if rows >= minibatch_size:
                batches.append(order[first:position + 1])
                first, rows = position + 1, 0
        if not batches:
            batches.append(order)
    if not shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches
