"""Whether an optional extra's module can be imported (the atari and minatar extras).

A module that is not there means the extra is not installed: its tests skip, saying so,
except in CI (``ACTORRL_CI`` set to anything but ``0``, as ``.ci/run`` does), where both
extras are installed and a missing one must fail the run. A module that is there but
fails to import (a broken install, a missing shared library) always fails: that is a
fault to see, not an extra to skip.
"""

from __future__ import annotations

import importlib
import os

CI_VARIABLE = "ACTORRL_CI"
"""Set (not ``0``) in CI: a missing extra fails instead of skipping."""


class BrokenExtra(RuntimeError):
    """An optional extra's module is missing in CI, or present but fails to import."""


def in_ci() -> bool:
    """Whether this run is CI's (``$ACTORRL_CI`` set and not ``0``)."""
    return os.environ.get(CI_VARIABLE, "0") not in ("", "0")


def installed(module: str) -> bool:
    """True when ``module`` imports; False when it (or its top-level package) is not
    installed, outside CI. Raises :class:`BrokenExtra` when it is installed but does not
    import, and in CI when it is missing."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing_itself = exc.name is not None and (module == exc.name
                                                   or module.startswith(exc.name + "."))
        if not missing_itself:
            raise BrokenExtra(f"{module} is installed but does not import: {exc}") from exc
        if in_ci():
            raise BrokenExtra(f"{module} is not installed, and {CI_VARIABLE} is set: CI "
                              "installs every extra (.ci/run), so its tests must "
                              "run, not skip") from exc
        return False
    except ImportError as exc:
        raise BrokenExtra(f"{module} is installed but does not import: {exc}") from exc
    return True
