"""The exception classes a remote failure may be raised as on the caller's side.

A failure crosses the wire as a record: its type name, message and traceback
(:class:`transport.errors.RemoteError`). When the type name is registered here, the error
the caller raises is also an instance of the registered class, so ``except ValueError`` or
``except SomeProjectError`` catches a remote failure of that type. The transport knows no
application classes: each package registers its own with :func:`register_error` (a class
decorator); builtin exceptions are registered here. A name read from the wire only ever
selects an already registered class: it never imports a module, and the class's own
constructor is never run (see :meth:`transport.errors.RemoteError.typed`).

This module imports only the standard library, so light modules (configs) can register
their errors without loading the codec.
"""

from __future__ import annotations

import builtins
from typing import TypeVar

__all__ = ["error_type_name", "register_error", "registered_error"]

E = TypeVar("E", bound=type)

_registry: dict[str, type[Exception]] = {}


def error_type_name(cls: type) -> str:
    """The type name a remote failure of class ``cls`` carries: ``QualName`` for builtins,
    ``module.QualName`` otherwise."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def register_error(cls: E) -> E:
    """Let remote failures of exactly class ``cls`` be raised as instances of it.

    Usable as a class decorator; returns ``cls``. Only ``Exception`` subclasses qualify (a
    remote ``SystemExit`` must not stop the caller). The receiving process must have
    imported the module that registers the class; until then such failures stay plain
    :class:`~transport.errors.RemoteError`. Registering another class under the same name
    (a reloaded module) replaces the earlier one.
    """
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        raise TypeError(f"register_error needs an Exception subclass, got {cls!r}")
    _registry[error_type_name(cls)] = cls
    return cls


def registered_error(type_name: str) -> type[Exception] | None:
    """The class registered under ``type_name``, or None."""
    return _registry.get(type_name)


for _value in vars(builtins).values():
    if isinstance(_value, type) and issubclass(_value, Exception):
        register_error(_value)
