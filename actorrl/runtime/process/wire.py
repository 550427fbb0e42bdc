"""An actor's creation spec as plain fields, for the wire (``coord.create_actor``,
``node.start_actor``), and checked back into an :class:`ActorSpec`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actorrl.runtime.process.handles import ActorSpec


def spec_to_wire(spec: ActorSpec) -> list[Any]:
    """An ActorSpec as codec-serializable fields."""
    return [spec.class_path, list(spec.args), dict(spec.kwargs), spec.num_cpus, spec.num_gpus,
            spec.name, dict(spec.env)]


def spec_from_wire(fields: Sequence[Any]) -> ActorSpec:
    """Rebuild an ActorSpec, checking field types (bad input gets a clear error)."""
    if not isinstance(fields, (list, tuple)) or len(fields) != 7:
        raise ValueError("an actor spec is [class_path, args, kwargs, num_cpus, num_gpus, "
                         "name, env]")
    class_path, args, kwargs, num_cpus, num_gpus, name, env = fields
    if not isinstance(class_path, str) or ":" not in class_path and "." not in class_path:
        raise ValueError(f"class path must look like 'pkg.module:Class', got {class_path!r}")
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        raise ValueError("actor args must be a list and kwargs a mapping")
    for value, what in ((num_cpus, "num_cpus"), (num_gpus, "num_gpus")):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{what} must be a number >= 0, got {value!r}")
    if not isinstance(name, str) or not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("actor name must be a string and env a mapping of strings")
    return ActorSpec(class_path, tuple(args), dict(kwargs), float(num_cpus), float(num_gpus),
                     name, dict(env))

