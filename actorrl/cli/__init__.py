"""The ``actorrl`` command: :mod:`~actorrl.cli.main` (train, evaluate, plot, ...) and
:mod:`~actorrl.cli.cluster` (the cluster commands it registers)."""
