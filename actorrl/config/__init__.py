"""Typed configs and how they are read.

- :mod:`~actorrl.config.sections`: the config dataclasses every algorithm composes
  (rollout, worker, model, evaluation, ...), their validation and the loader machinery.
- :mod:`~actorrl.config.aliases`: RLlib's other spellings of the same settings, and the
  keys accepted and ignored or refused.
- :mod:`~actorrl.config.reference`: the configuration reference, generated from the
  dataclasses' docstrings.
"""
