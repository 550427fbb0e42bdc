"""Wire layer: msgpack + zero-copy frames codec, asyncio ROUTER/DEALER RPC, CURVE auth.

Nothing in this package knows about reinforcement learning or imports ``actorrl``.
"""
