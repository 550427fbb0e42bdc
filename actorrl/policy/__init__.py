"""Torch policies and models: DQN family, actor-critic (A2C/A3C), IMPALA (V-trace)."""
