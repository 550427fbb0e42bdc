"""The docs' config reference (docs/configuration.md) matches the config dataclasses."""

from __future__ import annotations

from pathlib import Path

from actorrl.config.reference import main

REFERENCE_PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_config_reference_is_up_to_date() -> None:
    """Every key, default and docstring in the config reference comes from the code as it is."""
    assert main(["--check", str(REFERENCE_PAGE)]) == 0, (
        "run `python -m actorrl.config.reference --write docs/configuration.md`")
