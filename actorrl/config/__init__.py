"""Typed configs and how they are read, one module per job.

- :mod:`~actorrl.config.sections`: :class:`~actorrl.config.sections.ConfigSection`, the
  base of every config dataclass (validation, loading one section, type checks), and
  :class:`~actorrl.config.sections.ConfigError`.
- :mod:`~actorrl.config.rollout`: the rollout worker's sections.
- :mod:`~actorrl.config.loading`: RLlib's flat keys moved into their sections, derived
  values filled, one component loaded from an algorithm-style mapping.
- :mod:`~actorrl.config.algorithm`: :class:`~actorrl.config.algorithm.AlgorithmConfig` and
  :func:`~actorrl.config.algorithm.load_config`.
- :mod:`~actorrl.config.files`: config files and ``--set`` overrides.
- :mod:`~actorrl.config.aliases`: RLlib's other spellings of the same settings, and the
  keys accepted and ignored or refused.
- :mod:`~actorrl.config.reference`: the configuration reference, generated from the
  dataclasses' docstrings.
"""
