"""RLlib's other spellings of actorrl's settings: the one table of aliases, the keys that
are accepted and ignored, and the stop keys of RLlib's result layouts.

RLlib renamed many config keys between 0.7 and 2.x (``num_workers`` became
``num_rollout_workers``, then ``num_env_runners``), nested some (``replay_buffer_config:
{capacity}``, Ape-X's ``optimizer: {num_replay_buffer_shards}``) and added switches that
change how RLlib is organised but not what it computes (``framework``,
``enable_rl_module_and_learner``). A tuned example of any era should load as the settings it
means:

* :data:`ALIASES`: every other spelling of a setting actorrl has (``RLlib`` names the
  versions that wrote it). An alias is a first-class spelling, read silently as its
  canonical key; an alias and its canonical key (or two aliases of one key) given with
  different values are refused, naming both. Only the seeds' renamed keys
  (``deprecated=True``) warn with a ``DeprecationWarning``, as RLlib did.
* :data:`IGNORED`: keys that change nothing actorrl computes, at the values that mean
  "off" (``num_atoms: 1``, ``noisy: false``...): accepted with one
  :class:`RLlibKeyWarning` line each, naming the key and why it is ignored. A value that
  would change learning (``num_atoms: 51``) is refused, saying why and what to do.
* Keys whose meaning depends on other settings are translated by functions here:
  the old DQN exploration keys (``exploration_fraction`` x ``schedule_max_timesteps``),
  ``final_prioritized_replay_beta``, top-level ``clip_rewards`` and Atari
  ``env_config.frameskip`` (both need the env id).
* :data:`STOP_ALIASES`: RLlib 2.x result paths of stop keys
  (``env_runners/episode_return_mean``) -> actorrl's result keys.

:func:`resolve_rllib_keys` applies all of it to one layer of input (a config file, a
``--set``, a ``load_config`` mapping), and to the ``evaluation_config`` inside it.
Standard library only (``actorrl.algorithms.stop`` imports it).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any


class RLlibKeyWarning(UserWarning):
    """An RLlib key that changes nothing actorrl computes was accepted and ignored."""


# ---- aliases ----------------------------------------------------------------------------
PRIORITIZED_BUFFERS = ("MultiAgentPrioritizedReplayBuffer", "PrioritizedReplayBuffer",
                       "PrioritizedEpisodeReplayBuffer",
                       "MultiAgentPrioritizedEpisodeReplayBuffer")
"""RLlib replay buffer classes (``replay_buffer_config.type``) that prioritize."""
UNIFORM_BUFFERS = ("MultiAgentReplayBuffer", "ReplayBuffer", "EpisodeReplayBuffer",
                   "MultiAgentEpisodeReplayBuffer")
"""RLlib replay buffer classes that replay uniformly."""


def _buffer_type(value: Any) -> bool:
    """``replay_buffer_config.type`` -> ``prioritized_replay``."""
    name = str(value).rsplit(".", 1)[-1] if isinstance(value, str) else None
    if name in PRIORITIZED_BUFFERS:
        return True
    if name in UNIFORM_BUFFERS:
        return False
    raise ValueError(
        f"replay_buffer_config.type {value!r} is not a buffer actorrl has: its replay "
        f"shards are proportional prioritized ({', '.join(PRIORITIZED_BUFFERS[:2])}; "
        f"prioritized_replay: true) or uniform ({', '.join(UNIFORM_BUFFERS[:2])}; "
        "prioritized_replay: false): use one of those types")


@dataclass(frozen=True)
class Alias:
    """``key`` (flat, or ``parent.sub`` inside an RLlib sub-mapping) sets ``canonical``."""

    key: str
    canonical: str
    """The flat actorrl key it sets (FLAT_KEYS' name, or ``section.sub`` for a sub-key)."""
    rllib: str
    """The RLlib versions that wrote ``key``."""
    convert: Callable[[Any], Any] | None = None
    """Value translation (``ValueError`` with the message when a value has no equal)."""
    deprecated: bool = False
    """A name the seeds had renamed already: read with a ``DeprecationWarning``."""
    note: str = ""
    """What the config reference says beyond "same setting"."""


ALIASES: tuple[Alias, ...] = (
    # RLlib 0.6-1.x's gym Monitor switch: videos (and stats) of every episode in the
    # trial's log dir; read as record_env (its 1.x successor), which records evaluation
    # episodes to <results>/videos/ (a path value is a folder, as record_env's).
    Alias("monitor", "record_env", "0.6-1.x",
          note="videos of the evaluation episodes, as record_env"),
    # The seeds' renamed keys (RLlib 0.7 names, renamed in 0.8): deprecated, as in RLlib.
    Alias("sample_batch_size", "rollout_fragment_length", "0.7-0.8", deprecated=True),
    Alias("num_data_loader_buffers", "num_multi_gpu_tower_stacks", "0.7-1.x",
          deprecated=True),
    # RLlib 2.0-2.9: AlgorithmConfig.rollouts(num_rollout_workers=...).
    Alias("num_rollout_workers", "num_workers", "2.0-2.9"),
    # RLlib 2.10+: AlgorithmConfig.env_runners(...).
    Alias("num_env_runners", "num_workers", "2.10+"),
    Alias("num_envs_per_env_runner", "num_envs_per_worker", "2.10+"),
    Alias("num_cpus_per_env_runner", "num_cpus_per_worker", "2.10+"),
    Alias("evaluation_num_env_runners", "evaluation_num_workers", "2.10+"),
    # An RLlib master spelling of num_gpus (its multi-agent-cartpole-appo.yaml, 1b02395).
    Alias("num_accs", "num_gpus", "master 2023"),
    Alias("_fake_accs", "_fake_gpus", "master 2023"),
    Alias("num_multi_acc_tower_stacks", "num_multi_gpu_tower_stacks", "master 2023"),
    # RLlib 2.10+ (AlgorithmConfig.training(minibatch_size=...)).
    Alias("minibatch_size", "sgd_minibatch_size", "2.10+"),
    # RLlib 2.5-2.9's learner API: IMPALA/APPO's clip by global norm.
    Alias("grad_clip_by_global_norm", "grad_clip", "2.5-2.9"),
    # RLlib 2.x (AlgorithmConfig.resources(num_cpus_for_local_worker=...)).
    Alias("num_cpus_for_local_worker", "num_cpus_for_driver", "2.0-2.9"),
    # RLlib 1.x names of the reporting keys (renamed *_per_iteration in 2.0).
    Alias("min_sample_timesteps_per_reporting", "timesteps_per_iteration", "1.9-1.13"),
    # RLlib 2.x (AlgorithmConfig.reporting(metrics_num_episodes_for_smoothing=...)).
    Alias("metrics_num_episodes_for_smoothing", "metrics_smoothing_episodes", "2.0+"),
    # RLlib 0.8-1.x DQN: the exploration settings' mapping before exploration_config.
    Alias("exploration", "exploration_config", "0.8-1.x (pong-dqn)"),
    # RLlib 1.x (<= 1.10): evaluation length in episodes.
    Alias("evaluation_num_episodes", "evaluation_duration", "0.8-1.10",
          note="episodes (evaluation_duration_unit's default)"),
    # RLlib 0.8-1.x SAC: its networks' settings (2.x: q_model_config, policy_model_config).
    Alias("Q_model", "q_model_config", "0.8-1.x (SAC)"),
    Alias("policy_model", "policy_model_config", "0.8-1.x (SAC)"),
    # RLlib 2.1+ (2.0: replay_buffer_config.learning_starts).
    Alias("num_steps_sampled_before_learning_starts", "learning_starts", "2.1+"),
    # RLlib 2.0+ (AlgorithmConfig.reporting()).
    Alias("min_sample_timesteps_per_iteration", "timesteps_per_iteration", "2.0+"),
    Alias("min_time_s_per_iteration", "min_iter_time_s", "2.0+"),
    # RLlib 1.x (1.9-1.13), renamed min_time_s_per_iteration in 2.0.
    Alias("min_time_s_per_reporting", "min_iter_time_s", "1.9-1.13"),
    # RLlib 2.10+ (AlgorithmConfig.training(num_epochs=...)), PPO's and APPO's passes.
    Alias("num_epochs", "num_sgd_iter", "2.10+"),
    # RLlib 2.10+ with num_learners 0 or 1: the per-learner batch is the batch.
    Alias("train_batch_size_per_learner", "train_batch_size", "2.10+",
          note="with num_learners 0 or 1, the whole batch"),
    # RLlib 1.12-2.x: the replay buffer's settings in one mapping.
    Alias("replay_buffer_config.capacity", "buffer_size", "1.12+"),
    Alias("replay_buffer_config.type", "prioritized_replay", "1.12+", convert=_buffer_type,
          note="Prioritized* types: true; MultiAgentReplayBuffer, ReplayBuffer: false; "
               "others refused"),
    Alias("replay_buffer_config.prioritized_replay", "prioritized_replay", "1.12-1.13"),
    Alias("replay_buffer_config.prioritized_replay_alpha", "prioritized_replay_alpha",
          "1.12+"),
    Alias("replay_buffer_config.prioritized_replay_beta", "prioritized_replay_beta",
          "1.12+"),
    Alias("replay_buffer_config.prioritized_replay_eps", "prioritized_replay_eps", "1.12+"),
    Alias("replay_buffer_config.learning_starts", "learning_starts", "1.13-2.0"),
    Alias("replay_buffer_config.worker_side_prioritization", "worker_side_prioritization",
          "1.13+"),
    # RLlib 0.6-1.x (and Ape-X's 2.x examples): the sample optimizer's settings.
    Alias("optimizer.num_replay_buffer_shards", "num_replay_buffer_shards", "0.6+"),
    Alias("optimizer.max_weight_sync_delay", "max_weight_sync_delay", "0.6-1.x"),
    Alias("optimizer.debug", "debug", "0.6-1.x"),
    Alias("optimizer.grads_per_step", "grads_per_step", "0.6-0.8 (A3C)"),
    # RLlib 0.6-0.8 DQN/Ape-X: a linear epsilon over exploration_fraction *
    # schedule_max_timesteps steps, from 1.0 to exploration_final_eps (see
    # _old_exploration: the two are multiplied).
    Alias("exploration_final_eps", "exploration_config.final_epsilon", "0.6-0.8"),
    Alias("exploration_fraction", "exploration_config.epsilon_timesteps", "0.6-0.8",
          note="times schedule_max_timesteps (RLlib's defaults 0.1 and 100000)"),
    Alias("schedule_max_timesteps", "exploration_config.epsilon_timesteps", "0.6-0.8",
          note="times exploration_fraction"),
)
"""Every other RLlib spelling of an actorrl setting (see the module docstring)."""

RLLIB_CLASSES: dict[str, str] = {
    # RLlib 0.8-2.8, then 2.9+: its example multi-agent env (tuned multi-agent-cartpole-*).
    "ray.rllib.examples.env.multi_agent.MultiAgentCartPole":
        "actorrl.envs.custom.multi_agent:MultiAgentCartPole",
    "ray.rllib.examples.envs.classes.multi_agent.MultiAgentCartPole":
        "actorrl.envs.custom.multi_agent:MultiAgentCartPole",
    # RLlib 1.x-2.x: the example policy_mapping_fn class its files name as {type: ...}.
    "ray.rllib.examples.multi_agent_and_self_play.policy_mapping_fn.PolicyMappingFn":
        "actorrl.envs.custom.multi_agent:policy_p_agent_id",
    # RLlib 0.8-2.8, then 2.9+: its example envs (memory-leak tests, LSTM examples).
    **{f"ray.rllib.examples.{home}.{module}.{name}": f"actorrl.envs.custom.rllib_examples:{name}"
       for home in ("env", "envs.classes")
       for module, name in (("random_env", "RandomEnv"),
                            ("random_env", "RandomLargeObsSpaceEnv"),
                            ("repeat_after_me_env", "RepeatAfterMeEnv"))},
}
"""RLlib's example classes that its tuned files name (``env``,
``multiagent.policy_mapping_fn``) -> actorrl's equal (same behaviour, same agent ids)."""

ALIAS_BY_KEY: dict[str, Alias] = {a.key: a for a in ALIASES}
PARENTS = ("replay_buffer_config", "optimizer")
"""RLlib sub-mappings whose keys are read one by one (``parent.sub`` in the tables)."""
OLD_EXPLORATION_DEFAULTS = {"exploration_fraction": 0.1, "schedule_max_timesteps": 100_000}
"""RLlib 0.6-0.8 DQN's defaults of the two keys that make ``epsilon_timesteps``."""


# ---- accepted and ignored ---------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    """Equal, and not merely as a bool against a number (``True`` is not ``1`` here)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda value: any(_same(value, x) for x in values)


def _zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _any(value: Any) -> bool:
    return True


@dataclass(frozen=True)
class Ignored:
    """``key`` changes nothing actorrl computes when ``off(value)``: accepted with one
    warning (``why``); other values are refused (``refused``: why, and what to do)."""

    key: str
    rllib: str
    off: Callable[[Any], bool]
    off_text: str
    """The accepted values, as the config reference shows them."""
    why: str
    refused: str = ""
    silent: Callable[[Any], bool] = lambda value: False
    """Values accepted without a warning (``framework: torch``)."""


_NEW_STACK = ("RLlib's switch between its two API stacks; actorrl has one, and the "
              "file's other settings apply unchanged")
_TORCH = "actorrl runs torch; the file's other settings apply unchanged"

IGNORED: tuple[Ignored, ...] = (
    Ignored("framework", "0.8+", _is("torch", "tf", "tf2", "tfe"), "torch, tf, tf2, tfe",
            _TORCH, "actorrl runs torch; set framework: torch (or drop it)",
            silent=_is("torch")),
    Ignored("use_pytorch", "0.8", _is(True, False), "true, false", _TORCH,
            "use_pytorch must be true or false (actorrl runs torch)"),
    Ignored("eager", "0.8-1.x", _is(True, False), "true, false", _TORCH,
            "eager must be true or false"),
    Ignored("eager_tracing", "0.8+", _is(True, False), "true, false", _TORCH,
            "eager_tracing must be true or false"),
    Ignored("_enable_rl_module_api", "2.5-2.9", _is(True, False), "true, false", _NEW_STACK,
            "_enable_rl_module_api must be true or false"),
    Ignored("_enable_learner_api", "2.5-2.9", _is(True, False), "true, false", _NEW_STACK,
            "_enable_learner_api must be true or false"),
    Ignored("_enable_new_api_stack", "2.8-2.9", _is(True, False), "true, false", _NEW_STACK,
            "_enable_new_api_stack must be true or false"),
    Ignored("enable_rl_module_and_learner", "2.10+", _is(True, False), "true, false",
            _NEW_STACK, "enable_rl_module_and_learner must be true or false"),
    Ignored("enable_env_runner_and_connector_v2", "2.10+", _is(True, False), "true, false",
            _NEW_STACK, "enable_env_runner_and_connector_v2 must be true or false"),
    Ignored("num_learner_workers", "2.5-2.9", _is(0, 1), "0, 1",
            "one learner, as actorrl's learner process (num_gpus sets its GPUs)",
            "actorrl trains on one learner process (its towers: num_gpus); set "
            "num_learner_workers: 0"),
    Ignored("num_learners", "2.10+", _is(0, 1), "0, 1",
            "one learner, as actorrl's learner process (num_gpus sets its GPUs)",
            "actorrl trains on one learner process (its towers: num_gpus); set "
            "num_learners: 0"),
    Ignored("num_gpus_per_learner_worker", "2.5-2.9", _zero, "0",
            "no learner GPUs (actorrl's are num_gpus)",
            "set num_gpus: N (the learner's GPUs) instead of num_gpus_per_learner_worker"),
    Ignored("num_gpus_per_learner", "2.10+", _zero, "0",
            "no learner GPUs (actorrl's are num_gpus)",
            "set num_gpus: N (the learner's GPUs) instead of num_gpus_per_learner"),
    Ignored("num_gpus_per_worker", "0.6-2.9", _zero, "0", "rollout workers use no GPU",
            "actorrl's rollout workers run on CPUs only (num_gpus is the learner's); set "
            "num_gpus_per_worker: 0"),
    Ignored("num_gpus_per_env_runner", "2.10+", _zero, "0", "rollout workers use no GPU",
            "actorrl's rollout workers run on CPUs only (num_gpus is the learner's); set "
            "num_gpus_per_env_runner: 0"),
    Ignored("num_atoms", "0.6+ (DQN)", _is(1), "1",
            "one atom is plain (non-distributional) Q-learning, which actorrl's DQN does",
            "distributional Q-learning (num_atoms > 1) is not implemented in actorrl; set "
            "num_atoms: 1 for expected-value Q-learning"),
    Ignored("noisy", "0.6+ (DQN)", _is(False), "false", "no noisy-net layers, as actorrl's",
            "noisy networks are not implemented in actorrl (it explores with "
            "exploration_config's epsilon); set noisy: false"),
    Ignored("v_min", "0.6+ (DQN)", _any, "any", "the return support of num_atoms > 1 only"),
    Ignored("v_max", "0.6+ (DQN)", _any, "any", "the return support of num_atoms > 1 only"),
    Ignored("sigma0", "0.6+ (DQN)", _any, "any", "the initial noise of noisy: true only"),
    Ignored("replay_ratio", "2.x (IMPALA)", _zero, "0",
            "no replayed batches mixed in, as actorrl's IMPALA",
            "actorrl's IMPALA learns from fresh samples only; set replay_ratio: 0"),
    Ignored("replay_proportion", "0.6-1.x (IMPALA)", _zero, "0",
            "no replayed batches mixed in, as actorrl's IMPALA",
            "actorrl's IMPALA learns from fresh samples only; set replay_proportion: 0"),
    Ignored("replay_buffer_num_slots", "0.6-1.x (IMPALA)", _zero, "0",
            "no replay slots, as actorrl's IMPALA",
            "actorrl's IMPALA learns from fresh samples only; set replay_buffer_num_slots: 0"),
    Ignored("vtrace_drop_last_ts", "1.x-2.x (IMPALA)", _is(False), "false",
            "the last timestep of each fragment is kept, as actorrl's V-trace does",
            "actorrl's V-trace bootstraps from every fragment's last timestep; set "
            "vtrace_drop_last_ts: false"),
    Ignored("evaluation_parallel_to_training", "1.x+", _is(True, False), "true, false",
            "actorrl evaluates the learner's weights between training iterations: the same "
            "evaluation metrics, the iteration takes longer",
            "evaluation_parallel_to_training must be true or false"),
    Ignored("enable_connectors", "2.3-2.9", _is(True, False), "true, false", _NEW_STACK,
            "enable_connectors must be true or false"),
    Ignored("_disable_execution_plan_api", "1.x", _is(True, False), "true, false",
            "RLlib's switch between its two training-loop APIs; actorrl has one, and the "
            "file's other settings apply unchanged",
            "_disable_execution_plan_api must be true or false"),
    Ignored("_tf_policy_handles_more_than_one_loss", "1.x-2.x", _is(True, False),
            "true, false", "TensorFlow only; " + _TORCH,
            "_tf_policy_handles_more_than_one_loss must be true or false"),
    Ignored("_separate_vf_optimizer", "1.x-2.x (APPO)", _is(False), "false",
            "one optimizer for the policy and value losses, as actorrl's",
            "actorrl trains the policy and value losses with one optimizer (lr); set "
            "_separate_vf_optimizer: false"),
    Ignored("_lr_vf", "1.x-2.x (APPO)", _any, "any",
            "the value optimizer's lr of _separate_vf_optimizer: true only"),
    Ignored("num_aggregation_workers", "1.x-2.x (IMPALA)", _any, "any",
            "RLlib's batch relays between workers and learner; actorrl's learner takes "
            "fragments from the workers directly (what is learned is the same)"),
    Ignored("object_store_memory", "0.6-1.x", _any, "any", "Ray's object store size; "
            "actorrl has no Ray object store"),
    Ignored("object_store_memory_per_worker", "0.6-1.x", _any, "any", "Ray's object store "
            "size; actorrl has no Ray object store"),
    Ignored("num_cpus_per_learner_worker", "2.5-2.9", _any, "any",
            "CPUs reserved for RLlib's learner processes; actorrl's learner is one process"),
    Ignored("grad_clip_by", "2.5+", _is("global_norm"), "global_norm",
            "grad_clip clips the global norm, as actorrl's IMPALA, APPO and PPO do",
            "actorrl clips gradients by their global norm; set grad_clip_by: global_norm"),
    Ignored("num_accs_per_worker", "master 2023", _zero, "0", "rollout workers use no GPU",
            "actorrl's rollout workers run on CPUs only (num_gpus is the learner's); set "
            "num_accs_per_worker: 0"),
    Ignored("no_done_at_end", "0.8-1.x", _is(False), "false",
            "episode ends are terminal, as actorrl's (time limits are truncations)",
            "actorrl marks an episode's end terminal unless the env truncates it (gymnasium's "
            "TimeLimit); set no_done_at_end: false (SAC honours true)"),
    Ignored("use_state_preprocessor", "0.8-2.x (DDPG, SAC)", _is(False), "false",
            "the Q and policy networks read the observation directly, as RLlib's default",
            "actorrl's SAC and DDPG/TD3 build no state preprocessor before their networks "
            "(each reads the flattened observation, or model's conv stack for images); set "
            "use_state_preprocessor: false"),
    Ignored("soft_horizon", "0.8-1.x", _is(False), "false",
            "episodes cut at horizon reset the env, as actorrl's horizon does",
            "actorrl's horizon cuts episodes (the env resets); RLlib's soft horizon, which "
            "keeps the env running, is not implemented: set soft_horizon: false"),
    Ignored("log_level", "0.6+", _any, "any", "RLlib's logging verbosity; actorrl logs "
            "warnings to the terminal and everything to logs/ (--debug: all)"),
    Ignored("create_env_on_driver", "1.x+", _is(False), "false",
            "no env on the driver (actorrl's evaluation has its own workers)",
            "actorrl builds envs on its workers only; set create_env_on_driver: false"),
    Ignored("disable_env_checking", "2.x", _is(True, False), "true, false",
            "RLlib's env checker; actorrl checks an env by building it before starting"),
    Ignored("tf_session_args", "0.6-2.x", _any, "any", "TensorFlow only; " + _TORCH),
    Ignored("local_tf_session_args", "0.6-2.x", _any, "any", "TensorFlow only; " + _TORCH),
)
"""Keys accepted and ignored at the values that change nothing (see the module docstring)."""

IGNORED_BY_KEY: dict[str, Ignored] = {i.key: i for i in IGNORED}

IGNORED_SUBKEYS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    # RLlib 2.x Ape-X: where the buffer lives, not what it computes.
    "replay_buffer_config.no_local_replay_buffer": (
        _any, "any", "where RLlib keeps its buffers; actorrl's replay shards are actors"),
    "replay_buffer_config.replay_buffer_shards_colocated_with_driver": (
        _any, "any", "where RLlib places its shards; actorrl places them on its nodes"),
    "replay_buffer_config._enable_replay_buffer_api": (
        _is(True, False), "true, false", "RLlib 1.12's switch to its buffer classes"),
    "replay_buffer_config.replay_sequence_length": (
        _is(1, None), "1", "one-step transitions, as actorrl replays them"),
    "replay_buffer_config.replay_burn_in": (_zero, "0", "no burn-in (sequences only)"),
    "replay_buffer_config.replay_zero_init_states": (
        _is(True, False), "true, false", "sequences only (replay_sequence_length > 1)"),
    "replay_buffer_config.storage_unit": (
        _is("timesteps"), "timesteps", "one-step transitions, as actorrl stores them"),
    "replay_buffer_config.min_size_for_sampling": (
        _any, "any", "not read by RLlib's Ape-X buffers; learning_starts (RLlib 2.x: "
        "num_steps_sampled_before_learning_starts) sets when replay starts"),
}
"""``parent.sub`` keys of RLlib's sub-mappings accepted and ignored: (accepted values,
as text, why)."""

RLLIB_ONLY_KEYS: dict[str, str] = {
    "frameskip": "env_config.frameskip is the ALE's own skip; actorrl's is "
                 "env_config.frame_skip, the DeepMind wrapper's (another setting)",
    "custom_eval_function": "actorrl's evaluation runs its own episodes (evaluation_* keys)",
}
"""RLlib keys actorrl does not have, whose near names mean something else: refused
without a did-you-mean."""

RLLIB_ONLY_ALGORITHMS = ("DQN", "DDPPO", "PG", "MARWIL",
                         "BC", "CQL", "ES", "ARS", "R2D2", "SimpleQ", "Rainbow", "QMIX",
                         "MADDPG", "Dreamer", "DreamerV3", "SlateQ", "CRR", "AlphaZero",
                         "LinUCB", "LinTS", "MAML", "MBMPO", "LeelaChessZero", "DT", "IQL")
"""RLlib ``run:`` names of algorithms actorrl lacks: named as such, never "did you mean"
another algorithm (``DDPPO`` is not ``ppo``)."""


TRANSLATED: tuple[tuple[str, str, str], ...] = (
    ("clip_rewards", "0.6+",
     "Atari ids: true/false set env_config.clip_rewards; null (RLlib's default) clips "
     "Atari rewards as actorrl does; other envs: false/null accepted, true or a number "
     "refused (actorrl clips only in its Atari wrappers)"),
    ("env_config.frameskip", "2.x (ALE/*-v5)",
     "Atari ids: 1 (the ALE skips none, the DeepMind wrapper skips 4: actorrl's default) "
     "accepted; other values refused (actorrl's frame_skip is the wrapper's skip)"),
    ("env_config.nondeterministic", "2.x (ALE/*-v5)",
     "Atari ids: ignored with a warning (a flag of gym's old registry, never the game's)"),
    ("rollout_fragment_length: auto", "2.x",
     "train_batch_size over every worker's envs, rounded up (DQN: 4)"),
    ("multiagent.policies: [ids], policy_mapping_fn: {type: ...}", "1.x-2.x",
     "a list of ids: each policy with the default class, its agents' spaces; {type: X} "
     "for RLlib's example classes (RLLIB_CLASSES), others refused"),
    ("final_prioritized_replay_beta", "0.6-1.x",
     "dqn: beta anneals to it linearly over prioritized_replay_beta_annealing_timesteps "
     "rows trained (default 20000), as RLlib's DQN; apex, or equal to "
     "prioritized_replay_beta: ignored with a warning (RLlib's Ape-X never annealed)"),
    ("beta_annealing_fraction", "0.6-0.8",
     "dqn: times schedule_max_timesteps is prioritized_replay_beta_annealing_timesteps; "
     "ignored with a warning where final_prioritized_replay_beta is"),
)
"""Keys translated by what else the config says (``_env_dependent``, ``_final_beta``), as
the config reference lists them."""


# ---- stop keys ---------------------------------------------------------------------------
STOP_ALIASES: dict[str, str] = {
    # RLlib 2.10+ (new and old stack): episode stats under env_runners.
    "env_runners.episode_return_mean": "episode_reward_mean",
    "env_runners.episode_reward_mean": "episode_reward_mean",
    "env_runners.episode_return_min": "episode_reward_min",
    "env_runners.episode_return_max": "episode_reward_max",
    "env_runners.episode_len_mean": "episode_len_mean",
    "episode_return_mean": "episode_reward_mean",
    # RLlib 2.0-2.9: under sampler_results.
    "sampler_results.episode_reward_mean": "episode_reward_mean",
    "sampler_results.episode_reward_min": "episode_reward_min",
    "sampler_results.episode_reward_max": "episode_reward_max",
    "sampler_results.episode_len_mean": "episode_len_mean",
    # Evaluation results (1.x-2.x).
    "evaluation.env_runners.episode_return_mean": "evaluation.episode_reward_mean",
    "evaluation.env_runners.episode_reward_mean": "evaluation.episode_reward_mean",
    "evaluation.sampler_results.episode_reward_mean": "evaluation.episode_reward_mean",
    "evaluation.episode_return_mean": "evaluation.episode_reward_mean",
    # Counters: RLlib 2.0-2.9 and 2.10+ (lifetime).
    "num_env_steps_sampled": "timesteps_total",
    "num_env_steps_sampled_lifetime": "timesteps_total",
    "env_runners.num_env_steps_sampled_lifetime": "timesteps_total",
    "num_env_steps_trained": "num_steps_trained",
    "num_env_steps_trained_lifetime": "num_steps_trained",
    "learners.__all_modules__.num_env_steps_trained_lifetime": "num_steps_trained",
}
"""RLlib result paths of stop keys (``/`` written as ``.``) -> actorrl's result keys."""


def resolve_stop_keys(stop: Mapping[str, Any]) -> dict[str, Any]:
    """``stop`` with RLlib's result paths as actorrl's keys (``/`` read as ``.``);
    ``ValueError`` when two spellings of one key disagree."""
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in stop.items():
        dotted = key.replace("/", ".") if isinstance(key, str) else key
        target = STOP_ALIASES.get(dotted, dotted)
        if target in out and out[target] != value:
            raise ValueError(f"stop keys {written[target]!r} and {key!r} both set "
                             f"{target!r}, to {out[target]!r} and {value!r}: keep one")
        out[target] = value
        written[target] = key
    return out


# ---- resolution ----------------------------------------------------------------------------
@dataclass
class Resolution:
    """What :func:`resolve_rllib_keys` made of one layer of input."""

    values: dict[str, Any]
    problems: list[str]
    renamed: dict[str, str]
    """canonical key -> the alias it was written as (to name it in later problems)."""


def shown(value: Any) -> str:
    """``value`` as a YAML file writes it (``true``, ``null``, ``tf``, ``0.0``)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _warn(key: str, value: Any, why: str) -> None:
    warnings.warn(f"{key}: {shown(value)} is ignored: {why}", RLlibKeyWarning, stacklevel=5)


def resolve_rllib_keys(values: Mapping[str, Any], *, algorithm: str = "",
                       env_known: bool = True,
                       settings: Collection[str] = ()) -> Resolution:
    """One layer of input with RLlib's other spellings read as actorrl's keys (see the
    module docstring). ``algorithm`` (``apex``...) decides what ``final_prioritized_replay_beta``
    means; without ``env_known`` (a layer the env may still change) the env-dependent keys
    (``clip_rewards``, ``env_config.frameskip``) are left for the final load. A key of
    :data:`IGNORED` that is one of ``settings`` (the flat keys of the config being loaded:
    SAC's ``no_done_at_end``) is that config's to read, not ignored."""
    out = dict(values)
    problems: list[str] = []
    # canonical -> [(as written, value)]
    given: dict[str, list[tuple[str, Any]]] = {}

    def put(canonical: str, written: str, value: Any) -> None:
        given.setdefault(canonical, []).append((written, value))

    for alias in ALIASES:
        if "." in alias.key or alias.key not in out:
            continue
        if alias.canonical.startswith("exploration_config."):
            continue  # _old_exploration
        value = out.pop(alias.key)
        if alias.deprecated:
            warnings.warn(f"config key {alias.key!r} is deprecated; use {alias.canonical!r} "
                          "instead", DeprecationWarning, stacklevel=5)
        put(alias.canonical, alias.key, value)
    for parent in PARENTS:
        if parent not in out:
            continue
        sub = out.pop(parent)
        if sub is None:
            continue
        if not isinstance(sub, Mapping):
            problems.append(f"{parent} must be a mapping (RLlib's sub-keys), got {sub!r}")
            continue
        for key, value in sub.items():
            dotted = f"{parent}.{key}"
            alias = ALIAS_BY_KEY.get(dotted)
            if alias is not None:
                if alias.convert is not None:
                    try:
                        value = alias.convert(value)
                    except ValueError as exc:
                        problems.append(str(exc))
                        continue
                put(alias.canonical, dotted, value)
            elif dotted in IGNORED_SUBKEYS:
                off, off_text, why = IGNORED_SUBKEYS[dotted]
                if off(value):
                    _warn(dotted, value, why)
                else:
                    problems.append(f"{dotted}: {shown(value)} cannot be honoured ({why}); "
                                    f"accepted: {off_text}, or drop it")
            else:
                known = sorted([a.key.split(".", 1)[1] for a in ALIASES
                                if a.key.startswith(parent + ".")]
                               + [k.split(".", 1)[1] for k in IGNORED_SUBKEYS
                                  if k.startswith(parent + ".")])
                problems.append(f"unknown RLlib key {dotted!r}: actorrl reads "
                                f"{parent}'s {', '.join(known)}; drop it or set the "
                                "actorrl key it means")
    horizon = out.get("schedule_max_timesteps",
                      OLD_EXPLORATION_DEFAULTS["schedule_max_timesteps"])
    _old_exploration(out, put, problems)
    _final_beta(out, given, algorithm, horizon)
    _rllib_classes(out, problems)
    _model_keys(out, problems)
    _exploration_types(out, algorithm, problems)
    _learner_workers(out, problems)
    for ignored in IGNORED:
        if ignored.key not in out or ignored.key in settings:
            continue
        value = out.pop(ignored.key)
        if ignored.silent(value):
            continue
        if ignored.off(value):
            _warn(ignored.key, value, ignored.why)
        else:
            problems.append(f"{ignored.key}: {shown(value)} cannot be honoured: {ignored.refused}")
    if env_known:
        _env_dependent(out, put, problems)
    evaluation = out.get("evaluation_config")
    if isinstance(evaluation, Mapping) and evaluation:
        inner = resolve_rllib_keys(evaluation, algorithm=algorithm, env_known=False,
                                   settings=settings)
        out["evaluation_config"] = inner.values
        problems.extend(f"evaluation_config: {problem}" for problem in inner.problems)
    renamed: dict[str, str] = {}
    for canonical, sources in given.items():
        if canonical.startswith("exploration_config."):
            leaf = canonical.split(".", 1)[1]
            current = out.get("exploration_config")
            if isinstance(current, Mapping) and leaf in current:
                sources = [("exploration_config." + leaf, current[leaf]), *sources]
        elif canonical in out:
            sources = [(canonical, out[canonical]), *sources]
        distinct = [s for i, s in enumerate(sources)
                    if all(not _same(s[1], t[1]) for t in sources[:i])]
        if len(distinct) > 1:
            (a, va), (b, vb) = distinct[:2]
            problems.append(_conflict(a, va, b, vb, canonical))
            continue
        written, value = sources[0]
        if canonical.startswith("exploration_config."):
            leaf = canonical.split(".", 1)[1]
            current = out.get("exploration_config")
            merged = dict(current) if isinstance(current, Mapping) else {}
            merged[leaf] = value
            out["exploration_config"] = merged
        else:
            out[canonical] = value
        if written != canonical:
            renamed[canonical] = written
    return Resolution(values=out, problems=problems, renamed=renamed)


def _conflict(a: str, va: Any, b: str, vb: Any, canonical: str) -> str:
    alias = ALIAS_BY_KEY.get(b) or ALIAS_BY_KEY.get(a)
    if alias is not None and alias.deprecated:
        old, new = (b, a) if b == alias.key else (a, b)
        old_value, new_value = (vb, va) if b == alias.key else (va, vb)
        return (f"{old!r} (deprecated) and {new!r} are both set, to {old_value!r} and "
                f"{new_value!r}: set only {new!r}")
    return (f"{a!r} and {b!r} are both set, to {va!r} and {vb!r}, but both mean "
            f"{canonical!r}: keep one")


def _old_exploration(out: dict[str, Any], put: Callable[[str, str, Any], None],
                     problems: list[str]) -> None:
    """RLlib 0.6-0.8 DQN's epsilon keys -> ``exploration_config``: epsilon falls from 1 to
    ``exploration_final_eps`` over ``exploration_fraction * schedule_max_timesteps``."""
    if "exploration_final_eps" in out:
        put("exploration_config.final_epsilon", "exploration_final_eps",
            out.pop("exploration_final_eps"))
    parts = {k: out.pop(k) for k in OLD_EXPLORATION_DEFAULTS if k in out}
    if not parts:
        return
    values = {**OLD_EXPLORATION_DEFAULTS, **parts}
    fraction, horizon = values["exploration_fraction"], values["schedule_max_timesteps"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
               for v in (fraction, horizon)):
        problems.append(f"exploration_fraction and schedule_max_timesteps must be numbers, "
                        f"got {fraction!r} and {horizon!r}")
        return
    put("exploration_config.epsilon_timesteps", " and ".join(sorted(parts)),
        max(1, int(fraction * horizon)))


def _rllib_classes(out: dict[str, Any], problems: list[str]) -> None:
    """RLlib's example classes (:data:`RLLIB_CLASSES`) as ``env`` and in ``multiagent``, and
    RLlib's ``multiagent`` forms: ``policies`` as a list of ids (each policy gets the
    default class, its agents' spaces and no overrides) and ``policy_mapping_fn`` as
    ``{type: class path}``."""
    env = out.get("env")
    if isinstance(env, str) and env in RLLIB_CLASSES:
        out["env"] = RLLIB_CLASSES[env]
    multiagent = out.get("multiagent")
    if not isinstance(multiagent, Mapping):
        return
    multiagent = dict(multiagent)
    policies = multiagent.get("policies")
    if isinstance(policies, (list, tuple, set)):
        if not all(isinstance(pid, str) for pid in policies):
            problems.append(f"multiagent.policies as a list must hold policy ids (strings), "
                            f"got {policies!r}")
        else:
            multiagent["policies"] = {pid: [None, None, None, {}] for pid in policies}
    mapping = multiagent.get("policy_mapping_fn")
    if isinstance(mapping, Mapping) and set(mapping) == {"type"}:
        mapping = mapping["type"]
        if mapping not in RLLIB_CLASSES:
            problems.append(
                f"multiagent.policy_mapping_fn: {{type: {mapping!r}}} (a class RLlib calls "
                "with the agent id, episode and worker) cannot be honoured: actorrl calls "
                "policy_mapping_fn(agent_id) and knows that form only for RLlib's example "
                f"classes ({', '.join(sorted(RLLIB_CLASSES))}); name a function "
                "'pkg.module:fn' of the agent id instead")
            return
    if isinstance(mapping, str) and mapping in RLLIB_CLASSES:
        multiagent["policy_mapping_fn"] = RLLIB_CLASSES[mapping]
    out["multiagent"] = multiagent


def _model_keys(out: dict[str, Any], problems: list[str]) -> None:
    """``vf_share_layers`` at the top level (RLlib 0.8-1.x PPO/APPO) is
    ``model.vf_share_layers`` (where RLlib 1.0 moved it)."""
    if "vf_share_layers" not in out:
        return
    value = out.pop("vf_share_layers")
    model = out.get("model")
    model = dict(model) if isinstance(model, Mapping) else {}
    if "vf_share_layers" in model and model["vf_share_layers"] != value:
        problems.append(_conflict("vf_share_layers", value, "model.vf_share_layers",
                                  model["vf_share_layers"], "model.vf_share_layers"))
        return
    model["vf_share_layers"] = value
    out["model"] = model


EPSILON_TYPES = ("EpsilonGreedy", "PerWorkerEpsilonGreedy")
"""``exploration_config.type`` values of actorrl's Q-learning policies."""
NOISE_ALGORITHMS = ("ddpg", "td3", "apexddpg")
"""Algorithms whose deterministic policies explore with noise: their policy config checks
``exploration_config`` (``OrnsteinUhlenbeckNoise``, ``GaussianNoise`` and the
``PerWorker`` forms). Names compared without underscores (``apex_ddpg``, as its config
class ``ApexDDPGConfig`` names it: ``apexddpg``)."""
POLICY_GRADIENT = ("a2c", "a3c", "impala", "appo", "ppo", "sac")
"""Algorithms whose policies explore by sampling their action distribution."""


def _exploration_types(out: dict[str, Any], algorithm: str, problems: list[str]) -> None:
    """``exploration_config`` of a type actorrl's policies do not explore with: on the
    policy-gradient algorithms RLlib's ``StochasticSampling`` (or ``{}``) is what they do
    (ignored with a warning); any other type is refused, naming it. DDPG's, TD3's and
    Ape-X DDPG's noise types, and SAC's ``random_timesteps``, are their policy config's to
    check."""
    explore = out.get("exploration_config")
    if not isinstance(explore, Mapping) or not algorithm:
        return
    kind = explore.get("type")
    if algorithm == "sac" and kind in (None, "StochasticSampling") \
            and explore.get("random_timesteps"):
        return  # SAC's random_timesteps: its policy config's to check and honour
    if algorithm in POLICY_GRADIENT:
        out.pop("exploration_config")
        if kind in (None, "StochasticSampling") and set(explore) <= {"type",
                                                                      "random_timesteps"} \
                and not explore.get("random_timesteps"):
            _warn("exploration_config", explore, f"{algorithm}'s policy samples actions from "
                  "its action distribution (RLlib's StochasticSampling)")
        else:
            problems.append(f"exploration_config: {shown(explore)} cannot be honoured: "
                            f"{algorithm}'s policy explores by sampling its action "
                            "distribution (StochasticSampling); drop exploration_config")
    elif algorithm.replace("_", "") in NOISE_ALGORITHMS:
        return
    elif kind is not None and kind not in EPSILON_TYPES:
        out.pop("exploration_config")
        problems.append(f"exploration_config.type: {kind!r} cannot be honoured: actorrl's "
                        f"{algorithm or 'Q-learning'} policy explores epsilon-greedily "
                        f"({', '.join(EPSILON_TYPES)}); use one of those types")


LEARNER_KEYS = (("num_learner_workers", "num_gpus_per_learner_worker"),
                ("num_learners", "num_gpus_per_learner"))
"""RLlib 2.5-2.9 and 2.10+: learner processes and the GPUs of each."""


def _learner_workers(out: dict[str, Any], problems: list[str]) -> None:
    """RLlib's several learners (``num_learner_workers: N``, ``num_gpus_per_learner_worker:
    g``) split each train batch N ways and average the gradients: actorrl's towers compute
    the same in one learner process, so N > 1 becomes ``num_gpus: N*g`` (``g: 0``: N CPU
    towers, ``_fake_gpus``). Zero or one learner is left to :data:`IGNORED`."""
    for count_key, gpus_key in LEARNER_KEYS:
        count = out.get(count_key)
        if not isinstance(count, int) or isinstance(count, bool) or count <= 1:
            continue
        gpus = out.pop(gpus_key, 0)
        out.pop(count_key)
        if not isinstance(gpus, (int, float)) or gpus not in (0, 1):
            problems.append(f"{gpus_key}: {shown(gpus)} cannot be honoured with {count_key}: "
                            f"{count}: actorrl's towers hold one GPU each; set it to 1 or 0")
            return
        towers = {"num_gpus": count} if gpus else {"num_gpus": count, "_fake_gpus": True}
        given = out.get("num_gpus", 0)
        if given not in (0, count):
            problems.append(f"num_gpus: {shown(given)} and {count_key}: {count} disagree: "
                            f"the learners' GPUs become actorrl's towers; drop num_gpus")
            return
        _warn(count_key, count, f"{count} learners averaging their gradients are actorrl's "
              f"{count} learner towers in one process (" +
              ", ".join(f"{k}: {shown(v)}" for k, v in towers.items()) + ")")
        out.update(towers)


BETA_ANNEALING_KEYS = ("beta_annealing_fraction", "prioritized_replay_beta_annealing_timesteps",
                       "final_prioritized_replay_beta_annealing_timesteps")
"""RLlib's keys for how fast beta moves to ``final_prioritized_replay_beta``."""


def _final_beta(out: dict[str, Any], given: dict[str, list[tuple[str, Any]]], algorithm: str,
                horizon: Any) -> None:
    """``final_prioritized_replay_beta`` (RLlib 0.6-1.x): where beta anneals to. RLlib's
    DQN anneals it over ``prioritized_replay_beta_annealing_timesteps`` rows trained (0.8:
    ``beta_annealing_fraction`` x ``schedule_max_timesteps``, ``horizon`` here), as
    actorrl's DQN does; RLlib's Ape-X never annealed (its replay shards use
    ``prioritized_replay_beta`` throughout), nor does actorrl's: ignored there with a
    warning."""
    if "final_prioritized_replay_beta" not in out:
        for key in BETA_ANNEALING_KEYS:
            if key in out:
                _warn(key, out.pop(key), "anneals beta toward final_prioritized_replay_beta, "
                      "which is not set: beta stays prioritized_replay_beta")
        return
    final = out.pop("final_prioritized_replay_beta")
    schedule = {key: out.pop(key) for key in BETA_ANNEALING_KEYS if key in out}
    sources = given.get("prioritized_replay_beta", [])
    beta = out.get("prioritized_replay_beta", sources[0][1] if sources else 0.4)
    if final == beta:
        _warn("final_prioritized_replay_beta", final, "equal to prioritized_replay_beta: "
              "beta is constant")
    elif algorithm.replace("_", "") in ("apex", "apexddpg"):
        _warn("final_prioritized_replay_beta", final, "RLlib's Ape-X never annealed beta "
              "(its replay shards use prioritized_replay_beta throughout), nor does actorrl")
    else:
        out["final_prioritized_replay_beta"] = final
        if "prioritized_replay_beta_annealing_timesteps" in schedule:
            out["prioritized_replay_beta_annealing_timesteps"] = \
                schedule["prioritized_replay_beta_annealing_timesteps"]
        elif "beta_annealing_fraction" in schedule:
            fraction = schedule["beta_annealing_fraction"]
            if isinstance(fraction, (int, float)) and isinstance(horizon, (int, float)):
                out["prioritized_replay_beta_annealing_timesteps"] = max(
                    1, int(fraction * horizon))
        return
    for key, value in schedule.items():
        _warn(key, value, "beta is constant (see final_prioritized_replay_beta)")


def _env_dependent(out: dict[str, Any], put: Callable[[str, str, Any], None],
                   problems: list[str]) -> None:
    """Top-level ``clip_rewards`` and ``env_config.frameskip``, whose meaning depends on
    whether the env is an Atari id (DeepMind preprocessing)."""
    env_config = out.get("env_config")
    frameskip = isinstance(env_config, Mapping) and "frameskip" in env_config
    flagged = isinstance(env_config, Mapping) and "nondeterministic" in env_config
    if "clip_rewards" not in out and not frameskip and not flagged:
        return
    from actorrl.envs.atari import is_atari_id  # gymnasium: only when these keys are given

    env = out.get("env", "CartPole-v1")
    atari = is_atari_id(env)
    if flagged and atari:
        assert isinstance(env_config, Mapping)
        env_config = {k: v for k, v in env_config.items() if k != "nondeterministic"}
        value = out["env_config"]["nondeterministic"]
        out["env_config"] = env_config
        _warn("env_config.nondeterministic", value, "a flag of gym's old env registry "
              "(metadata), it never changed the game (sticky actions are "
              "env_config.repeat_action_probability)")
    if frameskip and atari:
        assert isinstance(env_config, Mapping)
        env_config = dict(env_config)
        value = env_config.pop("frameskip")
        if value == 1 and not isinstance(value, bool):
            out["env_config"] = env_config  # RLlib's 1: the ALE skips none, the wrapper 4
        else:
            problems.append(
                f"env_config.frameskip: {shown(value)} cannot be honoured: in RLlib it is the "
                "ALE's own skip beneath the DeepMind wrapper's 4-frame skip; actorrl's ALE "
                "env skips no frames and env_config.frame_skip (default 4) is the wrapper's "
                "max-pooled skip. Set frameskip: 1 (or drop it) for RLlib's usual Atari "
                "setup, or frame_skip: N for N frames per action")
    if "clip_rewards" not in out:
        return
    value = out.pop("clip_rewards")
    if value is None:
        return  # RLlib's default: clip Atari rewards (DeepMind), nothing elsewhere
    if atari and isinstance(value, bool):
        inner = out.get("env_config")
        if isinstance(inner, Mapping) and "clip_rewards" in inner and \
                inner["clip_rewards"] is not value:
            problems.append(_conflict("clip_rewards", value, "env_config.clip_rewards",
                                      inner["clip_rewards"], "env_config.clip_rewards"))
            return
        if value is False:  # true is the Atari wrappers' default: nothing to write
            out["env_config"] = {**(inner if isinstance(inner, Mapping) else {}),
                                 "clip_rewards": value}
        return
    if value is False:
        return  # nothing clips rewards outside actorrl's Atari wrappers
    where = (f"on Atari ids actorrl clips to the reward's sign (clip_rewards: true) or not "
             f"at all (false), not to {value!r}" if atari else
             f"actorrl clips rewards only in its Atari wrappers, and {env!r} is not an "
             "Atari id: wrap your env (e.g. gymnasium.wrappers.TransformReward(env, "
             "numpy.sign) in a 'pkg.module:factory' env) and drop clip_rewards")
    problems.append(f"clip_rewards: {shown(value)} cannot be honoured: {where}")
