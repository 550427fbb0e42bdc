"""Attributes and operations a whole shows from one of its parts, one line each.

A class built from parts often offers some of a part's values under the same name
(``coordinator.nodes`` is ``coordinator.membership.nodes``). Written as properties that is
five lines each, all alike; :class:`PartAttribute` says it in one::

    class Coordinator:
        nodes = PartAttribute[dict[str, NodeState]]("membership")
        \"\"\"The live member nodes by id.\"\"\"

The value is read from the part at every access (the part may replace it), and it is
read-only on the whole, as a property without a setter is. :class:`Forwarded` does the
same for a part's method, bound once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

T = TypeVar("T")


class PartAttribute(Generic[T]):
    """A read-only attribute that is the attribute of the same name (or ``name``) of the
    instance's attribute ``part``."""

    def __init__(self, part: str, name: str | None = None) -> None:
        self.part = part
        self.name = name
        self.attribute = name or ""

    def __set_name__(self, owner: type, attribute: str) -> None:
        self.attribute = attribute
        if self.name is None:
            self.name = attribute

    @overload
    def __get__(self, instance: None, owner: type) -> PartAttribute[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return getattr(getattr(instance, self.part), self.name)  # type: ignore[arg-type]

    def __set__(self, instance: object, value: Any) -> None:
        raise AttributeError(f"{self.attribute!r} is {self.part}.{self.name}: set it there")


P = ParamSpec("P")
R = TypeVar("R")


class Forwarded(Generic[P, R]):
    """An operation of one of the instance's parts, offered by the whole:
    ``runtime.submit = Forwarded("calls", Calls.submit)`` is ``runtime.calls.submit``.

    The part's bound method is made at the first read and kept in the instance dict,
    where later reads find it as fast as any attribute (so the part must never be
    replaced). Its docstring is the part method's."""

    def __init__(self, part: str, operation: Callable[Concatenate[Any, P], R]) -> None:
        """``part``: the instance's attribute holding the part; ``operation``: the method of
        the part's class."""
        self.part = part
        self.operation = operation.__name__
        self.name = self.operation
        self.__doc__ = operation.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, runtime: None, owner: type) -> Forwarded[P, R]: ...

    @overload
    def __get__(self, runtime: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, runtime: object | None, owner: type | None = None) -> Any:
        if runtime is None:
            return self
        bound = getattr(getattr(runtime, self.part), self.operation)
        vars(runtime)[self.name] = bound
        return bound
