"""Attributes a whole shows from one of its parts, one line each.

A class built from parts often offers some of a part's values under the same name
(``coordinator.nodes`` is ``coordinator.membership.nodes``). Written as properties that is
five lines each, all alike; :class:`PartAttribute` says it in one::

    class Coordinator:
        nodes = PartAttribute[dict[str, NodeState]]("membership")
        \"\"\"The live member nodes by id.\"\"\"

The value is read from the part at every access (the part may replace it), and it is
read-only on the whole, as a property without a setter is.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

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
