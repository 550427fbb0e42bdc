"""The execution pipelines (RLlib's policy optimizers) as asyncio code on the runtime:
one dataflow per module, sharing small pieces from :mod:`actorrl.pipelines.pieces`."""
