"""Config sections: the base of every config dataclass, and loading one from a mapping.

Layout
    A component's settings are one :class:`ConfigSection` subclass with its defaults and a
    docstring per field: ``actorrl.config.rollout.RolloutConfig``, the policy configs
    (``actorrl.policy.config``), ``actorrl.replay.config.ReplayConfig`` and
    ``actorrl.learner.config.LearnerConfig``. An algorithm's config (``ApexConfig``,
    ``ImpalaConfig``...; base ``actorrl.config.algorithm.AlgorithmConfig``) holds the
    job-level keys at its top level and one section per component (``rollout``,
    ``policy``, ``replay``, ``learner``). Each dataclass states RLlib's defaults; what an
    algorithm sets over them (tuned for CartPole-v1 on 2 cores) is the one table
    ``actorrl.algorithms.tuned.CARTPOLE_TUNED``, applied as the algorithm's field defaults
    and its sections' default instances.

Shared values
    A value several components need is set in one place only. A section field marked with
    :func:`derived` (e.g. the DQN policy's ``train_batch_size``) is filled from that place
    when the algorithm builds the component's config (``AlgorithmConfig.component``), and
    is refused as input inside the section.

Input
    ``actorrl.config.algorithm.load_config`` takes nested sections
    (``{"replay": {"buffer_size": 1000}}``) or RLlib's flat names (``buffer_size: 1000``),
    mapped once in ``actorrl.config.loading.FLAT_KEYS``; a flat key given next to its
    section overrides the section's value. RLlib's other spellings of a setting (2.x
    names, ``replay_buffer_config: {capacity}``, Ape-X's ``optimizer: {...}``) and its keys
    that change nothing here (``framework: tf``) are read first, through the one alias
    table in :mod:`actorrl.config.aliases`. Unknown keys are refused at every level with
    their dotted path (``replay.alpha``) and close matches; every problem is reported at
    once as a :class:`ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from actorrl.config.aliases import RLLIB_ONLY_KEYS
from transport.codec import register_type
from transport.error_types import register_error

S = TypeVar("S", bound="ConfigSection")


WORKER = "worker"
"""``derived`` source of values a worker sets itself (its index)."""


ALGORITHM = "algorithm"
"""``derived`` source of values each algorithm sets (``AlgorithmConfig.derived_values``)."""


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


def key_name(name: str) -> str:
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
            out[key_name(f.name)] = value
        return out

    @classmethod
    def load(cls: type[S], values: Mapping[str, Any], *, path: str = "",
             base: S | None = None) -> S:
        """``cls`` from ``values`` (over ``base``'s values when given), refusing unknown
        keys; derived fields are accepted (a component loaded on its own)."""
        problems: list[str] = []
        out = load_section(cls, values, path, base, problems, Spelling(), strict=False)
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
class Spelling:
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


def suggest(key: str, known: list[str]) -> str:
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


def section_type(annotation: Any) -> type[ConfigSection] | None:
    return annotation if isinstance(annotation, type) and issubclass(
        annotation, ConfigSection) else None


def load_field(annotation: Any, value: Any, path: str, where: str, base: Any,
               problems: list[str], spelling: Spelling, *, strict: bool) -> Any:
    """One field's value: a section (over ``base``) when ``annotation`` is one, else
    ``value`` checked against ``annotation``; ``dataclasses.MISSING`` with the problems
    appended when it is not valid. ``path`` is the field's dotted path, ``where`` how the
    user wrote it."""
    sub = section_type(annotation)
    if sub is not None:
        loaded = load_section(sub, value, f"{path}.", base, problems, spelling, strict=strict)
        return dataclasses.MISSING if loaded is None else loaded
    coerced, problem = check_type(where, value, annotation)
    if problem:
        problems.append(problem)
        return dataclasses.MISSING
    return coerced


def load_section(cls: type[S], values: Any, path: str, base: S | None, problems: list[str],
                 spelling: Spelling, *, strict: bool) -> S | None:
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
            known = [key_name(n) for n in fields if not fields[n].metadata.get("derived_from")
                     or not strict]
            problems.append(f"unknown config key {where!r}{suggest(str(key), known)}")
            continue
        source = fields[name].metadata.get("derived_from")
        if strict and source:
            hint = (f"set {source!r} instead" if source not in (WORKER, ALGORITHM)
                    else "it is set by the " + source)
            problems.append(f"{where!r} is not set here: {hint}")
            continue
        sub_base = None
        if section_type(hints[name]) is not None:  # a section loads over its base
            sub_base = getattr(base, name) if base is not None else None
            if sub_base is None and fields[name].default_factory is not dataclasses.MISSING:
                sub_base = fields[name].default_factory()
        loaded = load_field(hints[name], value, f"{path}{name}", where, sub_base, problems,
                            spelling, strict=strict)
        if loaded is dataclasses.MISSING:
            continue
        check = fields[name].metadata.get("check")
        if check is not None and not isinstance(loaded, ConfigSection):
            problems.extend(f"{spelling.show(f'{path}{key}.{sub_key}')}: {message}"
                            for sub_key, message in check(loaded))
        clean[name] = loaded
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


def check_type(key: str, value: Any, annotation: Any) -> tuple[Any, str | None]:
    """Coerce ``value`` to ``annotation`` where that is lossless; else return a problem."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None, None
        for arg in args:
            if arg is type(None):
                continue
            coerced, problem = check_type(key, value, arg)
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
            coerced, problem = check_type(f"{key}[{i}]", element, item)
            if problem:
                return value, problem
            items.append(coerced)
        return (tuple(items) if target is tuple else items), None
    return value, None
