"""Running algorithms on a cluster: jobs (one Trainer each) on a coordinator, and the
coordinator / node-agent processes. The placement and membership machinery lives below,
in :mod:`actorrl.runtime.cluster.coordinator`; the client is :mod:`actorrl.cluster.client`."""

from transport.error_types import register_error

RUNNING_STATES = ("pending", "running", "restarting", "interrupted")
"""Job states a coordinator resumes after a restart."""
TERMINAL_STATES = ("finished", "stopped", "failed")
"""Job states that produce no more results."""


@register_error
class JobError(ValueError):
    """A job request could not be served (unknown job, bad submission): bad input, so the
    CLI exits 2. Registered, so a client catches it by type (``except JobError``)."""
