"""Running experiments from the command line: validated training runs, results folders,
checkpoints, live progress, evaluation and learning-curve plots.

Modules (imported on demand; :mod:`actorrl.experiment.signals` needs only the standard
library so the CLI can load it before anything starts a thread):

- :mod:`~actorrl.experiment.train`: input validation and the training run itself
- :mod:`~actorrl.experiment.remote`: the same run on an existing coordinator
- :mod:`~actorrl.experiment.sweep`: ``grid_search``/``num_samples`` sweeps of trials
- :mod:`~actorrl.experiment.results`: the results folder and its writers
- :mod:`~actorrl.experiment.progress`: live display (rich or plain lines)
- :mod:`~actorrl.experiment.signals`: SIGINT/SIGTERM handling
- :mod:`~actorrl.experiment.evaluate`: greedy rollouts of a checkpoint
- :mod:`~actorrl.experiment.plot`: learning curves to PNG
- :mod:`~actorrl.experiment.errors`: usage errors and one-line error summaries
"""
