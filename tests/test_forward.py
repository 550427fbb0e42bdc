"""The one-line forms of a whole showing its parts (actorrl.util.forward)."""

from __future__ import annotations

import pytest

from actorrl.util.forward import Forwarded, PartAttribute

pytestmark = pytest.mark.unit


class Part:
    def __init__(self) -> None:
        self.value = 1
        self.calls = 0

    def bump(self, by: int) -> int:
        """Add ``by`` to the value."""
        self.calls += 1
        self.value += by
        return self.value


class Whole:
    value = PartAttribute[int]("part")
    renamed = PartAttribute[int]("part", "value")
    bump = Forwarded("part", Part.bump)

    def __init__(self) -> None:
        self.part = Part()


def test_a_part_attribute_reads_the_parts_value_at_every_access() -> None:
    whole = Whole()
    assert whole.value == whole.renamed == 1
    whole.part.value = 5
    assert whole.value == whole.renamed == 5
    replaced = Part()
    replaced.value = 9
    whole.part = replaced
    assert whole.value == 9


def test_a_part_attribute_cannot_be_set_on_the_whole() -> None:
    whole = Whole()
    with pytest.raises(AttributeError, match="'value' is part.value: set it there"):
        whole.value = 3
    assert whole.value == 1


def test_a_forwarded_operation_is_the_parts_bound_method_kept_after_the_first_read() -> None:
    whole = Whole()
    assert "bump" not in vars(whole)
    assert whole.bump(2) == 3 and whole.part.calls == 1
    assert vars(whole)["bump"] == whole.part.bump  # cached: later reads skip the descriptor
    assert Whole.bump.__doc__ == Part.bump.__doc__
