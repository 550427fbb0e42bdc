"""actorrl: distributed RL pipelines on a small asyncio + ZeroMQ actor runtime."""

__version__ = "0.1.0"
