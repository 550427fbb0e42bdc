"""Recurrent policies: model config, the LSTM model, state carried by the sampler, sequenced
batches, the unrolled losses, multi-tower updates and the partially observed env."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from actorrl.algorithms import get_algorithm
from actorrl.algorithms.checkpoints import read_checkpoint
from actorrl.config.algorithm import load_config
from actorrl.config.loading import load_component
from actorrl.config.sections import ConfigError
from actorrl.data.batch import SampleBatch, chop_into_sequences
from actorrl.envs.custom.partial import STATELESS_CARTPOLE_ID
from actorrl.learner.towers import TowerSet
from actorrl.policy.actor_critic import ActorCriticPolicy
from actorrl.policy.config import DQNPolicyConfig, ImpalaPolicyConfig
from actorrl.policy.impala import ImpalaPolicy
from actorrl.policy.models import LSTMActorCriticModel, make_model
from actorrl.policy.recurrent import SequenceLayout
from actorrl.rollout import RolloutWorker
from tests.helpers.cluster import REPO, read_jsonl, run_cli, run_dirs
from transport.codec import decode, encode

LSTM_MODEL = {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 7}


def _worker(policy: type, model: Mapping | None = None, **config: object) -> RolloutWorker:
    cfg = {"num_envs_per_worker": 3, "rollout_fragment_length": 25, "seed": 5,
           "model": {**LSTM_MODEL, **(model or {})}, **config}
    return RolloutWorker(STATELESS_CARTPOLE_ID, policy, cfg)


# ---- config ----------------------------------------------------------------------------
def test_rllib_lstm_keys_and_defaults():
    """The model config takes RLlib's recurrent keys with RLlib's defaults."""
    cfg = load_component(ImpalaPolicyConfig, {"model": {"use_lstm": True}}, section="policy")
    policy = ImpalaPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), cfg)
    assert policy.is_recurrent and policy.max_seq_len == 20
    assert isinstance(policy.model, LSTMActorCriticModel)
    # h and c of the policy's LSTM, then of the value branch's (vf_share_layers false)
    assert [s.shape for s in policy.get_initial_state()] == [(256,)] * 4
    shared = ImpalaPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2),
                          {"model": {"use_lstm": True, "vf_share_layers": True}})
    assert len(shared.get_initial_state()) == 2


@pytest.mark.parametrize("value", [0, -3, 2.5])
def test_max_seq_len_below_one_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="max_seq_len"):
        load_component(ImpalaPolicyConfig, {"model": {"use_lstm": True, "max_seq_len": value}},
                       section="policy")


class FeedForwardCustomModel(nn.Module):
    """A custom model without the recurrent interface."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.out = nn.Linear(int(np.prod(obs_space.shape)), num_outputs)

    def forward(self, obs):
        return self.out(obs.float()), obs.new_zeros(obs.shape[0])


class CustomGRUModel(nn.Module):
    """A custom recurrent model (a GRU), by class path: the documented interface."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.gru = nn.GRU(int(np.prod(obs_space.shape)), 8, batch_first=True)
        self.pi = nn.Linear(8, num_outputs)
        self.vf = nn.Linear(8, 1)

    def get_initial_state(self) -> list[torch.Tensor]:
        return [torch.zeros(8)]

    def forward_rnn(self, inputs: Mapping[str, torch.Tensor], state: Sequence[torch.Tensor],
                    seq_lens: torch.Tensor):
        out, _ = self.gru(inputs["obs"].float(), state[0].unsqueeze(0))
        last = out[torch.arange(out.shape[0]), seq_lens.long() - 1]
        return self.pi(out), self.vf(out).squeeze(-1), [last]


def test_use_lstm_with_a_custom_model_without_the_interface_fails_at_config_time():
    model = {"use_lstm": True, "custom_model": f"{__name__}:FeedForwardCustomModel"}
    with pytest.raises(ConfigError, match="use_lstm.*forward_rnn"):
        load_component(ImpalaPolicyConfig, {"model": model}, section="policy")


def test_use_lstm_is_refused_for_apex_without_batch_replay_naming_the_key():
    """The DQN policy builds a recurrent Q-network; Ape-X trains it from batch replay
    only (tests/test_recurrent_apex.py)."""
    load_component(DQNPolicyConfig, {"model": {"use_lstm": True}}, section="policy")
    with pytest.raises(ConfigError, match="use_lstm.*batch_replay"):
        load_config(get_algorithm("apex").config_cls,
                    {"num_workers": 1, "model": {"use_lstm": True}})


def test_a_custom_recurrent_model_by_class_path_samples_and_learns():
    """A custom model implementing the interface is recurrent: the worker carries its
    state, and the loss unrolls it (outputs equal those seen when acting)."""
    worker = _worker(ActorCriticPolicy,
                     {"use_lstm": True, "custom_model": f"{__name__}:CustomGRUModel"})
    policy = worker.get_policy()
    assert policy.is_recurrent
    batch = worker.sample()
    assert batch.state_columns() == ["state_in_0"]
    _assert_unroll_matches_acting(policy, batch)
    info = worker.learn_on_batch(batch)["default_policy"]
    assert np.isfinite(info["learner_stats"]["total_loss"])


def test_the_lstm_wraps_a_conv_encoder():
    """Image observations: the LSTM runs over the conv stack's features."""
    obs_space = gym.spaces.Box(0, 255, (42, 42, 4), np.uint8)
    model = make_model(obs_space, gym.spaces.Discrete(3), 3,
                       {"use_lstm": True, "lstm_cell_size": 16, "lstm_use_prev_action": True,
                        "lstm_use_prev_reward": True})
    obs = torch.randint(0, 255, (2, 5, 42, 42, 4), dtype=torch.uint8)
    inputs = {"obs": obs, "prev_actions": torch.zeros(2, 5, dtype=torch.int64),
              "prev_rewards": torch.zeros(2, 5)}
    state = [torch.stack([s, s]) for s in model.get_initial_state()]
    outputs, values, state_out = model.forward_rnn(inputs, state, torch.tensor([5, 3]))
    assert outputs.shape == (2, 5, 3) and values.shape == (2, 5)
    # the state out of a short sequence is the state after its last real step
    _, _, short_out = model.forward_rnn({k: v[1:, :3] for k, v in inputs.items()},
                                        [s[1:] for s in state], torch.tensor([3]))
    torch.testing.assert_close(state_out[0][1], short_out[0][0])


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3),
                                          gym.spaces.Box(-1.0, 1.0, (2,), np.float32)])
def test_the_lstm_acting_step_equals_a_one_step_unroll(action_space):
    """forward_step (what workers act with) gives forward_rnn's outputs, values and state
    for sequences of length 1, previous actions and rewards included."""
    num_outputs = 3 if isinstance(action_space, gym.spaces.Discrete) else 4
    model = make_model(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), action_space,
                       num_outputs, {**LSTM_MODEL, "lstm_use_prev_action": True,
                                     "lstm_use_prev_reward": True})
    generator = torch.Generator().manual_seed(3)
    obs = torch.randn(5, 4, generator=generator)
    prev_actions = (torch.tensor([0, 2, 1, 1, 0]) if num_outputs == 3
                    else torch.randn(5, 2, generator=generator))
    prev_rewards = torch.randn(5, generator=generator)
    state = [torch.randn(5, 8, generator=generator) for _ in model.get_initial_state()]
    with torch.no_grad():
        outputs, values, state_out = model.forward_step(obs, state, prev_actions,
                                                        prev_rewards)
        expected = model.forward_rnn({"obs": obs[:, None], "prev_actions": prev_actions[:, None],
                                      "prev_rewards": prev_rewards[:, None]},
                                     state, torch.ones(5, dtype=torch.int64))
    torch.testing.assert_close(outputs, expected[0][:, 0])
    torch.testing.assert_close(values, expected[1][:, 0])
    assert len(state_out) == len(expected[2]) == 4
    for got, want in zip(state_out, expected[2]):
        torch.testing.assert_close(got, want)
        assert not torch.equal(got, state[0])

# ---- rollout: state carried per env slot ---------------------------------------------------
def _state_out(policy, row_state, obs, prev_action=None, prev_reward=None) -> list[np.ndarray]:
    _, extras = policy.compute_actions(
        obs[None], explore=False, state=[s[None] for s in row_state],
        prev_actions=None if prev_action is None else np.asarray(prev_action)[None],
        prev_rewards=None if prev_reward is None else np.asarray(prev_reward)[None])
    return [extras[f"state_out_{k}"][0] for k in range(len(row_state))]


@pytest.mark.parametrize("policy_cls", [ImpalaPolicy, ActorCriticPolicy])
def test_each_step_starts_from_the_previous_steps_state_across_sample_calls(policy_cls):
    """With max_seq_len 1 every row records its state input. Within an episode a row's state
    input is the state the policy output at the env's previous step, also across the end
    of one sample() and the start of the next; an episode's first row starts from the
    initial state."""
    worker = _worker(policy_cls, {"max_seq_len": 1, "lstm_use_prev_action": True,
                                  "lstm_use_prev_reward": True})
    policy = worker.get_policy()
    initial = policy.get_initial_state()
    batches = [worker.sample() for _ in range(3)]
    checked_steps = checked_starts = crossings = 0
    last_row: dict[int, dict] = {}  # env index -> its previous row
    for sample_index, batch in enumerate(batches):
        assert batch.num_sequences == batch.count
        rows = list(batch.rows())
        states = [batch[name] for name in batch.state_columns()]
        for env in range(3):
            for j in range(env * 25, (env + 1) * 25):
                row, state = rows[j], [s[j] for s in states]
                previous = last_row.get(env)
                if row["t"] == 0:
                    for s, s0 in zip(state, initial):
                        np.testing.assert_array_equal(s, s0)
                    assert row["prev_actions"] == 0 and row["prev_rewards"] == 0
                    checked_starts += 1
                else:
                    assert previous is not None and previous["eps_id"] == row["eps_id"]
                    expected = _state_out(policy, previous["state"], previous["obs"],
                                          previous["prev_actions"], previous["prev_rewards"])
                    for s, e in zip(state, expected):
                        np.testing.assert_allclose(s, e, rtol=1e-5, atol=1e-6)
                    assert row["prev_actions"] == previous["actions"]
                    assert row["prev_rewards"] == previous["rewards"]
                    checked_steps += 1
                    crossings += j == env * 25 and sample_index > 0
                last_row[env] = {**row, "state": state}
    assert checked_steps > 100 and checked_starts >= 3 and crossings >= 3


def _assert_unroll_matches_acting(policy, batch: SampleBatch) -> None:
    tensors = policy.batch_to_tensors(batch)
    with torch.no_grad():
        outputs, values, _ = SequenceLayout(tensors["seq_lens"]).unroll(policy.model, tensors)
    np.testing.assert_allclose(outputs.numpy(), batch["action_dist_inputs"], atol=1e-5)
    if "vf_preds" in batch:
        np.testing.assert_allclose(values.numpy(), batch["vf_preds"], atol=1e-5)


@pytest.mark.parametrize("prev", [False, True])
def test_fragments_are_cut_into_sequences_that_replay_the_acting_outputs(prev):
    """Fragments are cut into sequences of at most max_seq_len that never span episodes;
    unrolling the model from each sequence's recorded start state reproduces, row by row,
    the outputs the policy acted with."""
    worker = _worker(ActorCriticPolicy, {"lstm_use_prev_action": prev,
                                         "lstm_use_prev_reward": prev})
    batch = worker.sample()
    assert batch.is_sequenced and batch["seq_lens"].max() <= 7
    starts = batch.sequence_starts()
    for a, b in zip(starts[:-1], starts[1:]):
        assert len(set(batch["eps_id"][a:b].tolist())) == 1
        assert np.all(np.diff(batch["t"][a:b]) == 1)
    assert (SampleBatch.PREV_ACTIONS in batch) == prev
    _assert_unroll_matches_acting(worker.get_policy(), batch)


# ---- sequenced batches ------------------------------------------------------------------
def _sequenced(counts: Sequence[int], max_seq_len: int = 3) -> SampleBatch:
    pieces = []
    for eps, count in enumerate(counts):
        pieces.append(chop_into_sequences(SampleBatch(
            obs=np.arange(count, dtype=np.float32)[:, None] + 100 * eps,
            eps_id=np.full(count, eps), state_in_0=np.arange(count, dtype=np.float32)[:, None]
            + 100 * eps), max_seq_len))
    return SampleBatch.concat_samples(pieces)


def test_chop_concat_slice_take_and_split_keep_sequences_whole():
    batch = _sequenced([7, 2, 4])
    assert batch["seq_lens"].tolist() == [3, 3, 1, 2, 3, 1]
    assert batch["state_in_0"][:, 0].tolist() == [0, 3, 6, 100, 200, 203]
    assert batch.count == 13 and batch.num_sequences == 6
    piece = batch.slice(7, 12)
    assert piece["seq_lens"].tolist() == [2, 3] and piece["obs"][0, 0] == 100
    with pytest.raises(ValueError, match="cut a sequence"):
        batch.slice(0, 4)
    taken = batch.take_sequences(np.array([4, 0]))
    assert taken["obs"][:, 0].tolist() == [200, 201, 202, 0, 1, 2]
    assert taken["state_in_0"][:, 0].tolist() == [200, 0]
    with pytest.raises(ValueError, match="take_sequences"):
        batch.take(np.array([0]))
    parts = batch.split_sequences(3)
    assert sum(p.count for p in parts) == 13 and all(p.num_sequences for p in parts)
    assert SampleBatch.concat_samples(parts)["obs"].tolist() == batch["obs"].tolist()
    assert [p.count for p in batch.timeslices(5)] == [3, 4, 5, 1]
    with pytest.raises(ValueError, match="seq_lens sum"):
        SampleBatch(obs=np.zeros(4), seq_lens=np.array([3]), state_in_0=np.zeros((1, 2)))


def test_the_wire_keeps_sequence_columns():
    batch = _sequenced([5, 3])
    decoded = decode(encode(batch))
    assert decoded.is_sequenced and decoded.num_sequences == batch.num_sequences
    for key in batch:
        np.testing.assert_array_equal(decoded[key], batch[key])


def test_frame_packing_keeps_sequence_columns():
    """Frame-stacked image columns go as a frame pack; the sequence columns come back."""
    frames = np.random.default_rng(0).integers(0, 255, (10, 8, 8, 4), dtype=np.uint8)
    batch = chop_into_sequences(SampleBatch(
        obs=frames, new_obs=np.roll(frames, -1, axis=0),
        state_in_0=np.arange(10, dtype=np.float32)[:, None]), 4)
    decoded = decode(encode(batch))
    assert decoded["seq_lens"].tolist() == [4, 4, 2]
    np.testing.assert_array_equal(decoded["obs"], frames)
    np.testing.assert_array_equal(decoded["state_in_0"][:, 0], [0, 4, 8])


# ---- learner --------------------------------------------------------------------------
def _params(model: nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("num_towers", [2, 4])
def test_lstm_impala_update_on_towers_equals_the_one_device_update(num_towers):
    """Towers take whole sequences (unequal shards, gradients weighted by rows): the
    update equals the single-device update on the whole batch."""
    torch.manual_seed(0)
    worker = _worker(ImpalaPolicy, {"lstm_use_prev_action": True})
    batch = SampleBatch.concat_samples([worker.sample() for _ in range(2)])
    assert len(set(batch["seq_lens"].tolist())) > 1  # sequences of several lengths
    reference = worker.get_policy()
    towered = _worker(ImpalaPolicy, {"lstm_use_prev_action": True}).get_policy()
    towered.set_weights(reference.get_weights())
    reference.learn_on_batch(batch)
    towers = TowerSet(towered, [torch.device("cpu")] * num_towers, num_stacks=1)
    towers.load(batch, 0)
    for _ in range(2):
        towers.learn_on_loaded(0)  # num_sgd_iter = 2 on the same stack
    reference.learn_on_batch(batch)
    for a, b in zip(_params(reference.model), _params(towered.model)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for replica in towers.replicas[1:]:
        for a, b in zip(_params(towered.model), _params(replica)):
            np.testing.assert_array_equal(a, b)


# ---- learning a partially observed task ---------------------------------------------------
LEARNING_MODEL = {"fcnet_hiddens": [64], "lstm_cell_size": 64, "max_seq_len": 20}
LEARNING_CONFIGS = {
    "impala": (ImpalaPolicy, {"num_envs_per_worker": 8, "rollout_fragment_length": 20,
                              "lr": 1e-3, "opt_type": "adam", "entropy_coeff": 0.01}),
    "a2c": (ActorCriticPolicy, {"num_envs_per_worker": 8, "rollout_fragment_length": 16,
                                "lr": 3e-3, "grad_clip": 0.5, "entropy_coeff": 0.01,
                                "lambda": 0.95}),
}


def _train_stateless(algo: str, use_lstm: bool, budget: int, sgd_iters: int) -> tuple[int, float]:
    """Sample and learn (``sgd_iters`` updates per batch) until the last 20 episodes average
    150 or ``budget`` env steps pass: ``(env steps, mean return of the last 20)``."""
    policy_cls, config = LEARNING_CONFIGS[algo]
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models: extra threads only fight over 2 loaded cores
    worker = RolloutWorker(STATELESS_CARTPOLE_ID, policy_cls, {
        **config, "seed": 0, "model": {**LEARNING_MODEL, "use_lstm": use_lstm}})
    steps, returns = 0, []
    while steps < budget:
        batch = worker.sample()
        steps += batch.count
        for _ in range(sgd_iters):
            worker.learn_on_batch(batch)
        returns += worker.get_metrics().episode_rewards
        if len(returns) >= 20 and np.mean(returns[-20:]) >= 150.0:
            break
    worker.stop()
    torch.set_num_threads(threads)
    return steps, float(np.mean(returns[-20:]))


@pytest.mark.slow
@pytest.mark.parametrize("algo,sgd_iters", [("impala", 2), ("a2c", 1)])
def test_lstm_learns_stateless_cartpole_where_feed_forward_cannot(algo, sgd_iters):
    """With the velocities hidden, the LSTM policy reaches a mean return of 150 within the
    budget (IMPALA 25k, A2C 23k env steps here, seed 0); the same settings without the
    LSTM stay far below in the same budget."""
    budget = 80_000
    steps, lstm_return = _train_stateless(algo, True, budget, sgd_iters)
    assert lstm_return >= 150.0, f"{algo} LSTM: {lstm_return:.1f} after {steps} env steps"
    _, ff_return = _train_stateless(algo, False, steps, sgd_iters)
    assert ff_return < 75.0, f"{algo} feed-forward reached {ff_return:.1f} in {steps} steps"


# ---- serial mode, --restore and evaluate, through the CLI ---------------------------------


RESTORED_STEPS = 2000
"""How far the restored run goes, bounded by env steps (``min_iter_time_s`` 0), so the
number of its 160-row Adam updates (lr 0.001, at most ~4 lr per weight each) is about a
dozen however fast the machine: its LSTM weights end within :data:`RESTORED_CLOSE` of the
checkpoint's, where freshly initialized ones (uniform within +-1/8 for 64 cells) differ
from them by more than 0.2 (measured: 0.22-0.25 per tensor)."""
RESTORED_CLOSE = 0.1


def _greedy_returns(path, episodes: int, seed: int) -> list[float]:
    """Greedy returns of the checkpoint at ``path``, one episode at a time (episode k seeded
    ``seed + k``), the LSTM state, previous action and reward carried step to step: an
    independent reference for ``actorrl evaluate``."""
    from actorrl.envs import make_env
    from actorrl.experiment.evaluate import load_checkpoint_policy

    loaded = load_checkpoint_policy(path)
    policy = loaded.policy
    # The checkpoint's weights set here, not trusted to the loader under test.
    policy.set_weights(read_checkpoint(path)[1]["policies"]["default_policy"]["weights"])
    returns = []
    for k in range(episodes):
        env = make_env(loaded.env, loaded.env_config)
        obs, _ = env.reset(seed=seed + k)
        state = [np.asarray(s)[None] for s in policy.get_initial_state()]
        prev_action, prev_reward, total, done = np.zeros(1, np.int64), 0.0, 0.0, False
        while not done:
            actions, extras = policy.compute_actions(
                loaded.observe([obs]), explore=False, state=state, prev_actions=prev_action,
                prev_rewards=np.array([prev_reward], np.float32))
            state = [extras[f"state_out_{i}"] for i in range(len(state))]
            prev_action = actions
            obs, prev_reward, terminated, truncated, _ = env.step(int(actions[0]))
            total += float(prev_reward)
            done = terminated or truncated
        env.close()
        returns.append(total)
    return returns


@pytest.mark.process
def test_an_lstm_run_trains_serially_restores_in_processes_and_evaluates(tmp_path):
    """The StatelessCartPole LSTM example trains in serial mode, is continued with
    ``--restore`` in process mode (its LSTM weights loaded: a short continued run ends next
    to the checkpoint's weights, not at fresh ones; its counters
    going on, its LSTM trained further) and its checkpoint evaluates greedily, state carried
    per episode (the same returns as a reference rollout of the same checkpoint)."""
    example = str(REPO / "examples" / "stateless-cartpole-impala-lstm.yaml")
    small = ["--set", "min_iter_time_s=0.5", "--stop-time", "120"]
    first = run_cli(["train", "--config", example, "--serial", "--stop-timesteps", "2000",
                     *small, "--output", str(tmp_path / "first")], cwd=tmp_path,
                    timeout_s=240)
    assert first.returncode == 0, first.stderr[-3000:]
    [run] = run_dirs(tmp_path / "first")
    _, state = read_checkpoint(run)
    saved = state["policies"]["default_policy"]["weights"]
    lstm_keys = [key for key in saved if "lstm" in key]
    assert lstm_keys, sorted(saved)

    target = state["timesteps_total"] + RESTORED_STEPS
    second = run_cli(["train", "--restore", str(run), "--stop-timesteps", str(target),
                      "--set", "min_iter_time_s=0", "--stop-time", "120",
                      "--output", str(tmp_path / "second")], cwd=tmp_path, timeout_s=240)
    assert second.returncode == 0, second.stderr[-3000:]
    [resumed] = run_dirs(tmp_path / "second")
    results = read_jsonl(resumed / "result.jsonl")
    assert results[0]["training_iteration"] == state["iteration"] + 1
    assert results[-1]["timesteps_total"] >= target
    assert json.loads((resumed / "config.json").read_text())["policy"]["model"]["use_lstm"]
    _, final = read_checkpoint(resumed)
    trained = final["policies"]["default_policy"]["weights"]
    moved = {key: float(np.abs(np.asarray(trained[key]) - np.asarray(saved[key])).max())
             for key in lstm_keys}
    assert max(moved.values()) < RESTORED_CLOSE, f"not restored from the checkpoint: {moved}"
    assert max(moved.values()) > 0, "the restored LSTM was not trained further"

    evaluated = run_cli(["evaluate", str(resumed), "--episodes", "2", "--seed", "1", "--json"],
                        cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout)
    assert report["episodes"] == 2 and report["env"] == "actorrl/StatelessCartPole-v1", report
    # (evaluate lists returns in the order its lockstep episodes end)
    assert sorted(report["episode_rewards"]) == sorted(_greedy_returns(resumed, 2, 1)), report
