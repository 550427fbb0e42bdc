"""Typed configs: one frozen dataclass per component, composed in each algorithm's config.

Layout
    A component's settings are one :class:`ConfigSection` subclass with its defaults and a
    docstring per field: :class:`RolloutConfig` (here), the policy configs
    (``actorrl.policy.config``), ``actorrl.replay.config.ReplayConfig`` and
    ``actorrl.learner.config.LearnerConfig``. An algorithm's config (``ApexConfig``,
    ``ImpalaConfig``...; base :class:`AlgorithmConfig`) holds the job-level keys at its top
    level and one section per component (``rollout``, ``policy``, ``replay``,
    ``learner``). Each dataclass states RLlib's defaults; what an algorithm sets over them
    (tuned for CartPole-v1 on 2 cores) is the one table
    ``actorrl.algorithms.tuned.CARTPOLE_TUNED``, applied as the algorithm's field defaults
    and its sections' default instances.

Shared values
    A value several components need is set in one place only. A section field marked with
    :func:`derived` (e.g. the DQN policy's ``train_batch_size``) is filled from that place
    when the algorithm builds the component's config (:meth:`AlgorithmConfig.component`),
    and is refused as input inside the section.

Input
    :func:`load_config` takes nested sections (``{"replay": {"buffer_size": 1000}}``) or
    RLlib's flat names (``buffer_size: 1000``), mapped once in :data:`FLAT_KEYS`; a flat key
    given next to its section overrides the section's value. RLlib's other spellings of a
    setting (2.x names, ``replay_buffer_config: {capacity}``, Ape-X's ``optimizer: {...}``)
    and its keys that change nothing here (``framework: tf``) are read first, through the
    one alias table in :mod:`actorrl.config.aliases`. Unknown keys are refused at every
    level with their dotted path (``replay.alpha``) and close matches; every problem is
    reported at once as a :class:`ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from actorrl.config.aliases import ALIAS_BY_KEY, ALIASES, RLLIB_ONLY_KEYS, resolve_rllib_keys
from transport.codec import register_type
from transport.error_types import register_error

S = TypeVar("S", bound="ConfigSection")
C = TypeVar("C", bound="AlgorithmConfig")

WORKER = "worker"
"""``derived`` source of values a worker sets itself (its index)."""
ALGORITHM = "algorithm"
"""``derived`` source of values each algorithm sets (:meth:`AlgorithmConfig.derived_values`)."""


@register_error  # a coordinator's ConfigError reaches a client as ConfigError
class ConfigError(ValueError):
    """A config has unknown keys or invalid values; the message lists them all.

    ``ConfigError("invalid X:", problems=[...])`` keeps each problem in ``problems`` and
    writes them below the first line, one ``  - problem`` line each; a plain
    ``ConfigError(message)`` has no list. (Raised on the caller's side of a call, a remote
    one has the whole text as its message and an empty list.)
    """

    problems: tuple[str, ...] = ()

    def __init__(self, message: str, *, problems: Sequence[str] | None = None) -> None:
        if problems is not None:
            message += "\n  - " + "\n  - ".join(problems)
        super().__init__(message)
        self.problems = tuple(problems or ())


def derived(default: Any, source: str) -> Any:
    """A section field whose value the algorithm fills from ``source`` (a dotted key of the
    algorithm config, :data:`WORKER` or :data:`ALGORITHM`); refused as input inside the
    section, so the value has one place."""
    return field(default=default, metadata={"derived_from": source})


def checked(default_factory: Callable[[], Any], check: Callable[[Any], list[tuple[str, str]]]
            ) -> Any:
    """A mapping field validated by ``check(value) -> [(subkey, problem)]`` at load time."""
    return field(default_factory=default_factory, metadata={"check": check})


def _key_name(name: str) -> str:
    """The config key of field ``name`` (``lambda_`` is written ``lambda``)."""
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


@dataclass(frozen=True, kw_only=True)
class ConfigSection:
    """Base of every config dataclass: validated on construction (raising
    :class:`ConfigError` with all problems), loadable from a mapping, dumpable to one."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every section crosses the wire as itself (tag ``module.Class``): actors receive
        their configs typed. Fields are read when a value is encoded, after ``@dataclass``
        has made them."""
        super().__init_subclass__(**kwargs)

        def to_wire(section: ConfigSection) -> dict[str, Any]:
            return {f.name: getattr(section, f.name)
                    for f in dataclasses.fields(section) if f.init}

        register_type(cls, f"{cls.__module__}.{cls.__qualname__}", to_wire,
                      lambda fields: cls(**fields))

    def __post_init__(self) -> None:
        problems = self.validate()
        if problems:
            raise ConfigError(f"invalid {type(self).__name__}:", problems=problems)

    def validate(self) -> list[str]:
        """Every problem with the values (empty when valid); subclasses extend it."""
        return []

    def to_dict(self, *, include_derived: bool = True) -> dict[str, Any]:
        """The settings as plain data (sections nested, ``lambda_`` as ``lambda``); without
        ``include_derived`` only the keys a user sets in this section."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if not include_derived and f.metadata.get("derived_from"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, ConfigSection):
                value = value.to_dict(include_derived=include_derived)
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, (dict, list)):
                value = json_copy(value)
            out[_key_name(f.name)] = value
        return out

    @classmethod
    def load(cls: type[S], values: Mapping[str, Any], *, path: str = "",
             base: S | None = None) -> S:
        """``cls`` from ``values`` (over ``base``'s values when given), refusing unknown
        keys; derived fields are accepted (a component loaded on its own)."""
        problems: list[str] = []
        out = _load_section(cls, values, path, base, problems, _Spelling(), strict=False)
        if problems or out is None:
            raise ConfigError(f"invalid {cls.__name__}:", problems=problems)
        return out

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` applied (validated; derived fields may be changed)."""
        return dataclasses.replace(self, **changes)


def json_copy(value: Any) -> Any:
    """A deep copy of dicts and lists (other values shared)."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_copy(v) for v in value]
    return value


# ---- loading --------------------------------------------------------------------------
class _Spelling:
    """Where a user wrote a value, to name it in problems as they did (``model.x`` for a
    flat ``model`` key rather than ``policy.model.x``)."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}

    def show(self, dotted: str) -> str:
        """``dotted`` as the user spelled it."""
        for real, alias in self.aliases.items():
            if dotted == real or dotted.startswith(real + "."):
                return alias + dotted[len(real):]
        return dotted


def _suggest(key: str, known: list[str]) -> str:
    """"; did you mean ..." for an unknown ``key``, except for RLlib keys whose near names
    in actorrl mean something else (:data:`~actorrl.config.aliases.RLLIB_ONLY_KEYS`)."""
    if key in RLLIB_ONLY_KEYS:
        return f": an RLlib key actorrl does not have ({RLLIB_ONLY_KEYS[key]})"
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    close += [k for k in known if len(key) >= 3 and key in k and k not in close][:3]
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _field_for(fields: dict[str, dataclasses.Field], key: str) -> str | None:
    if key in fields:
        return key
    if f"{key}_" in fields:  # RLlib keys that are Python keywords (lambda)
        return f"{key}_"
    return None


def _section_type(annotation: Any) -> type[ConfigSection] | None:
    return annotation if isinstance(annotation, type) and issubclass(
        annotation, ConfigSection) else None


def _load_section(cls: type[S], values: Any, path: str, base: S | None, problems: list[str],
                  spelling: _Spelling, *, strict: bool) -> S | None:
    """``cls`` from ``values`` over ``base``; problems appended (``None`` then). With
    ``strict`` (inside an algorithm config) derived fields are refused."""
    if isinstance(values, ConfigSection):
        values = values.to_dict(include_derived=not strict)
    if not isinstance(values, Mapping):
        problems.append(f"{spelling.show(path.rstrip('.'))} must be a mapping, got "
                        f"{values!r} ({type(values).__name__})")
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    clean: dict[str, Any] = {}
    before = len(problems)
    for key, value in values.items():
        name = _field_for(fields, str(key))
        where = spelling.show(f"{path}{key}")
        if name is None or (name.startswith("_") and not name.startswith("_fake")):
            known = [_key_name(n) for n in fields if not fields[n].metadata.get("derived_from")
                     or not strict]
            problems.append(f"unknown config key {where!r}{_suggest(str(key), known)}")
            continue
        source = fields[name].metadata.get("derived_from")
        if strict and source:
            hint = (f"set {source!r} instead" if source not in (WORKER, ALGORITHM)
                    else "it is set by the " + source)
            problems.append(f"{where!r} is not set here: {hint}")
            continue
        sub = _section_type(hints[name])
        if sub is not None:
            sub_base = getattr(base, name) if base is not None else None
            if sub_base is None and fields[name].default_factory is not dataclasses.MISSING:
                sub_base = fields[name].default_factory()
            loaded = _load_section(sub, value, f"{path}{name}.", sub_base, problems, spelling,
                                   strict=strict)
            if loaded is not None:
                clean[name] = loaded
            continue
        coerced, problem = _check_type(where, value, hints[name])
        if problem:
            problems.append(problem)
            continue
        check = fields[name].metadata.get("check")
        if check is not None:
            problems.extend(f"{spelling.show(f'{path}{key}.{sub_key}')}: {message}"
                            for sub_key, message in check(coerced))
        clean[name] = coerced
    if len(problems) > before:
        return None
    try:
        if base is not None:
            return dataclasses.replace(base, **clean)
        return cls(**clean)
    except ConfigError as exc:
        prefix = spelling.show(path.rstrip(".")) if path else ""
        problems.extend(f"{prefix}: {problem}" if prefix else problem
                        for problem in exc.problems or [str(exc)])
    except (TypeError, ValueError) as exc:
        problems.append(f"{spelling.show(path.rstrip('.')) or cls.__name__}: {exc}")
    return None


def _check_type(key: str, value: Any, annotation: Any) -> tuple[Any, str | None]:
    """Coerce ``value`` to ``annotation`` where that is lossless; else return a problem."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None, None
        for arg in args:
            if arg is type(None):
                continue
            coerced, problem = _check_type(key, value, arg)
            if problem is None:
                return coerced, None
        names = " or ".join("None" if a is type(None) else getattr(a, "__name__", str(a))
                            for a in args)
        return value, f"{key} must be {names}, got {value!r} ({type(value).__name__})"
    target = origin or annotation
    if target is Any:
        return value, None
    if target is bool:
        if isinstance(value, bool):
            return value, None
        return value, f"{key} must be true or false, got {value!r}"
    if target is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        if isinstance(value, float) and value.is_integer():
            return int(value), None
        return value, f"{key} must be an integer, got {value!r} ({type(value).__name__})"
    if target is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
        return value, f"{key} must be a number, got {value!r} ({type(value).__name__})"
    if target is str:
        if isinstance(value, str):
            return value, None
        return value, f"{key} must be a string, got {value!r} ({type(value).__name__})"
    if target in (dict, Mapping):
        if isinstance(value, Mapping):
            return dict(value), None
        return value, f"{key} must be a mapping, got {value!r} ({type(value).__name__})"
    if target in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return value, f"{key} must be a list, got {value!r} ({type(value).__name__})"
        item = args[0] if args else Any
        items = []
        for i, element in enumerate(value):
            coerced, problem = _check_type(f"{key}[{i}]", element, item)
            if problem:
                return value, problem
            items.append(coerced)
        return (tuple(items) if target is tuple else items), None
    return value, None


# ---- the rollout component ------------------------------------------------------------
BATCH_MODES = ("truncate_episodes", "complete_episodes")
MULTIAGENT_KEYS = ("policies", "policy_mapping_fn", "policies_to_train")


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(ConfigSection):
    """How a rollout worker samples (``actorrl.rollout.RolloutWorker``)."""

    num_envs_per_worker: int = 1
    """Envs per worker, stepped together with one batched forward pass."""
    rollout_fragment_length: int = 200
    """Env steps per env per ``sample()`` (RLlib's sample_batch_size); RLlib 2.x's
    ``auto`` is train_batch_size over every worker's envs, rounded up (DQN: 4)."""
    batch_mode: str = "truncate_episodes"
    """``truncate_episodes`` or ``complete_episodes``."""
    explore: bool = True
    """Sample actions (False: the most likely actions)."""
    horizon: int | None = None
    """RLlib's hard horizon: single-agent episodes are cut (truncated, so values bootstrap)
    after this many steps, over any limit the env has (None: where the env ends them)."""
    clip_actions: bool = True
    """Clip Box actions to the action space before ``env.step``."""
    observation_filter: str = "NoFilter"
    """``NoFilter`` or ``MeanStdFilter``: observations normalised by running mean/std
    (clipped to [-10, 10]), kept per worker and merged by the driver every iteration
    (per policy in multi-agent envs; see actorrl.envs.filters)."""
    multiagent: dict[str, Any] = field(default_factory=dict)
    """``policies``, ``policy_mapping_fn``, ``policies_to_train`` (see actorrl.rollout)."""
    env_config: dict[str, Any] = derived(None, "env_config")
    """Passed to the env factory / ``gymnasium.make`` (the algorithm's ``env_config``)."""
    seed: int | None = derived(None, "seed")
    """Env i of worker w: seed + 1000 w + i; torch: seed + w (the algorithm's ``seed``)."""
    callbacks: str | None = derived(None, "callbacks")
    """The callbacks class whose episode and sample hooks the worker runs (the
    algorithm's ``callbacks``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "env_config", dict(self.env_config or {}))
        object.__setattr__(self, "multiagent", dict(self.multiagent or {}))
        super().__post_init__()

    def validate(self) -> list[str]:
        """Sizes >= 1, a known batch mode, known multiagent keys."""
        problems = []
        if self.batch_mode not in BATCH_MODES:
            problems.append(f"batch_mode must be 'truncate_episodes' or 'complete_episodes', "
                            f"got {self.batch_mode!r}")
        for key in ("rollout_fragment_length", "num_envs_per_worker"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be an int >= 1, got {getattr(self, key)!r}")
        if self.horizon is not None and self.horizon < 1:
            problems.append(f"horizon must be an int >= 1 or null, got {self.horizon!r}")
        from actorrl.envs.filters import check_observation_filter

        problems += check_observation_filter(self.observation_filter)
        unknown = sorted(set(self.multiagent) - set(MULTIAGENT_KEYS))
        if unknown:
            problems.append(f"unknown multiagent key(s) {unknown}; allowed: "
                            f"{list(MULTIAGENT_KEYS)}")
        return problems


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(ConfigSection):
    """What a rollout worker (and the learner's local worker) receives: how to sample and
    its policy's settings, derived values filled in."""

    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling settings."""
    policy: ConfigSection
    """The policy class's config (``policy_cls.config_class``)."""


# ---- flat RLlib keys ------------------------------------------------------------------
_POLICY_KEYS = (
    "lr", "gamma", "grad_clip", "model", "adam_epsilon", "n_step", "double_q", "dueling",
    "hiddens", "huber_threshold", "target_network_update_freq", "exploration_config",
    "per_worker_exploration", "vtrace", "vtrace_clip_rho_threshold",
    "vtrace_clip_pg_rho_threshold", "vf_loss_coeff", "entropy_coeff", "opt_type", "decay",
    "momentum", "epsilon", "use_gae", "use_critic", "lambda", "lr_schedule",
    "entropy_coeff_schedule", "clip_param", "vf_clip_param", "use_kl_loss", "kl_coeff",
    "kl_target", "target_update_frequency")
_ROLLOUT_KEYS = ("num_envs_per_worker", "rollout_fragment_length", "batch_mode", "explore",
                 "clip_actions", "observation_filter", "multiagent", "horizon")
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
    "preprocessor_pref")

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
        return f"unknown config key {key!r}{_suggest(key, known)}"
    if alias is not None and alias.deprecated:
        return f"unknown config key {key!r} (the new name of {written!r})"
    version = f"RLlib {alias.rllib}'s " if alias is not None else ""
    return (f"config key {written!r} ({version}name of {key!r}) is not a setting of "
            f"{algorithm or 'this algorithm'}: drop it, or use an algorithm that has "
            f"{key!r}")


def _nest(values: Mapping[str, Any], sections: set[str], top_level: set[str],
          problems: list[str], spelling: _Spelling, *, skip_others: bool,
          algorithm: str = "") -> dict[str, Any]:
    """``values`` with RLlib's other spellings read as actorrl's keys
    (:func:`~actorrl.config.aliases.resolve_rllib_keys`, for ``algorithm``) and flat keys
    moved into their sections (flat over nested). With ``skip_others``, keys that belong
    to sections or top-level keys outside ``sections`` / ``top_level`` (another
    component's) are left out; unknown keys are always refused."""
    resolution = resolve_rllib_keys(values, algorithm=algorithm)
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


def _lookup(values: Any, dotted: str) -> Any:
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
    return _lookup(values, dotted)


def _fill_derived(section: S, source: Callable[[str], Any],
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
    spelling = _Spelling()
    own = {_key_name(f.name) for f in dataclasses.fields(cls)}
    direct = {k: v for k, v in values.items()
              if k in own and k not in FLAT_KEYS and k != section}
    rest = {k: v for k, v in values.items() if k not in direct}
    nested = _nest(rest, {section}, set(_TOP_LEVEL_KEYS), problems, spelling,
                   skip_others=True)
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
                        _key_name(f.name) not in given:
                    value = _source_value(values, origin)
                    if value is not dataclasses.MISSING:
                        derived_values[_key_name(f.name)] = value
            given = {**derived_values, **given}  # a value given in the section wins
        loaded = _load_section(cls, given, f"{section}.", None, problems, spelling,
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


# ---- algorithm configs ----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig(ConfigSection):
    """Settings shared by every algorithm (RLlib names); components in sections.

    Subclasses add a ``policy`` section (and ``replay``/``learner`` where they have those
    components). RLlib's flat names stay readable as attributes (``config.lr`` is
    ``config.policy.lr``)."""

    SECTIONS: ClassVar[tuple[str, ...]] = ("rollout", "policy")

    env: str = "CartPole-v1"
    """Gymnasium id or ``"pkg.module:factory"``."""
    env_config: dict[str, Any] = field(default_factory=dict)
    """Passed to the env factory / ``gymnasium.make``."""
    num_workers: int = 2
    """Rollout worker processes."""
    train_batch_size: int = 500
    """Rows per SGD step."""
    num_gpus: float = 0.0
    """GPUs for the learner (towers); 0 = CPU."""
    _fake_gpus: bool = False
    """Build ``num_gpus`` learner towers on the CPU (testing)."""
    num_cpus_per_worker: float = 1.0
    """CPUs each rollout worker asks for; its torch runs that many intra-op threads."""
    num_cpus_for_driver: float = 1.0
    """CPUs the learner process asks for (RLlib's learner runs in its driver); its torch
    runs that many intra-op threads. With paced workers (``training_intensity``) the
    learner is the bottleneck: 2 on a 2-core machine nearly doubles its rate."""
    seed: int | None = None
    """Seed for envs and torch (per worker: seed + worker index)."""
    min_iter_time_s: float = 2.0
    """Minimum wall time of one training iteration (one result)."""
    timesteps_per_iteration: int = 0
    """Minimum env steps sampled per iteration."""
    metrics_smoothing_episodes: int = 100
    """Episodes averaged in episode_reward_mean."""
    callbacks: str | None = None
    """``"pkg.module:Class"``, a subclass of ``actorrl.callbacks.DefaultCallbacks``:
    episode and sample hooks run on the rollout workers, ``on_train_result`` on the
    driver; episodes' ``custom_metrics`` appear in results (None: no callbacks)."""
    evaluation_interval: int | None = None
    """Evaluate every this many training iterations (None or 0: never); the result of
    such an iteration gains an ``evaluation`` section with the episode stats."""
    evaluation_duration: int = 10
    """How much to evaluate each time, in ``evaluation_duration_unit``s (>= 1)."""
    evaluation_duration_unit: str = "episodes"
    """``episodes`` (at least that many finished episodes) or ``timesteps`` (env steps)."""
    evaluation_num_workers: int = 0
    """Evaluation worker processes, apart from the training workers (0: one; RLlib's 0
    evaluates in its driver process)."""
    evaluation_config: dict[str, Any] = field(default_factory=dict)
    """Config keys overridden for the evaluation workers (rollout and policy keys, e.g.
    ``env_config``, ``explore``); ``explore`` is false unless set here."""
    preprocessor_pref: str | None = "deepmind"
    """Atari ids always get DeepMind preprocessing (``actorrl.envs.atari``): ``deepmind``;
    ``rllib`` or null (RLlib's generic preprocessor or none) are accepted with a warning
    that DeepMind preprocessing is used anyway; no effect on other envs."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How the rollout workers sample."""

    def __post_init__(self) -> None:
        """Fold RLlib's Atari ``model`` keys (``dim``, ``grayscale``, ``framestack``) into
        ``env_config`` (:func:`actorrl.envs.atari.model_env_config`), so workers, evaluation
        and checkpoints all build the env the model was made for; then validate."""
        model = getattr(getattr(self, "policy", None), "model", None)
        if model:
            from actorrl.envs.atari import model_env_config

            env_config, problems = model_env_config(self.env, self.env_config, model)
            if not problems:  # validate() reports them
                object.__setattr__(self, "env_config", env_config)
        super().__post_init__()

    def __getattr__(self, name: str) -> Any:
        dotted = FLAT_KEYS.get(name) or FLAT_KEYS.get(_key_name(name))
        if dotted and "." in dotted:
            section, leaf = dotted.split(".", 1)
            holder = self.__dict__.get(section)
            if holder is not None:
                for leaf_name in (leaf, f"{leaf}_"):
                    if leaf_name in holder.__dict__:
                        return holder.__dict__[leaf_name]
        raise AttributeError(f"{type(self).__name__} has no config key {name!r}")

    def validate(self) -> list[str]:
        """Every problem with the top-level values (sections validate themselves)."""
        problems = []

        def positive(key: str, allow_zero: bool = False) -> None:
            value = getattr(self, key)
            if value < 0 or (value == 0 and not allow_zero):
                bound = ">= 0" if allow_zero else "> 0"
                problems.append(f"{key} must be {bound}, got {value!r}")

        positive("num_workers", allow_zero=True)
        positive("train_batch_size")
        positive("num_gpus", allow_zero=True)
        positive("num_cpus_per_worker", allow_zero=True)
        positive("num_cpus_for_driver", allow_zero=True)
        positive("min_iter_time_s", allow_zero=True)
        positive("timesteps_per_iteration", allow_zero=True)
        positive("metrics_smoothing_episodes")
        from actorrl.callbacks import check_callbacks

        problems += check_callbacks(self.callbacks)
        problems += self._evaluation_problems()
        problems += self._preprocessor_problems()
        if self.rollout.multiagent.get("policies") and self.num_gpus > 1:
            problems.append(
                f"multiagent.policies cannot be used with num_gpus > 1 (got {self.num_gpus:g}): "
                "the multi-tower learner trains one policy, as in RLlib; set num_gpus <= 1 "
                "or drop multiagent.policies")
        return problems

    def _preprocessor_problems(self) -> list[str]:
        """``preprocessor_pref`` and the Atari ``model`` keys (see ``__post_init__``).
        ``rllib``/null on an Atari id warn rather than fail: ported RLlib configs keep
        working, with the frames actorrl's DeepMind wrappers make."""
        problems = []
        pref = self.preprocessor_pref
        if pref not in ("deepmind", "rllib", None):
            problems.append(f"preprocessor_pref must be 'deepmind', 'rllib' or null, got "
                            f"{pref!r}")
        model = getattr(getattr(self, "policy", None), "model", None)
        needs_atari_check = pref in ("rllib", None) or model
        if not needs_atari_check:
            return problems
        from actorrl.envs.atari import is_atari_id, model_env_config

        if model:
            problems += model_env_config(self.env, self.env_config, model)[1]
        if pref in ("rllib", None) and is_atari_id(self.env):
            warnings.warn(f"preprocessor_pref={pref!r}: actorrl always uses DeepMind "
                          f"preprocessing for Atari ids like {self.env!r}; set "
                          f"preprocessor_pref: deepmind to silence this", UserWarning,
                          stacklevel=2)
        return problems

    def _evaluation_problems(self) -> list[str]:
        problems = []
        if self.evaluation_interval is not None and self.evaluation_interval < 0:
            problems.append(f"evaluation_interval must be >= 1 (or 0/None: no evaluation), "
                            f"got {self.evaluation_interval!r}")
        if self.evaluation_duration < 1:
            problems.append(f"evaluation_duration must be >= 1 (episodes or timesteps per "
                            f"evaluation), got {self.evaluation_duration!r}")
        if self.evaluation_duration_unit not in ("episodes", "timesteps"):
            problems.append("evaluation_duration_unit must be 'episodes' or 'timesteps', "
                            f"got {self.evaluation_duration_unit!r}")
        if self.evaluation_num_workers < 0:
            problems.append(f"evaluation_num_workers must be >= 0, got "
                            f"{self.evaluation_num_workers!r}")
        if self.evaluation_config:
            try:
                self.evaluation_worker_config()
            except ConfigError as exc:
                problems.extend(f"evaluation_config: {problem}"
                                for problem in exc.problems or [str(exc)])
        return problems

    def evaluation_worker_config(self) -> WorkerConfig:
        """What each evaluation worker receives: the workers' config with ``explore``
        off, then ``evaluation_config`` applied."""
        overrides = {"explore": False, **self.evaluation_config}
        allowed = {k for k, dotted in FLAT_KEYS.items()
                   if dotted.split(".")[0] in ("rollout", "policy")} | {"env_config",
                                                                      "callbacks"}
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise ConfigError("invalid evaluation_config:", problems=[
                f"key {k!r} cannot be overridden for evaluation (rollout and policy keys, "
                f"env_config and callbacks can){_suggest(k, sorted(allowed))}"
                for k in unknown])
        base = self.to_dict()
        return type(self).load_evaluation(base, overrides)

    @classmethod
    def load_evaluation(cls, base: Mapping[str, Any], overrides: Mapping[str, Any]
                        ) -> WorkerConfig:
        """``base`` (a config dict) with ``overrides`` (flat keys), as a worker config."""
        values = {k: v for k, v in base.items() if k != "evaluation_config"}
        return load_config(cls, {**values, **overrides}).worker_config()

    def to_dict(self, *, include_derived: bool = False) -> dict[str, Any]:
        """All settings, sections nested, as plain data (what checkpoints and results
        folders store; :func:`load_config` reads it back)."""
        return super().to_dict(include_derived=include_derived)

    def replace(self: C, **changes: Any) -> C:  # type: ignore[override]
        """A copy with ``changes`` (flat RLlib keys or sections) applied, validated."""
        return load_config(type(self), {**self.to_dict(), **changes})

    # ---- building components ----------------------------------------------------------
    def derived_values(self, section: str) -> dict[str, Any]:
        """Values of ``section``'s :data:`ALGORITHM`-derived fields; subclasses add theirs."""
        return {}

    def component(self, section: str) -> Any:
        """The config the ``section`` component receives: the section with its derived
        fields filled from this config."""
        return _fill_derived(getattr(self, section), lambda dotted: _lookup(self, dotted),
                             self.derived_values(section))

    def worker_config(self) -> WorkerConfig:
        """What each rollout worker receives."""
        return WorkerConfig(rollout=self.component("rollout"),
                            policy=self.component("policy"))


def config_fields(cls: type[AlgorithmConfig]) -> dict[str, dataclasses.Field]:
    """The config's keys by name: its top-level fields and the flat RLlib names of its
    sections' fields."""
    out = {f.name: f for f in dataclasses.fields(cls) if f.name not in cls.SECTIONS}
    hints = typing.get_type_hints(cls)
    for section in cls.SECTIONS:
        section_cls = _section_type(hints.get(section))
        if section_cls is None:
            continue
        for f in dataclasses.fields(section_cls):
            if not f.metadata.get("derived_from") and \
                    FLAT_KEYS.get(_key_name(f.name)) == f"{section}.{_key_name(f.name)}":
                out[_key_name(f.name)] = f
    return out


def algorithm_key(cls: type[AlgorithmConfig]) -> str:
    """The algorithm name of a config class (``ApexConfig`` -> ``apex``)."""
    return cls.__name__.removesuffix("Config").lower()


def load_config(cls: type[C], values: Mapping[str, Any]) -> C:
    """Build ``cls`` from ``values`` (flat RLlib keys and/or nested sections), reporting
    unknown keys (with their dotted path and suggestions), wrong types and invalid values
    all at once as a :class:`ConfigError`."""
    problems: list[str] = []
    spelling = _Spelling()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    sections = set(cls.SECTIONS) & set(fields)
    top_level = {n for n in fields if n not in sections and
                 (not n.startswith("_") or n.startswith("_fake"))}
    nested = _nest(values, sections, top_level, problems, spelling, skip_others=False,
                   algorithm=algorithm_key(cls))
    _auto_fragment_length(cls, nested, problems)
    hints = typing.get_type_hints(cls)
    clean: dict[str, Any] = {}
    for key, value in nested.items():
        if key in sections:
            section_cls = _section_type(hints[key])
            assert section_cls is not None
            default = fields[key].default_factory()  # type: ignore[misc]
            loaded = _load_section(section_cls, value, f"{key}.", default, problems,
                                   spelling, strict=True)
            if loaded is not None:
                clean[key] = loaded
            continue
        coerced, problem = _check_type(key, value, hints[key])
        if problem:
            problems.append(problem)
        else:
            clean[key] = coerced
    if problems:
        raise ConfigError(f"invalid {cls.__name__}:", problems=problems)
    return cls(**clean)


AUTO = "auto"
"""RLlib 2.x's ``rollout_fragment_length: auto``."""


def _auto_fragment_length(cls: type[AlgorithmConfig], nested: dict[str, Any],
                          problems: list[str]) -> None:
    """RLlib 2.x's ``rollout_fragment_length: auto``, made a number in ``nested``:
    ``train_batch_size`` split over every worker's envs (rounded up, so one round of
    fragments fills a train batch). Rollout sections that take ``auto`` themselves (PPO's,
    DQN's) resolve it as their algorithm does."""
    rollout = nested.get("rollout")
    if not isinstance(rollout, Mapping) or rollout.get("rollout_fragment_length") != AUTO:
        return
    fields = {f.name: f for f in dataclasses.fields(cls)}
    section_cls = _section_type(typing.get_type_hints(cls).get("rollout"))
    if section_cls is None or \
            typing.get_type_hints(section_cls)["rollout_fragment_length"] is not int:
        return

    def value(dotted: str) -> Any:
        found = _lookup(nested, dotted)
        if found is not dataclasses.MISSING:
            return found
        section, _, leaf = dotted.rpartition(".")
        field_ = fields.get(section or leaf)
        if field_ is None:
            return dataclasses.MISSING
        default = (field_.default_factory() if field_.default_factory is not dataclasses.MISSING
                   else field_.default)
        return getattr(default, leaf) if section else default

    batch, workers = value("train_batch_size"), value("num_workers")
    envs = value(FLAT_KEYS["num_envs_per_worker"])
    if batch is dataclasses.MISSING:
        problems.append(f"rollout_fragment_length: 'auto' splits train_batch_size over the "
                        f"workers, and {algorithm_key(cls)} has no train_batch_size: set "
                        "rollout_fragment_length to a number")
        return
    try:
        length = max(1, math.ceil(batch / (max(1, workers) * envs)))
    except TypeError:
        return  # the bad values are reported by their own checks
    nested["rollout"] = {**rollout, "rollout_fragment_length": length}


def flat_config(config: AlgorithmConfig) -> dict[str, Any]:
    """``config``'s values under RLlib's flat key names (:data:`FLAT_KEYS`; the keys of
    sections the algorithm lacks are left out), for code written against flat dicts."""
    nested = config.to_dict()
    out: dict[str, Any] = {}
    for key, dotted in FLAT_KEYS.items():
        value = _lookup(nested, dotted)
        if value is not dataclasses.MISSING:
            out[key] = value
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> (key, value) with the value parsed as JSON when it is valid JSON
    (numbers, true/false, null, lists, objects) and kept as a string otherwise."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key=value")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        lowered = raw.strip().lower()
        value = {"true": True, "false": False, "none": None}.get(lowered, raw)
    return key.strip(), value


def read_config_file(path: str) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON config file into a dict."""
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist")
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config file {path!r} is not valid JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of keys to values")
    return data
