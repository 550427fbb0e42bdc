"""Reading RLlib-style mappings into sections: RLlib's flat keys (:data:`FLAT_KEYS`) moved
into their sections, derived values filled from the keys they come from, and one
component's config loaded from an algorithm-style mapping (:func:`load_component`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from actorrl.config.aliases import ALIAS_BY_KEY, ALIASES, resolve_rllib_keys
from actorrl.config.rollout import RolloutConfig, WorkerConfig
from actorrl.config.sections import (
    ALGORITHM,
    WORKER,
    ConfigError,
    ConfigSection,
    S,
    Spelling,
    key_name,
    load_section,
    suggest,
)

# ---- flat RLlib keys ------------------------------------------------------------------
_POLICY_KEYS = (
    "lr", "gamma", "grad_clip", "model", "adam_epsilon", "n_step", "double_q", "dueling",
    "hiddens", "huber_threshold", "target_network_update_freq", "exploration_config",
    "per_worker_exploration", "vtrace", "vtrace_clip_rho_threshold",
    "vtrace_clip_pg_rho_threshold", "vf_loss_coeff", "entropy_coeff", "opt_type", "decay",
    "momentum", "epsilon", "use_gae", "use_critic", "lambda", "lr_schedule",
    "entropy_coeff_schedule", "clip_param", "vf_clip_param", "use_kl_loss", "kl_coeff",
    "kl_target", "target_update_frequency", "twin_q", "tau", "initial_alpha",
    "target_entropy", "optimization", "q_model_config", "policy_model_config",
    "no_done_at_end", "policy_delay", "smooth_target_policy", "target_noise",
    "target_noise_clip", "actor_hiddens", "actor_hidden_activation", "critic_hiddens",
    "critic_hidden_activation", "actor_lr", "critic_lr", "l2_reg", "use_huber", "alpha_lr")


_ROLLOUT_KEYS = ("num_envs_per_worker", "rollout_fragment_length", "batch_mode", "explore",
                 "clip_actions", "normalize_actions", "observation_filter", "multiagent", "horizon")


_REPLAY_KEYS = ("buffer_size", "learning_starts", "prioritized_replay",
                "prioritized_replay_alpha", "prioritized_replay_beta", "prioritized_replay_eps",
                "num_replay_buffer_shards", "batch_replay", "worker_side_prioritization",
                "compress_observations", "final_prioritized_replay_beta",
                "prioritized_replay_beta_annealing_timesteps")


_LEARNER_KEYS = ("num_sgd_iter", "minibatch_buffer_size", "learner_queue_size",
                 "learner_queue_timeout", "num_multi_gpu_tower_stacks", "num_data_load_threads",
                 "sgd_minibatch_size", "shuffle_sequences")


_TOP_LEVEL_KEYS = (
    "env", "env_config", "num_workers", "train_batch_size", "seed", "num_gpus", "_fake_gpus",
    "min_iter_time_s", "timesteps_per_iteration", "metrics_smoothing_episodes", "debug",
    "max_weight_sync_delay", "training_intensity", "max_sample_requests_in_flight_per_worker",
    "broadcast_interval", "grads_per_step", "microbatch_size", "num_cpus_per_worker",
    "num_cpus_for_driver", "callbacks", "evaluation_interval", "evaluation_duration",
    "evaluation_duration_unit", "evaluation_num_workers", "evaluation_config",
    "preprocessor_pref", "record_env")


FLAT_KEYS: dict[str, str] = {
    **{key: key for key in _TOP_LEVEL_KEYS},
    **{key: f"rollout.{key}" for key in _ROLLOUT_KEYS},
    **{key: f"policy.{key}" for key in _POLICY_KEYS},
    **{key: f"replay.{key}" for key in _REPLAY_KEYS},
    **{key: f"learner.{key}" for key in _LEARNER_KEYS},
}
"""Every RLlib (flat) config key -> where it lives in an algorithm config (the one table).
A key whose section an algorithm lacks is unknown to that algorithm."""


DEPRECATED_KEYS: dict[str, str] = {a.key: a.canonical for a in ALIASES if a.deprecated}
"""The seeds' old key names -> today's (RLlib renamed them): still read, with a
``DeprecationWarning``, as RLlib did. RLlib's other spellings (2.x names, nested
``replay_buffer_config``...) are first-class: the one table is
:data:`actorrl.config.aliases.ALIASES`."""


def _unknown_key_problem(key: str, renamed: Mapping[str, str], algorithm: str,
                         known: list[str]) -> str:
    """The problem of an unknown ``key``, naming the alias it was written as if it was."""
    written = renamed.get(key)
    alias = ALIAS_BY_KEY.get(written) if written is not None else None
    if written is None:
        return f"unknown config key {key!r}{suggest(key, known)}"
    if alias is not None and alias.deprecated:
        return f"unknown config key {key!r} (the new name of {written!r})"
    version = f"RLlib {alias.rllib}'s " if alias is not None else ""
    return (f"config key {written!r} ({version}name of {key!r}) is not a setting of "
            f"{algorithm or 'this algorithm'}: drop it, or use an algorithm that has "
            f"{key!r}")


def nest_flat_keys(values: Mapping[str, Any], sections: set[str], top_level: set[str],
          problems: list[str], spelling: Spelling, *, skip_others: bool,
          algorithm: str = "", settings: Collection[str] = ()) -> dict[str, Any]:
    """``values`` with RLlib's other spellings read as actorrl's keys
    (:func:`~actorrl.config.aliases.resolve_rllib_keys`, for ``algorithm``) and flat keys
    moved into their sections (flat over nested). With ``skip_others``, keys that belong
    to sections or top-level keys outside ``sections`` / ``top_level`` (another
    component's) are left out; unknown keys are always refused. ``settings``: the flat
    keys of the config being loaded (see :func:`resolve_rllib_keys`)."""
    resolution = resolve_rllib_keys(values, algorithm=algorithm, settings=settings)
    values = resolution.values
    problems.extend(resolution.problems)
    out: dict[str, Any] = {}
    flat: list[tuple[str, str, Any]] = []
    known_sections = {dotted.split(".")[0] for dotted in FLAT_KEYS.values() if "." in dotted}
    for key, value in values.items():
        if key in sections:
            if isinstance(value, ConfigSection):
                value = value.to_dict(include_derived=False)
            if isinstance(value, Mapping):
                out.setdefault(key, {}).update(value)
            else:
                out[key] = value  # the section loader reports the bad type
        elif key in top_level:
            out[key] = value
        elif key in FLAT_KEYS and "." in FLAT_KEYS[key] and \
                FLAT_KEYS[key].split(".")[0] in sections:
            flat.append((key, FLAT_KEYS[key], value))
        elif skip_others and (key in FLAT_KEYS or key in known_sections or key == "algorithm"):
            continue
        else:
            known = sorted(top_level | sections | {k for k, d in FLAT_KEYS.items()
                                                     if d.split(".")[0] in sections})
            problems.append(_unknown_key_problem(key, resolution.renamed, algorithm, known))
    for key, dotted, value in flat:
        section, leaf = dotted.split(".", 1)
        current = out.setdefault(section, {})
        if not isinstance(current, Mapping):
            continue
        current = dict(current)
        current[leaf] = value
        out[section] = current
        spelling.aliases[dotted] = resolution.renamed.get(key, key)
    return out


def lookup(values: Any, dotted: str) -> Any:
    """The value at ``dotted`` in a config object or nested mapping (``MISSING`` if none)."""
    current = values
    for part in dotted.split("."):
        if isinstance(current, Mapping):
            if part not in current:
                return dataclasses.MISSING
            current = current[part]
        elif hasattr(current, part) or dataclasses.is_dataclass(current):
            current = getattr(current, part, dataclasses.MISSING)
        else:
            return dataclasses.MISSING
        if current is dataclasses.MISSING:
            return current
    return current


def _source_value(values: Mapping[str, Any], dotted: str) -> Any:
    """The value a mapping gives for ``dotted``: its flat RLlib key, else the nested one."""
    leaf = dotted.rsplit(".", 1)[-1]
    if FLAT_KEYS.get(leaf) == dotted and leaf in values:
        return values[leaf]
    return lookup(values, dotted)


def fill_derived(section: S, source: Callable[[str], Any],
                  extra: Mapping[str, Any] | None = None) -> S:
    """``section`` with its derived fields taken from ``source(dotted)`` where it has them
    (``MISSING`` where not), then ``extra``."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        origin = f.metadata.get("derived_from")
        if origin and origin not in (WORKER, ALGORITHM):
            value = source(origin)
            if value is not dataclasses.MISSING:
                changes[f.name] = value
    changes.update(extra or {})
    return dataclasses.replace(section, **changes) if changes else section


def load_component(cls: type[S], values: Mapping[str, Any] | S, *, section: str) -> S:
    """Component config ``cls`` from an algorithm-style mapping (RLlib flat keys and/or the
    ``section`` sub-mapping, e.g. a worker's or a checkpoint's config): keys of other
    components are left to them, unknown keys are refused, derived fields are filled from
    the mapping's own keys (``seed``, ``train_batch_size``...)."""
    if isinstance(values, cls):
        return values
    if isinstance(values, ConfigSection):
        raise ConfigError(f"expected a {cls.__name__} or a mapping, got "
                          f"{type(values).__name__}")
    problems: list[str] = []
    spelling = Spelling()
    own = {key_name(f.name) for f in dataclasses.fields(cls)}
    direct = {k: v for k, v in values.items()
              if k in own and k not in FLAT_KEYS and k != section}
    rest = {k: v for k, v in values.items() if k not in direct}
    nested = nest_flat_keys(rest, {section}, set(_TOP_LEVEL_KEYS), problems, spelling,
                   skip_others=True, settings=own)
    if direct:
        nested[section] = {**dict(nested.get(section) or {}), **direct}
    loaded = None
    if not problems:
        given = nested.get(section, {})
        derived_values: dict[str, Any] = {}
        if isinstance(given, Mapping):
            for f in dataclasses.fields(cls):
                origin = f.metadata.get("derived_from")
                if origin and origin not in (WORKER, ALGORITHM) and \
                        key_name(f.name) not in given:
                    value = _source_value(values, origin)
                    if value is not dataclasses.MISSING:
                        derived_values[key_name(f.name)] = value
            given = {**derived_values, **given}  # a value given in the section wins
        loaded = load_section(cls, given, f"{section}.", None, problems, spelling,
                               strict=False)
    if problems or loaded is None:
        raise ConfigError(f"invalid {cls.__name__}:", problems=problems)
    return loaded


def load_worker_config(values: Mapping[str, Any] | WorkerConfig,
                       policy_config_cls: type[ConfigSection]) -> WorkerConfig:
    """A :class:`WorkerConfig` from a worker's or an algorithm's config mapping (flat or
    nested; see :func:`load_component`)."""
    if isinstance(values, WorkerConfig):
        return values
    problems: list[str] = []
    parts: dict[str, ConfigSection] = {}
    for name, cls in (("rollout", RolloutConfig), ("policy", policy_config_cls)):
        try:
            parts[name] = load_component(cls, values, section=name)
        except ConfigError as exc:
            problems.extend(exc.problems or [str(exc)])
    if problems:
        unique = list(dict.fromkeys(problems))
        raise ConfigError("invalid worker config:", problems=unique)
    return WorkerConfig(rollout=parts["rollout"], policy=parts["policy"])  # type: ignore[arg-type]
