"""The version of the cluster's wire protocol, checked when a node or a client joins.

Typed values cross the wire with tags derived from module paths (the codec's registered
dataclasses and errors), and the ``coord.*`` / ``node.*`` methods change with the code.
So a node agent or a client of another actorrl release would misdecode or fail to decode
what a coordinator sends, or send it what it cannot read. Each side therefore sends
:data:`WIRE_VERSION` when it joins (``coord.register_node``, ``coord.hello``, a client
session's ``coord.create_actor``); the coordinator refuses any other version, and a peer
that sends none (a release from before this check), with a :class:`WireVersionError`
whose message names both versions and the fix. The joining side shows that message.
"""

from __future__ import annotations

import logging
from typing import Any

from transport.error_types import error_type_name, register_error
from transport.errors import RemoteError

log = logging.getLogger(__name__)

WIRE_VERSION = 1
"""The wire protocol of this release: raise it whenever a message, a ``coord.*`` or
``node.*`` method or a type tag changes in a way older peers would misread. 1: the
package layout of 0.2 (type tags of ``actorrl.config.sections`` and friends). Peers of
earlier releases send no version."""
FIX = ("install the same actorrl version on every host (`pip show actorrl` shows a "
       "host's), then start it again")
"""What to do about a refused version (the end of every refusal's message)."""
MAX_REMEMBERED = 1_000
"""Refused peers remembered so each is logged once (an old node retries forever)."""


@register_error
class WireVersionError(ConnectionError):
    """A coordinator refused a peer of another wire version (the message names both
    versions and what to do); retrying does not help. The coordinator raises it as a
    :class:`~transport.errors.RemoteError` without a traceback (the refusal is the whole
    story), which callers catch as this class."""


def describe_version(version: Any) -> str:
    """``version`` as a refusal names it (None: a release from before wire versions; a
    value a peer chose is cut short)."""
    if version is None:
        return "none (an actorrl release from before wire versions)"
    return f"{version!r:.40}"


def is_current(version: Any) -> bool:
    """Whether ``version`` (as a peer sent it) is this release's :data:`WIRE_VERSION`."""
    return type(version) is int and version == WIRE_VERSION


def refusal_message(who: str, theirs: Any) -> str:
    """Why a coordinator of this release refuses ``who`` (``"node 'gpu1' at 10.0.0.2"``,
    ``"client"``) that sent wire version ``theirs``, and what to do."""
    return (f"the coordinator refused this {who}, which speaks cluster wire version "
            f"{describe_version(theirs)}: the coordinator speaks version {WIRE_VERSION}, and "
            f"hosts running different actorrl versions cannot work together (typed values "
            f"would be misread); {FIX}")


def old_coordinator_message(address: str, detail: str = "") -> str:
    """Why a peer of this release gives up on a coordinator at ``address`` that shows no
    wire version (``detail``: what it answered), and what to do."""
    return (f"the coordinator at {address} speaks no cluster wire version (an actorrl "
            f"release from before wire versions{': ' + detail if detail else ''}), this "
            f"host speaks version {WIRE_VERSION}: {FIX}")


class VersionGate:
    """A coordinator's check of joining peers: :meth:`admit` refuses another wire version
    with :class:`WireVersionError`, logging each refused peer once."""

    def __init__(self) -> None:
        self._logged: dict[tuple[str, str, str], None] = {}

    def admit(self, version: Any, who: str, peer: str) -> None:
        """Return if ``version`` is :data:`WIRE_VERSION`; otherwise raise
        :class:`WireVersionError` for ``who`` (see :func:`refusal_message`). ``peer``
        (its key or host) and ``who`` identify it for the log."""
        if is_current(version):
            return
        message = refusal_message(who, version)
        key = (who, peer, describe_version(version))
        if key not in self._logged:
            self._logged[key] = None
            while len(self._logged) > MAX_REMEMBERED:
                self._logged.pop(next(iter(self._logged)))
            log.warning("refused a %s (%s) of another actorrl version: it speaks wire "
                        "version %s, this coordinator %d", who, peer,
                        describe_version(version), WIRE_VERSION)
        # Raised as a remote record without a traceback (still a WireVersionError): the
        # peer shows the message alone, which is all an older one can show.
        raise RemoteError(error_type_name(WireVersionError), message).typed()
