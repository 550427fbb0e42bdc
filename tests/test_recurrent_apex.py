"""Ape-X / DQN with a recurrent Q-network (``use_lstm`` with ``batch_replay``): acting and
the loss's unroll agree, the n-step targets stay inside each sequence, batch replay keeps
sequences whole, bad combinations fail at config time, and Ape-X learns a memory task a
feed-forward Q-network can only guess."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.data.batch import MultiAgentBatch, SampleBatch, chop_into_sequences
from actorrl.envs import make_env
from actorrl.envs.custom.memory import MEMORY_CUE_ID
from actorrl.policy.dqn import N_STEPS, DQNPolicy, adjust_nstep
from actorrl.policy.recurrent_q import RecurrentQNetwork, unroll_q
from actorrl.rollout import RolloutWorker
from actorrl.runtime import Driver

SMALL_LSTM = {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 3}


def _worker(n_step: int = 3, explore: bool = True, model: dict | None = None,
            **config: Any) -> RolloutWorker:
    """A DQN rollout worker with a small recurrent Q-network on the memory task (episodes
    of 5 steps, cut into sequences of at most 3)."""
    return RolloutWorker(MEMORY_CUE_ID, DQNPolicy, {
        "num_envs_per_worker": 3, "rollout_fragment_length": 7, "seed": 3, "n_step": n_step,
        "hiddens": [8], "explore": explore, "env_config": {"delay": 4},
        "model": {**SMALL_LSTM, **(model or {})}, **config})


# ---- the env ---------------------------------------------------------------------------
def test_memory_cue_rewards_only_the_answer_that_names_the_cue():
    env = make_env(MEMORY_CUE_ID, {"num_cues": 3, "delay": 2})
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        cue = int(np.argmax(obs[:3]))
        assert obs[3] == 0 and obs[:3].sum() == 1
        obs, reward, terminated, _, _ = env.step((cue + 1) % 3)
        assert not obs.any() and reward == 0 and not terminated  # blank step
        obs, reward, terminated, _, _ = env.step(cue)
        assert obs[3] == 1 and not obs[:3].any() and reward == 0 and not terminated
        answer = cue if seed % 2 else (cue + 1) % 3
        _, reward, terminated, _, _ = env.step(answer)
        assert terminated and reward == (1.0 if seed % 2 else -1.0)


# ---- acting and the unroll -----------------------------------------------------------------
@pytest.mark.parametrize("model", [{}, {"lstm_use_prev_action": True,
                                        "lstm_use_prev_reward": True}])
def test_the_unrolled_q_values_are_the_ones_acted_on(model):
    """Greedy acting picks argmax of the Q-values of each step; unrolling the recorded
    sequences from their stored start states gives those Q-values back for every row (so
    every action is the argmax of its row's unrolled Q-values), and the extra step sees
    each sequence's last new_obs."""
    worker = _worker(explore=False, model=model)
    policy = worker.get_policy()
    assert policy.is_recurrent and isinstance(policy.model, RecurrentQNetwork)
    batch = SampleBatch.concat_samples([worker.sample(), worker.sample()])
    worker.stop()
    assert batch.is_sequenced and int(batch["seq_lens"].max()) <= 3
    assert batch.state_columns() == ["state_in_0", "state_in_1"]
    with torch.no_grad():
        q_all, layout = unroll_q(policy.model, policy.batch_to_tensors(batch))
    q_rows = q_all[layout.row_seq, layout.row_t].numpy()
    np.testing.assert_array_equal(q_rows.argmax(axis=1), batch["actions"])
    # Step by step from each stored start state: the same Q-values, row by row.
    starts = batch.sequence_starts()
    for s, length in enumerate(batch["seq_lens"].tolist()):
        state = [torch.as_tensor(batch[name][s:s + 1]) for name in batch.state_columns()]
        rows = list(range(starts[s], starts[s] + length))
        for t, row in enumerate([*rows, rows[-1]]):
            tail = t == length
            obs = batch["new_obs" if tail else "obs"][row]
            inputs = {"obs": torch.as_tensor(obs)[None, None]}
            if "prev_actions" in batch:
                prev = batch["actions"][row] if tail else batch["prev_actions"][row]
                inputs["prev_actions"] = torch.as_tensor(np.asarray(prev))[None, None]
            if "prev_rewards" in batch:
                prev = batch["rewards"][row] if tail else batch["prev_rewards"][row]
                inputs["prev_rewards"] = torch.as_tensor(np.float32(prev))[None, None]
            with torch.no_grad():
                q, _, state = policy.model.forward_rnn(inputs, state, torch.tensor([1]))
            np.testing.assert_allclose(q[0, 0].numpy(), q_all[s, t].numpy(), atol=1e-5)


def _reference_td_errors(policy: DQNPolicy, batch: SampleBatch) -> np.ndarray:
    """The loss's documented semantics, step by step: row t of a sequence is judged
    against r + gamma^k (1 - terminated) Q'(position t + k), both networks stepped one
    observation at a time from the sequence's stored start state."""
    cfg = policy.config

    def stepped(model, s: int, rows: list[int]) -> np.ndarray:
        state = [torch.as_tensor(batch[name][s:s + 1]) for name in batch.state_columns()]
        out = []
        for obs in [*(batch["obs"][r] for r in rows), batch["new_obs"][rows[-1]]]:
            with torch.no_grad():
                q, _, state = model.forward_rnn({"obs": torch.as_tensor(obs)[None, None]},
                                                state, torch.tensor([1]))
            out.append(q[0, 0].numpy())
        return np.stack(out)

    errors = []
    starts = batch.sequence_starts()
    for s, length in enumerate(batch["seq_lens"].tolist()):
        rows = list(range(starts[s], starts[s] + length))
        online, target = stepped(policy.model, s, rows), stepped(policy.target_model, s, rows)
        for t, row in enumerate(rows):
            k = int(batch[N_STEPS][row])
            nxt = t + k
            best = online[nxt].argmax() if cfg.double_q else target[nxt].argmax()
            bootstrap = 0.0 if batch["terminateds"][row] else target[nxt][best]
            goal = batch["rewards"][row] + cfg.gamma ** k * bootstrap
            errors.append(online[t][batch["actions"][row]] - goal)
    return np.asarray(errors, dtype=np.float32)


@pytest.mark.parametrize("double_q,dueling", [(True, True), (False, False)])
def test_the_loss_unrolls_both_networks_with_n_step_targets_inside_each_sequence(
        double_q, dueling):
    """n-step windows stop at sequence ends (every row's next state is one the unroll
    reaches); the TD errors equal the step-by-step reference; an update moves the
    weights, and its td_error has one entry per real row."""
    worker = _worker(n_step=3, double_q=double_q, dueling=dueling, gamma=0.9)
    policy = worker.get_policy()
    batch = SampleBatch.concat_samples([worker.sample() for _ in range(3)])
    worker.stop()
    starts = batch.sequence_starts()
    row_t = np.arange(batch.count) - np.repeat(starts[:-1], batch["seq_lens"])
    seq_len_of_row = np.repeat(batch["seq_lens"], batch["seq_lens"])
    assert (row_t + batch[N_STEPS] <= seq_len_of_row).all()
    assert (batch[N_STEPS] == 3).any() and (batch[N_STEPS] < 3).any()
    # A target network that differs from the online one, so double Q is exercised.
    with torch.no_grad():
        for p in policy.target_model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    np.testing.assert_allclose(policy.compute_td_error(batch),
                               _reference_td_errors(policy, batch), atol=1e-4)
    before = [p.detach().clone() for p in policy.model.parameters()]
    info = policy.learn_on_batch(batch)
    assert info["td_error"].shape == (batch.count,)
    assert np.isfinite(info["learner_stats"]["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))


def test_n_step_transitions_across_a_sequence_end_are_refused():
    """A batch whose n-step windows were not stopped at sequence ends cannot be unrolled
    consistently: the loss says so instead of reading a wrong position."""
    worker = _worker(n_step=1)
    policy = worker.get_policy()
    batch = worker.sample()
    worker.stop()
    trajectory = SampleBatch({k: v for k, v in batch.items()
                              if not k.startswith("state_in_") and k != "seq_lens"})
    first = trajectory.slice(0, int(batch["seq_lens"][0]) + int(batch["seq_lens"][1]))
    first["state_in_0"] = np.zeros((first.count, 8), np.float32)
    first["state_in_1"] = np.zeros((first.count, 8), np.float32)
    uncut = chop_into_sequences(adjust_nstep(first, 3, 0.9), 3)
    with pytest.raises(ValueError, match="past the end of its sequence"):
        policy.compute_td_error(uncut)


# ---- batch replay --------------------------------------------------------------------------
async def test_batch_replay_keeps_sequences_start_states_and_seq_lens(tmp_path):
    """A recurrent policy's sample batch comes back from a batch-replay shard with its
    sequences whole: the same seq_lens, start states and rows."""
    worker = _worker()
    batch = worker.sample()
    worker.stop()
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        shard = await driver.create_actor(
            "actorrl.replay.actor:BatchReplayActor",
            args=({"buffer_size": 1000, "learning_starts": 0, "batch_replay": True,
                   "prioritized_replay": False},), num_cpus=0)
        await driver.get(shard.add_batch.remote([driver.put(batch)]), timeout_s=30)
        replayed = await driver.get(shard.replay.remote(), timeout_s=30)
    assert isinstance(replayed, MultiAgentBatch)
    out = replayed.policy_batches["default_policy"].unpacked()
    assert out.is_sequenced and sorted(out) == sorted(batch)
    for key in batch:
        np.testing.assert_array_equal(out[key], batch[key], err_msg=key)


async def test_a_per_row_replay_shard_refuses_sequences(tmp_path):
    """Sequences reaching a prioritized (per-row) shard are refused, not cut apart."""
    worker = _worker()
    batch = worker.sample()
    worker.stop()
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        shard = await driver.create_actor("actorrl.replay.actor:ReplayActor",
                                          args=({"buffer_size": 1000},), num_cpus=0)
        with pytest.raises(ValueError, match="per-row replay shard.*batch_replay: true"):
            await driver.get(shard.add_batch.remote([driver.put(batch)]), timeout_s=30)


def test_worker_side_priorities_unroll_the_whole_fragment():
    """With worker_side_prioritization a recurrent policy's initial priorities are
    |td_error| + eps of each row, the fragment unrolled from its first state: row by row
    the step-by-step reference (each sequence stepped from its stored start state, which is
    the state acting reached there), also for the second fragment, whose unfinished
    episodes go on from the first fragment's last states (not from zeros)."""
    worker = _worker(worker_side_prioritization=True, prioritized_replay_eps=0.5)
    policy = worker.get_policy()
    first, second = worker.sample(), worker.sample()
    worker.stop()
    # The second fragment goes on with episodes of the first: those trajectories start
    # from the carried (non-zero) state, which a zero-state unroll would not see.
    starts = second.sequence_starts()[:-1]
    eps = second["eps_id"]
    continued = [s for s, row in enumerate(starts) if (row == 0 or eps[row - 1] != eps[row])
                 and eps[row] in set(first["eps_id"].tolist())]
    assert continued and (np.abs(second["state_in_0"][continued]).sum(axis=1) > 0).all()
    for batch in (first, second):
        weights = batch["weights"]
        assert weights.shape == (batch.count,) and np.isfinite(weights).all()
        assert (weights >= 0.5).all() and (weights > 0.5).any()
        np.testing.assert_allclose(weights, np.abs(_reference_td_errors(policy, batch)) + 0.5,
                                   atol=1e-4)


# ---- config --------------------------------------------------------------------------------
def _apex(**values: Any) -> Any:
    return load_config(get_algorithm("apex").config_cls, {"num_workers": 1, **values})


def test_recurrent_apex_config_errors_name_the_key():
    """use_lstm needs batch replay; batch replay refuses priorities; together they load."""
    with pytest.raises(ConfigError, match="use_lstm.*batch_replay: true"):
        _apex(model={"use_lstm": True})
    with pytest.raises(ConfigError, match="batch_replay.*prioritized_replay: false"):
        _apex(batch_replay=True)
    with pytest.raises(ConfigError, match="max_seq_len"):
        _apex(model={"use_lstm": True, "max_seq_len": 0}, batch_replay=True,
              prioritized_replay=False)
    config = _apex(model={"use_lstm": True}, batch_replay=True, prioritized_replay=False)
    assert config.policy.model["use_lstm"] and config.replay.batch_replay

# ---- learning a memory task ---------------------------------------------------------------
MEMORY_APEX = {
    "env": MEMORY_CUE_ID, "env_config": {"num_cues": 2, "delay": 4},
    "num_workers": 1, "num_envs_per_worker": 8, "rollout_fragment_length": 10,
    "batch_replay": True, "prioritized_replay": False, "buffer_size": 4000,
    "learning_starts": 400, "training_intensity": 4.0, "lr": 2e-3, "n_step": 1,
    "gamma": 0.9, "hiddens": [32], "target_network_update_freq": 800,
    "exploration_config": {"epsilon_timesteps": 2000, "final_epsilon": 0.02},
    "metrics_smoothing_episodes": 100, "min_iter_time_s": 0.5, "seed": 0,
    "model": {"fcnet_hiddens": [32], "fcnet_activation": "relu", "lstm_cell_size": 32,
              "max_seq_len": 10},
}
"""Ape-X on actorrl/MemoryCue-v0 (5-step episodes, the cue seen at the first step only),
sized for 2 shared cores."""


async def _train_memory(tmp_path: Any, use_lstm: bool, *, until: float,
                        max_steps: int, max_s: float) -> tuple[int, float, list]:
    """Train until the mean return reaches ``until``, or ``max_steps`` env steps or
    ``max_s`` seconds pass: ``(env steps, last mean return, history)``."""
    spec = get_algorithm("apex")
    config = load_config(spec.config_cls, {
        **MEMORY_APEX, "model": {**MEMORY_APEX["model"], "use_lstm": use_lstm}})
    history: list[tuple[int, float]] = []
    async with Driver.start(str(tmp_path / f"session-{use_lstm}")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        start = time.monotonic()
        try:
            while True:
                result = await trainer.train()
                steps, reward = result["timesteps_total"], result["episode_reward_mean"]
                history.append((steps, round(reward, 2)))
                if (reward >= until or steps >= max_steps
                        or time.monotonic() - start > max_s):
                    break
        finally:
            await trainer.stop()
    return steps, reward, history


LSTM_THRESHOLD = 0.7
"""Mean return the LSTM must reach (perfect recall under epsilon 0.02: about 0.98)."""
FF_CEILING = 0.35
"""Mean return the feed-forward network must stay below: guessing gives 0, and 0.35 is
3.5 standard deviations of a 100-episode mean above it."""


@pytest.mark.learning
@pytest.mark.timeout(900)  # ~1 min on an idle 2-core machine; shared cores stretch it
async def test_apex_lstm_learns_the_memory_task_that_feed_forward_only_guesses(tmp_path):
    """Ape-X with batch replay and an LSTM reaches a mean return of 0.7 on the memory task
    (about 2,000 env steps here, seed 0); the same settings without the LSTM, for the same
    env steps, stay at chance (0)."""
    steps, lstm_return, lstm_history = await _train_memory(
        tmp_path, True, until=LSTM_THRESHOLD, max_steps=8000, max_s=400)
    assert lstm_return >= LSTM_THRESHOLD, f"LSTM: {lstm_history}"
    _, ff_return, ff_history = await _train_memory(
        tmp_path, False, until=float("inf"), max_steps=steps, max_s=400)
    assert ff_history[-1][0] >= steps, f"feed-forward did not sample as long: {ff_history}"
    assert ff_return < FF_CEILING, f"feed-forward: {ff_history}"
    print(f"memory task: LSTM {lstm_return:.2f} at {steps} env steps "
          f"({lstm_history[-1]}), feed-forward {ff_return:.2f} ({ff_history[-1]})")
