"""PettingZoo envs through actorrl's multi-agent interface (the ``pettingzoo`` extra):
turn-based AEC games (only the agent to move acts, rewards credited to each player's
moves, the env's action masks honoured by learning and random policies) and Parallel envs
(every agent acts each step; masks from infos). Skipped outside CI when the extra is not
installed (:mod:`tests.helpers.extras`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from actorrl.data.batch import SampleBatch
from actorrl.envs import ALL_AGENTS, MultiAgentEnv, make_env
from actorrl.envs.pettingzoo_env import (
    LEARNER_VS_RANDOM,
    AECPettingZooEnv,
    ParallelPettingZooEnv,
    is_pettingzoo_spec,
)
from actorrl.policy.action_masking import ActionMaskLayout
from actorrl.rollout import RolloutWorker
from tests.helpers.extras import installed

pytestmark = pytest.mark.skipif(not installed("pettingzoo.classic.connect_four_v3"),
                                reason="the pettingzoo extra is not installed")

CONNECT_FOUR = "pettingzoo.classic.connect_four_v3"
TIC_TAC_TOE = "pettingzoo.classic.tictactoe_v3"


def test_env_specs_naming_pettingzoo_modules_are_recognised():
    assert is_pettingzoo_spec(CONNECT_FOUR)
    assert is_pettingzoo_spec("pettingzoo:mpe2.simple_spread_v3")
    assert not is_pettingzoo_spec("CartPole-v1")
    assert not is_pettingzoo_spec("tests.test_pettingzoo:masked_parallel")


def test_an_unknown_pettingzoo_module_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot import 'pettingzoo.classic.nope_v1'"):
        make_env("pettingzoo.classic.nope_v1")


def test_connect_four_is_a_turn_based_env_with_actorrl_action_masks():
    env = make_env(CONNECT_FOUR)
    assert isinstance(env, AECPettingZooEnv) and isinstance(env, MultiAgentEnv)
    assert env.possible_agents == ["player_0", "player_1"]
    space = env.observation_spaces["player_0"]
    assert set(space.spaces) == {"action_mask", "observations"}
    assert space["observations"].shape == (6, 7, 2)
    layout = ActionMaskLayout.of(space)
    assert layout is not None and layout.mask_size == 7
    obs, _ = env.reset(seed=0)
    assert list(obs) == ["player_0"]  # only the player to move observes (and acts)
    # player_0 stacks column 0 while player_1 plays column 1: player_0 wins on its 4th move
    for _ in range(3):
        obs, rewards, terms, truncs, _ = env.step({"player_0": 0})
        assert list(obs) == ["player_1"] and not terms[ALL_AGENTS]
        obs, rewards, terms, truncs, _ = env.step({"player_1": 1})
        assert list(obs) == ["player_0"]
    obs, rewards, terms, truncs, _ = env.step({"player_0": 0})
    assert set(obs) == {"player_0", "player_1"}  # both final observations
    assert rewards == {"player_0": 1.0, "player_1": -1.0}
    assert terms == {"player_0": True, "player_1": True, ALL_AGENTS: True}
    assert truncs[ALL_AGENTS] is False
    with pytest.raises(ValueError, match="it is the turn of 'player_1'"):
        env.reset(seed=1)
        env.step({"player_0": 0})
        env.step({"player_0": 0})


def _learner_vs_random(policy: str, env: str = CONNECT_FOUR, **config: Any) -> RolloutWorker:
    return RolloutWorker(env, policy, {
        "num_envs_per_worker": 3, "rollout_fragment_length": 60,
        "batch_mode": "complete_episodes", "multiagent": LEARNER_VS_RANDOM, "seed": 3,
        "model": {"fcnet_hiddens": [32]}, **config})


def _assert_legal(worker: RolloutWorker, batch: SampleBatch, pid: str) -> None:
    layout = ActionMaskLayout.of(worker.get_policy(pid).observation_space)
    legal = layout.legal(batch[SampleBatch.OBS])
    assert not legal.all()  # some moves were illegal somewhere
    assert legal[np.arange(batch.count), batch[SampleBatch.ACTIONS]].all()


@pytest.mark.parametrize("policy", ["actorrl.policy.ppo:PPOPolicy",
                                    "actorrl.policy.dqn:DQNPolicy"])
def test_a_learner_plays_a_random_opponent_with_legal_moves_only(policy):
    """Whole games: one move per env step, players alternating, every move legal (an
    illegal one would end the game with PettingZoo's penalty), zero-sum final rewards."""
    explore = {"exploration_config": {"initial_epsilon": 1.0, "final_epsilon": 1.0}}
    worker = _learner_vs_random(policy, **(explore if "dqn" in policy else {}))
    batch = worker.sample()
    learner, random = batch.policy_batches["learner"], batch.policy_batches["random"]
    assert learner.count + random.count == batch.count  # one move per env step
    for pid, rows in (("learner", learner), ("random", random)):
        _assert_legal(worker, rows, pid)
    games = int(learner[SampleBatch.TERMINATEDS].sum())
    assert games >= 3 and games == int(random[SampleBatch.TERMINATEDS].sum())
    # the first player moves first: it has as many moves as the second, or one more
    assert 0 <= learner.count - random.count <= games
    end_rewards = learner[SampleBatch.REWARDS][learner[SampleBatch.TERMINATEDS]]
    assert set(end_rewards.tolist()) <= {-1.0, 0.0, 1.0}
    assert (learner[SampleBatch.REWARDS][~learner[SampleBatch.TERMINATEDS]] == 0).all()
    assert end_rewards.sum() == -random[SampleBatch.REWARDS].sum()
    metrics = worker.get_metrics()
    assert len(metrics.episode_rewards) == games
    assert all(reward == 0.0 for reward in metrics.episode_rewards)  # zero-sum


def player_1_learns(agent_id: str) -> str:
    """Tic-tac-toe's first player (``player_1``) is the learner."""
    return "learner" if agent_id == "player_1" else "random"


def test_tic_tac_toe_trains_with_legal_moves():
    worker = _learner_vs_random("actorrl.policy.impala:ImpalaPolicy", TIC_TAC_TOE,
                                multiagent={**LEARNER_VS_RANDOM, "policy_mapping_fn":
                                            "tests.test_pettingzoo:player_1_learns"})
    batch = worker.sample()
    _assert_legal(worker, batch.policy_batches["learner"], "learner")
    info = worker.learn_on_batch(batch)
    stats = info["learner"]["learner_stats"]
    assert np.isfinite(stats["total_loss"])
    assert "random" not in info  # not in policies_to_train


def test_a_parallel_env_steps_every_agent_and_truncates_for_everybody():
    env = make_env("pettingzoo.classic.rps_v2", {"num_actions": 3, "max_cycles": 4})
    assert isinstance(env, ParallelPettingZooEnv)
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"player_0", "player_1"}
    for _ in range(3):
        obs, rewards, terms, truncs, _ = env.step({"player_0": 0, "player_1": 2})
        assert rewards == {"player_0": 1.0, "player_1": -1.0}  # rock beats scissors
        assert not truncs[ALL_AGENTS]
    obs, rewards, terms, truncs, _ = env.step({"player_0": 1, "player_1": 1})
    assert truncs[ALL_AGENTS] and not terms[ALL_AGENTS]



def masked_parallel(_config: Any) -> Any:
    """A PettingZoo ParallelEnv whose infos carry each agent's action mask (factory)."""
    from pettingzoo import ParallelEnv

    class MaskedGuess(ParallelEnv):
        metadata = {"name": "masked_guess_v0"}
        possible_agents = ["a", "b"]

        def __init__(self) -> None:
            self.rng = np.random.default_rng(0)
            self.t = 0
            self.masks: dict[str, np.ndarray] = {}

        def observation_space(self, agent: str) -> gym.Space:
            return gym.spaces.Box(0.0, 1.0, (2,), np.float32)

        def action_space(self, agent: str) -> gym.Space:
            return gym.spaces.Discrete(5)

        def _infos(self) -> dict[str, dict[str, Any]]:
            self.masks = {}
            for agent in self.agents:
                mask = np.zeros(5, np.int8)
                mask[self.rng.choice(5, size=2, replace=False)] = 1
                self.masks[agent] = mask
            return {agent: {"action_mask": self.masks[agent]} for agent in self.agents}

        def _obs(self) -> dict[str, np.ndarray]:
            return {a: np.full(2, self.t / 10, np.float32) for a in self.agents}

        def reset(self, seed: int | None = None, options: dict | None = None):
            self.agents = list(self.possible_agents)
            self.t = 0
            return self._obs(), self._infos()

        def step(self, actions: dict[str, Any]):
            for agent, action in actions.items():
                if not self.masks[agent][int(action)]:
                    raise ValueError(f"{agent} took masked action {action}")
            self.t += 1
            done = self.t >= 10
            rewards = {a: 1.0 for a in self.agents}
            terms = {a: False for a in self.agents}
            truncs = {a: done for a in self.agents}
            obs, infos = self._obs(), self._infos()
            if done:
                self.agents = []
            return obs, rewards, terms, truncs, infos

    return MaskedGuess()


def test_a_factory_returning_a_parallel_env_with_masks_in_infos():
    """The factory's env is wrapped; its info masks become the action-mask convention, so
    every sampled action is legal (the env raises otherwise); episodes truncate at 10."""
    env = make_env("tests.test_pettingzoo:masked_parallel")
    assert isinstance(env, ParallelPettingZooEnv)
    assert set(env.observation_spaces["a"].spaces) == {"action_mask", "observations"}
    worker = RolloutWorker("tests.test_pettingzoo:masked_parallel",
                           "actorrl.policy.ppo:PPOPolicy", {
                               "num_envs_per_worker": 2, "rollout_fragment_length": 20,
                               "multiagent": {"policies": {"shared": [None, None, None, {}]}},
                               "seed": 1, "model": {"fcnet_hiddens": [8]}})
    batch = worker.sample().policy_batches["shared"]
    assert batch.count == 2 * 20 * 2  # both agents act every step
    _assert_legal(worker, batch, "shared")
    assert batch[SampleBatch.TRUNCATEDS].sum() == 2 * 2 * 2  # 2 episodes x 2 envs x 2 agents


def _multi_agent_checkpoint(tmp_path) -> str:
    """A PPO checkpoint of connect four against the random opponent whose learner always
    plays column 0 when it can (its policy head's bias), written as training writes them."""
    import torch

    from actorrl.algorithms import get_algorithm
    from actorrl.algorithms.checkpoints import write_checkpoint
    from actorrl.config.algorithm import load_config

    spec = get_algorithm("ppo")
    config = load_config(spec.config_cls, {
        "env": CONNECT_FOUR, "multiagent": LEARNER_VS_RANDOM, "num_workers": 0,
        "model": {"fcnet_hiddens": [8], "conv_filters": [[4, [3, 3], 2], [8, [3, 4], 1]]}})
    worker = RolloutWorker(CONNECT_FOUR, spec.policy, config.to_dict(), seed=0)
    learner = worker.get_policy("learner")
    with torch.no_grad():
        head = learner.model.inner.policy_head
        head.weight.zero_()
        head.bias.copy_(torch.tensor([10.0, 0, 0, 0, 0, 0, 0]))
    weights = worker.get_weights()
    worker.stop()
    state = {"algorithm": "ppo", "config": config.to_dict(), "iteration": 1,
             "policies": {pid: {"weights": w} for pid, w in weights.items()},
             "time_total_s": 1.0, "timesteps_total": 100, "num_steps_trained": 100,
             "filters": {}}
    return str(write_checkpoint(tmp_path / "checkpoints", state, {}))


def test_evaluate_plays_a_multi_agent_checkpoint_with_every_policy(tmp_path):
    """``actorrl evaluate`` on a multi-agent checkpoint: whole games with the saved
    policies, each policy's returns reported; a fixed seed repeats the games exactly."""
    from actorrl.experiment.evaluate import evaluate_checkpoint

    folder = _multi_agent_checkpoint(tmp_path)
    result = evaluate_checkpoint(folder, 24, seed=4)
    again = evaluate_checkpoint(folder, 24, seed=4)
    assert result.episodes == 24 and result.episode_rewards == [0.0] * 24  # zero-sum
    learner, random = result.policy_rewards["learner"], result.policy_rewards["random"]
    assert len(learner) == len(random) == 24
    assert set(learner) <= {-1.0, 0.0, 1.0}
    assert [a + b for a, b in zip(learner, random)] == [0.0] * 24
    # stacking column 0 beats a random player most of the time (random vs random: ~+0.1)
    assert result.policy_reward_mean["learner"] > 0.3
    assert again.policy_rewards == result.policy_rewards
    assert "policy learner mean" in result.describe()


def test_the_plain_progress_line_shows_each_policys_return():
    """A zero-sum game's episode totals are all 0: the line shows each policy's mean."""
    from actorrl.experiment.progress import plain_line

    line = plain_line({"training_iteration": 3, "episode_reward_mean": 0.0,
                       "policy_reward_mean": {"random": -0.5, "learner": 0.5}}, {}, 1.0, None)
    assert "reward_mean=0.00" in line
    assert line.index("policy/learner=0.50") < line.index("policy/random=-0.50")


def test_the_live_panel_shows_each_policys_return():
    from rich.console import Console

    from actorrl.experiment.progress import RichProgress

    panel = RichProgress()
    panel.update({"training_iteration": 2, "episode_reward_mean": 0.0, "timesteps_total": 8,
                  "policy_reward_mean": {"learner": 0.75, "random": -0.75}}, {}, 0.0)
    console = Console(record=True, width=100)
    console.print(panel)
    text = console.export_text()
    assert "policy learner" in text and "0.75" in text and "-0.75" in text


@pytest.mark.parametrize("algorithm", ["ppo", "apex"])
async def test_connect_four_trains_through_the_pipeline(algorithm, tmp_path):
    """Workers and learner as processes (PPO's and Ape-X's pipelines): the learner trains
    and both players' returns are reported, summing to zero."""
    from actorrl.algorithms import Trainer, get_algorithm
    from actorrl.config.algorithm import load_config
    from actorrl.runtime import Driver

    spec = get_algorithm(algorithm)
    overrides = ({"learning_starts": 200, "timesteps_per_iteration": 200}
                 if algorithm == "apex" else {"train_batch_size": 400,
                                              "sgd_minibatch_size": 100, "num_sgd_iter": 2})
    config = load_config(spec.config_cls, {
        "env": CONNECT_FOUR, "multiagent": LEARNER_VS_RANDOM, "num_workers": 1, "seed": 0,
        "num_envs_per_worker": 4, "min_iter_time_s": 0.3, **overrides})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            for _ in range(30):
                result = await trainer.train()
                if result["num_steps_trained"] > 0 and len(result["policy_reward_mean"]) == 2:
                    break
        finally:
            await trainer.stop()
    assert result["num_steps_trained"] > 0
    rewards = result["policy_reward_mean"]
    assert set(rewards) == {"learner", "random"}
    assert rewards["learner"] == pytest.approx(-rewards["random"])  # zero-sum
