"""The package root's public face: its names resolve lazily, and the module names of
before the layout move still import (as the moved module, with a DeprecationWarning)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import actorrl
from tests.helpers.procs import REPO, child_env

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", actorrl.__all__)
def test_every_public_name_resolves_to_its_definition(name: str) -> None:
    """``actorrl.X`` is the object its defining module holds under that name."""
    value = getattr(actorrl, name)
    module = importlib.import_module(actorrl._PUBLIC[name])
    assert value is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        actorrl.Trainr  # noqa: B018


def test_importing_the_package_loads_neither_torch_nor_numpy() -> None:
    """Processes that import one small module (an actor process, the fork server, the CLI
    before it installs its signal handling) do not pay for the public names."""
    code = ("import sys, actorrl, actorrl.cli.main; "
            "print(sorted(m for m in ('torch', 'numpy', 'gymnasium') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("old", "new"), sorted(actorrl.MOVED_MODULES.items()))
def test_an_old_module_name_imports_the_moved_module_with_a_warning(old: str,
                                                                   new: str) -> None:
    """The old name gives the same module object (one copy of its state), and says where
    it went."""
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(old in m and new in m for m in messages), messages


def test_an_old_class_path_still_resolves() -> None:
    """Config files written before the move (``callbacks: actorrl.atari_callbacks:...``)
    keep working for one release."""
    from actorrl.util.classpath import resolve

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cls = resolve("actorrl.atari_callbacks:AtariCallbacks", "callbacks")
    from actorrl.envs.atari_callbacks import AtariCallbacks

    assert cls is AtariCallbacks


def test_an_old_module_name_still_runs_with_python_m() -> None:
    """``python -m actorrl.cli_cluster ...`` (service files written before the move) runs
    the moved module as ``__main__``, saying where it went."""
    out = subprocess.run([sys.executable, "-W", "default", "-m", "actorrl.cli_cluster",
                          "--help"], cwd=REPO, env=child_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "actorrl cluster commands" in out.stdout
    assert "moved to actorrl.cli.cluster" in out.stderr
