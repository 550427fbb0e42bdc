"""A griffe extension for the API reference: Sphinx roles in docstrings as code spans.

actorrl's docstrings name other objects with Sphinx roles (:class:`~actorrl.x.Y`,
:meth:`Calls.submit`), which Markdown would show as written. Each role becomes a code
span of its target (the last component when the target starts with ``~``, as Sphinx
shows it).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")
"""A Sphinx cross-reference role with its target."""


def as_code(match: re.Match[str]) -> str:
    """The role's target as a code span (shortened after ``~``)."""
    tilde, target = match.group(1), match.group(2).strip()
    if "<" in target and target.endswith(">"):  # :class:`shown text <target>`
        return f"`{target.split('<', 1)[0].strip()}`"
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrites every loaded object's docstring once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader,
                  **kwargs: Any) -> None:
        """Replace the Sphinx roles of ``obj``'s docstring with code spans."""
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(as_code, obj.docstring.value)
