"""SAC's learner against a bare torch loop: the framework's overhead per update.

Prints one JSON object. ``framework_updates_per_s`` is SAC updates per second by actorrl's
learner thread (the one the Ape-X/DQN pipeline runs in the learner process: in-queue,
batch to tensors, the SAC loss, per-group gradient clipping, Adam, the soft target update,
stats and per-row TD errors out), its in-queue kept full with one replayed batch;
``bare_updates_per_s`` is a hand-written torch loop doing the same update (the same
networks, losses, one Adam over the same four parameter groups, the soft target update) on
the same batch held as tensors. Both run on one torch thread in this process, in
interleaved rounds (medians), so background load hits them alike; ``ratio`` = framework /
bare (the aim: >= 0.9, at most 10% overhead).

Workload: batches of 256 rows, [256, 256] ReLU policy and twin Q networks (RLlib's SAC
defaults), HalfCheetah-v5's spaces (17-dim observations, 6-dim actions; Pendulum-v1's
without the mujoco extra).

    python benchmarks/sac_learner.py [--rounds 5] [--slice-s 3]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from actorrl.algorithms.sac import SACConfig  # noqa: E402
from actorrl.config.algorithm import load_config  # noqa: E402
from actorrl.data.batch import SampleBatch  # noqa: E402
from actorrl.learner.config import LearnerConfig  # noqa: E402
from actorrl.learner.thread import LearnerThread, make_learner_thread  # noqa: E402
from actorrl.policy.sac import SACModel, SACPolicy  # noqa: E402
from actorrl.rollout import RolloutWorker  # noqa: E402
from benchmarks.learner import measure  # noqa: E402

POLICY = "actorrl.policy.sac:SACPolicy"
BATCH = 256
HIDDENS = [256, 256]


def workload_env() -> str:
    """HalfCheetah-v5 when the mujoco extra is installed, else Pendulum-v1."""
    return "HalfCheetah-v5" if importlib.util.find_spec("mujoco") else "Pendulum-v1"


def worker_config(env: str) -> dict:
    """SAC's defaults with [256, 256] networks and 256-row batches."""
    net = {"fcnet_hiddens": HIDDENS, "fcnet_activation": "relu"}
    return {**load_config(SACConfig, {
        "env": env, "train_batch_size": BATCH, "q_model_config": net,
        "policy_model_config": net, "rollout_fragment_length": BATCH,
        "num_envs_per_worker": 1}).to_dict(), "seed": 0}


def replayed_batch(config: dict) -> SampleBatch:
    """256 rows sampled by a SAC rollout worker (random weights), postprocessed as replay
    hands them to the learner (n-step columns, importance weights)."""
    worker = RolloutWorker(config["env"], POLICY, config)
    batch = worker.sample()
    return batch.slice(0, BATCH) if batch.count > BATCH else batch


def build_learner(config: dict) -> LearnerThread:
    """A started single-device learner thread with a SAC policy."""
    worker = RolloutWorker(config["env"], POLICY, config)
    learner_config = LearnerConfig(train_batch_size=BATCH, learner_queue_size=4,
                                   learner_queue_timeout=60, wait_for_first_batch=True)
    thread = make_learner_thread(worker, learner_config)
    thread.start()
    return thread


def measure_framework(thread: LearnerThread, batch: SampleBatch, seconds: float) -> float:
    """Updates per second of the learner thread over ``seconds`` (after a warm-up)."""
    updates_per_s = measure(thread, batch, seconds) / BATCH
    while not thread.outqueue.empty():  # what finished after the clock stopped
        thread.outqueue.get_nowait()
    return updates_per_s


class BareSAC:
    """The SAC update written directly in torch: the policy's networks (a copy of a
    SACPolicy's model, so both start from the same weights), tensors prepared once."""

    def __init__(self, policy: SACPolicy, batch: SampleBatch) -> None:
        cfg = policy.config
        self.model: SACModel = copy.deepcopy(policy.model)
        self.target = copy.deepcopy(policy.target_model)
        self.target.requires_grad_(False)
        self.gamma_n = cfg.gamma ** cfg.n_step
        self.tau = cfg.tau
        self.target_entropy = policy.target_entropy
        opt = cfg.optimization
        groups = [{"params": list(self.model.policy.parameters()),
                   "lr": opt.actor_learning_rate},
                  {"params": list(self.model.q.parameters()), "lr": opt.critic_learning_rate}]
        if self.model.twin_q is not None:
            groups.append({"params": list(self.model.twin_q.parameters()),
                           "lr": opt.critic_learning_rate})
        groups.append({"params": [self.model.log_alpha], "lr": opt.entropy_learning_rate})
        self.optimizer = torch.optim.Adam(groups, eps=1e-7, fused=True)
        self.obs = torch.as_tensor(batch[SampleBatch.OBS]).float()
        self.new_obs = torch.as_tensor(batch[SampleBatch.NEXT_OBS]).float()
        self.actions = torch.as_tensor(batch[SampleBatch.ACTIONS]).float()
        self.rewards = torch.as_tensor(batch[SampleBatch.REWARDS]).float()
        self.not_done = 1.0 - torch.as_tensor(batch[SampleBatch.TERMINATEDS]).float()
        self.weights = torch.ones_like(self.rewards)
        self.q_nets = [n for n in (self.model.q, self.model.twin_q) if n is not None]
        self.target_nets = [n for n in (self.target.q, self.target.twin_q) if n is not None]
        self.online_q = [p for n in self.q_nets for p in n.parameters()]
        self.target_q = [p for n in self.target_nets for p in n.parameters()]

    @staticmethod
    def _squashed(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = inputs.chunk(2, dim=-1)
        log_std = log_std.clamp(-5.0, 2.0)
        std = log_std.exp()
        u = mean + std * torch.randn_like(mean)
        logp = (-0.5 * ((u - mean) / std).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
                - 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
        return torch.tanh(u), logp

    def step(self) -> None:
        """One SAC update."""
        alpha = self.model.log_alpha.exp()
        pi_t, logp_t = self._squashed(self.model(self.obs))
        with torch.no_grad():
            pi_tp1, logp_tp1 = self._squashed(self.model(self.new_obs))
            q_tp1 = torch.min(*[n(self.new_obs, pi_tp1) for n in self.target_nets])
            target = self.rewards + self.gamma_n * self.not_done * (q_tp1 - alpha * logp_tp1)
        critic = sum((self.weights * F.huber_loss(n(self.obs, self.actions), target,
                                                  reduction="none")).mean()
                     for n in self.q_nets)
        q_pi = torch.min(*[torch.func.functional_call(
            n, {k: p.detach() for k, p in n.named_parameters()}, (self.obs, pi_t))
            for n in self.q_nets])
        actor = (alpha.detach() * logp_t - q_pi).mean()
        alpha_loss = -(self.model.log_alpha * (logp_t + self.target_entropy).detach()).mean()
        self.optimizer.zero_grad(set_to_none=True)
        (actor + alpha_loss + critic).backward()
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.target_q, self.online_q, self.tau)


def measure_bare(bare: BareSAC, seconds: float) -> float:
    """Updates per second of the bare loop over ``seconds`` (after a warm-up)."""
    for _ in range(3):
        bare.step()
    start, updates = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        bare.step()
        updates += 1
    return updates / (time.perf_counter() - start)


def main() -> None:
    """Interleaved rounds of both; print the medians and the ratio as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slice-s", type=float, default=3.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = workload_env()
    config = worker_config(env)
    batch = replayed_batch(config)
    thread = build_learner(config)
    policy = thread.local_worker.get_policy()
    bare = BareSAC(policy, batch)
    framework, plain = [], []
    try:
        for _ in range(args.rounds):
            framework.append(measure_framework(thread, batch, args.slice_s))
            plain.append(measure_bare(bare, args.slice_s))
    finally:
        thread.stop()
    fw, bw = statistics.median(framework), statistics.median(plain)
    print(json.dumps({
        "env": env, "batch": BATCH, "hiddens": HIDDENS, "torch_threads": 1,
        "framework_updates_per_s": round(fw, 1), "bare_updates_per_s": round(bw, 1),
        "ratio": round(fw / bw, 3), "rounds": args.rounds, "slice_s": args.slice_s,
        "framework_rounds": [round(v, 1) for v in framework],
        "bare_rounds": [round(v, 1) for v in plain],
        "loadavg_1min": round(os.getloadavg()[0], 2),
        "numpy": np.__version__, "torch": torch.__version__,
    }, indent=2))


if __name__ == "__main__":
    main()
