"""Many hosts: the coordinator (membership, placement, actor records, callers), node
agents that join it, and the driver surface over a cluster."""
