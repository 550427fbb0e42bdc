"""actorrl: distributed RL pipelines on a small asyncio + ZeroMQ actor runtime.

The package root is the public face: the names below are what scripts import
(``from actorrl import Trainer, get_algorithm, load_config, Driver``). They are loaded on
first use, so ``import actorrl`` (and every process that imports a submodule, such as an
actor process or the fork server) does not pay for torch or gymnasium until it needs them.

Modules moved by the package layout of 0.2 keep their old names for one release: importing
``actorrl.batch``, ``actorrl.client``, ``actorrl.runtime.core`` and the rest of
:data:`MOVED_MODULES` gives the module under its new name, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

__version__ = "0.2.0"

_PUBLIC: dict[str, str] = {
    # training
    "Trainer": "actorrl.algorithms.trainer",
    "AlgorithmSpec": "actorrl.algorithms.trainer",
    "get_algorithm": "actorrl.algorithms.registry",
    "algorithm_names": "actorrl.algorithms.registry",
    "AlgorithmConfig": "actorrl.config.algorithm",
    "ConfigError": "actorrl.config.sections",
    "load_config": "actorrl.config.algorithm",
    "read_config_file": "actorrl.config.files",
    "DefaultCallbacks": "actorrl.callbacks",
    # trained policies
    "load_policy": "actorrl.experiment.inference",
    # data and envs
    "SampleBatch": "actorrl.data.batch",
    "MultiAgentBatch": "actorrl.data.batch",
    "EnvContext": "actorrl.envs.make",
    "MultiAgentEnv": "actorrl.envs.make",
    "make_env": "actorrl.envs.make",
    # the actor runtime
    "Driver": "actorrl.runtime.driver",
    "ActorHandle": "actorrl.runtime.process.handles",
    "ObjectRef": "actorrl.runtime.process.refs",
    # a cluster
    "Client": "actorrl.cluster.client",
    "Job": "actorrl.cluster.client",
}
"""Public name -> the module that defines it (imported on first attribute access)."""

MOVED_MODULES: dict[str, str] = {
    "actorrl.classpath": "actorrl.util.classpath",
    "actorrl.storage": "actorrl.util.files",
    "actorrl.metrics": "actorrl.util.stats",
    "actorrl.config_aliases": "actorrl.config.aliases",
    "actorrl.config_reference": "actorrl.config.reference",
    "actorrl.batch": "actorrl.data.batch",
    "actorrl.frames": "actorrl.data.frames",
    "actorrl.spaces": "actorrl.data.spaces",
    "actorrl.atari": "actorrl.envs.atari",
    "actorrl.atari_callbacks": "actorrl.envs.atari_callbacks",
    "actorrl.filters": "actorrl.envs.filters",
    "actorrl.envs.metrics": "actorrl.envs.episodes",
    "actorrl.partial_envs": "actorrl.envs.custom.partial",
    "actorrl.multi_agent_envs": "actorrl.envs.custom.multi_agent",
    "actorrl.envs.pixel": "actorrl.envs.custom.pixel",
    "actorrl.envs.memory": "actorrl.envs.custom.memory",
    "actorrl.envs.rllib_examples": "actorrl.envs.custom.rllib_examples",
    "actorrl.evaluation": "actorrl.algorithms.evaluation",
    "actorrl.stop": "actorrl.algorithms.stop",
    "actorrl.checkpoints": "actorrl.algorithms.checkpoints",
    "actorrl.schedules": "actorrl.policy.schedules",
    "actorrl.policy.complex_encoder": "actorrl.policy.encoders",
    "actorrl.policy.vtrace": "actorrl.policy.advantages",
    "actorrl.cli_cluster": "actorrl.cli.cluster",
    "actorrl.client": "actorrl.cluster.client",
    "actorrl.runtime.core": "actorrl.runtime.process.runtime",
    "actorrl.runtime.actor": "actorrl.runtime.process.handles",
    "actorrl.runtime.refs": "actorrl.runtime.process.refs",
    "actorrl.runtime.spec_wire": "actorrl.runtime.process.wire",
    "actorrl.runtime.peers": "actorrl.runtime.process.peers",
    "actorrl.runtime.calls": "actorrl.runtime.process.calls",
    "actorrl.runtime.frees": "actorrl.runtime.process.frees",
    "actorrl.runtime.owner": "actorrl.runtime.process.owned",
    "actorrl.runtime.hosting": "actorrl.runtime.process.hosting",
    "actorrl.runtime.serial": "actorrl.runtime.process.serial",
    "actorrl.runtime.forking": "actorrl.runtime.node.forking",
    "actorrl.runtime.fork_server": "actorrl.runtime.node.fork_server",
    "actorrl.runtime.fork_protocol": "actorrl.runtime.node.fork_protocol",
    "actorrl.runtime.actor_main": "actorrl.runtime.node.actor_main",
    "actorrl.runtime.resources": "actorrl.runtime.node.resources",
    "actorrl.runtime.coordinator": "actorrl.runtime.cluster.coordinator",
    "actorrl.runtime.callers": "actorrl.runtime.cluster.callers",
    "actorrl.runtime.membership": "actorrl.runtime.cluster.membership",
    "actorrl.runtime.placement": "actorrl.runtime.cluster.placement",
    "actorrl.runtime.node_connections": "actorrl.runtime.cluster.connections",
    "actorrl.runtime.cluster_records": "actorrl.runtime.cluster.records",
    "actorrl.runtime.node_agent": "actorrl.runtime.cluster.node_agent",
    "actorrl.runtime.cluster_driver": "actorrl.runtime.cluster.driver",
}
"""Old module name -> its name since 0.2 (importable under the old one until 0.3).
(``actorrl.config``, ``actorrl.cli``, ``actorrl.runtime.node`` and
``actorrl.runtime.process`` are package names now; ``actorrl.config.sections``,
``actorrl.cli.main``, ``actorrl.runtime.node.node`` and ``actorrl.runtime.node.process``
hold what those modules held.)"""


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module's old name as the module under its new name, with a warning."""

    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old name in :data:`MOVED_MODULES`; None for any other."""
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The module under its new name (the same object: one copy of its state)."""
        new = MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old name goes in actorrl 0.3",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._own_specs[spec.name] = module.__spec__
        return module

    def get_code(self, fullname: str) -> Any:
        """The new module's code, for ``python -m OLD_NAME`` (runpy runs it as
        ``__main__``; scripts and service files written before the move keep working)."""
        new = MOVED_MODULES[fullname]
        warnings.warn(f"{fullname} moved to {new}; run `python -m {new}` (the old name goes "
                      "in actorrl 0.3)", DeprecationWarning, stacklevel=2)
        spec = importlib.util.find_spec(new)
        if spec is None or spec.loader is None:
            raise ImportError(f"{new} (the new name of {fullname}) cannot be found")
        return spec.loader.get_code(new)  # type: ignore[attr-defined]

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module was executed under its new name); the import system
        set the old name's spec on it, so its own is put back."""
        module.__spec__ = self._own_specs.pop(module.__spec__.name, module.__spec__)


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'actorrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = sorted(_PUBLIC)
