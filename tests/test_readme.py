"""The README's config reference matches the config dataclasses."""

from __future__ import annotations

from pathlib import Path

from actorrl.config.reference import main

README = Path(__file__).resolve().parent.parent / "README.md"


def test_config_reference_is_up_to_date() -> None:
    """Every key, default and docstring in the README comes from the code as it is."""
    assert main(["--check", str(README)]) == 0, (
        "run `python -m actorrl.config.reference --write README.md`")
