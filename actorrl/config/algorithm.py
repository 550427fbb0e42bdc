"""The algorithm config: :class:`AlgorithmConfig` (the job-level keys and one section per
component), loading one from a mapping (:func:`load_config`) and writing it back flat.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from actorrl.config.loading import FLAT_KEYS, fill_derived, lookup, nest_flat_keys
from actorrl.config.rollout import RolloutConfig, WorkerConfig
from actorrl.config.sections import (
    ConfigError,
    ConfigSection,
    Spelling,
    key_name,
    load_field,
    section_type,
    suggest,
)

C = TypeVar("C", bound="AlgorithmConfig")

VIDEO_FOLDER = "videos"
"""The results folder's sub-folder of evaluation videos with ``record_env: true``."""


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
    record_env: bool | str = False
    """RLlib's ``record_env`` (``monitor`` is its older spelling): record every evaluation
    episode (``evaluation_interval``'s workers; training episodes are not recorded) to an
    mp4: ``true`` writes to ``<results folder>/videos/``, a relative path to that folder
    under the results folder, an absolute path there. Needs the ``video`` extra and an env
    that renders ``rgb_array`` (see actorrl.envs.video); also accepted in
    ``evaluation_config``, which wins."""
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
        dotted = FLAT_KEYS.get(name) or FLAT_KEYS.get(key_name(name))
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
        problems += self._record_env_problems()
        return problems

    def evaluation_record_env(self) -> bool | str:
        """The ``record_env`` the evaluation workers use: ``evaluation_config``'s, else the
        top-level one."""
        return self.evaluation_config.get("record_env", self.record_env)

    def video_dir(self, results_dir: str | os.PathLike[str] | None) -> Path | None:
        """Where the evaluation episodes' videos go (None: not recorded): ``record_env:
        true`` is ``<results_dir>/videos``; a relative path is taken under ``results_dir``
        (the current folder when None), as RLlib joins it to the trial's log dir; an
        absolute path as given."""
        record = self.evaluation_record_env()
        if record is False or record is None or record == "":
            return None
        base = Path(results_dir) if results_dir is not None else Path.cwd()
        if record is True:
            return base / VIDEO_FOLDER
        path = Path(os.path.expanduser(str(record)))
        return path if path.is_absolute() else base / path

    def _record_env_problems(self) -> list[str]:
        record = self.evaluation_record_env()
        if record is False or record is None:
            return []
        if not isinstance(record, (bool, str)) or record == "":
            return [f"record_env must be true, false or a folder path, got {record!r}"]
        if not self.evaluation_interval:
            return [f"record_env: {record!r} records the evaluation episodes, and "
                    "evaluation_interval is not set: set evaluation_interval (e.g. 1: "
                    "evaluate and record after every iteration), or drop record_env"]
        from actorrl.envs.video import check_video_support

        try:
            check_video_support()
        except ValueError as exc:
            return [f"record_env: {record!r}: {exc}"]
        return []

    def evaluation_worker_config(self) -> WorkerConfig:
        """What each evaluation worker receives: the workers' config with ``explore``
        off, then ``evaluation_config`` applied."""
        overrides = {"explore": False, **self.evaluation_config}
        allowed = {k for k, dotted in FLAT_KEYS.items()
                   if dotted.split(".")[0] in ("rollout", "policy")} | {
            "env_config", "callbacks", "record_env"}
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise ConfigError("invalid evaluation_config:", problems=[
                f"key {k!r} cannot be overridden for evaluation (rollout and policy keys, "
                f"env_config, callbacks and record_env can){suggest(k, sorted(allowed))}"
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
        return fill_derived(getattr(self, section), lambda dotted: lookup(self, dotted),
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
        section_cls = section_type(hints.get(section))
        if section_cls is None:
            continue
        for f in dataclasses.fields(section_cls):
            if not f.metadata.get("derived_from") and \
                    FLAT_KEYS.get(key_name(f.name)) == f"{section}.{key_name(f.name)}":
                out[key_name(f.name)] = f
    return out


def algorithm_key(cls: type[AlgorithmConfig]) -> str:
    """The algorithm name of a config class (``ApexConfig`` -> ``apex``)."""
    return cls.__name__.removesuffix("Config").lower()


def load_config(cls: type[C], values: Mapping[str, Any]) -> C:
    """Build ``cls`` from ``values`` (flat RLlib keys and/or nested sections), reporting
    unknown keys (with their dotted path and suggestions), wrong types and invalid values
    all at once as a :class:`ConfigError`."""
    problems: list[str] = []
    spelling = Spelling()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    sections = set(cls.SECTIONS) & set(fields)
    top_level = {n for n in fields if n not in sections and
                 (not n.startswith("_") or n.startswith("_fake"))}
    nested = nest_flat_keys(values, sections, top_level, problems, spelling,
                            skip_others=False, algorithm=algorithm_key(cls),
                            settings=set(config_fields(cls)))
    _auto_fragment_length(cls, nested, problems)
    hints = typing.get_type_hints(cls)
    clean: dict[str, Any] = {}
    for key, value in nested.items():
        default = fields[key].default_factory() if key in sections else None  # type: ignore
        loaded = load_field(hints[key], value, key, key, default, problems, spelling,
                            strict=True)
        if loaded is not dataclasses.MISSING:
            clean[key] = loaded
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
    section_cls = section_type(typing.get_type_hints(cls).get("rollout"))
    if section_cls is None or \
            typing.get_type_hints(section_cls)["rollout_fragment_length"] is not int:
        return

    def value(dotted: str) -> Any:
        found = lookup(nested, dotted)
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
        value = lookup(nested, dotted)
        if value is not dataclasses.MISSING:
            out[key] = value
    return out
