"""Small envs shipped for trying and testing: a pixel game (:mod:`.pixel`), a memory
task (:mod:`.memory`), a partially observed CartPole (:mod:`.partial`), multi-agent
CartPoles (:mod:`.multi_agent`) and RLlib's example envs (:mod:`.rllib_examples`)."""
