"""A restored policy learns with its own configured learning rate, not the checkpoint's
(``actorrl train --restore RUN --set lr=X``): the optimizer state a checkpoint carries
holds the saving run's ``lr`` in its param groups (issue 37, item 9)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from actorrl.policy.actor_critic import ActorCriticPolicy

pytestmark = pytest.mark.unit

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)
SMALL_MODEL = {"fcnet_hiddens": [8]}
SAVED_LR = 1e-3
NEW_LR = 1e-5


def _step_all_ones(policy: ActorCriticPolicy) -> None:
    """One optimizer step with a gradient of 1 for every parameter."""
    grads = [np.ones(tuple(p.shape), np.float32) for p in policy.model.parameters()]
    policy.apply_gradients(grads)


def _weights(policy: ActorCriticPolicy) -> list[np.ndarray]:
    return [p.detach().cpu().numpy().copy() for p in policy.model.parameters()]


@pytest.mark.parametrize("config", [
    {"lr": NEW_LR},
    {"lr": SAVED_LR, "lr_schedule": [[0, NEW_LR], [1_000_000, NEW_LR]]},
], ids=["lr", "lr_schedule"])
def test_a_restored_optimizer_steps_with_the_configured_lr(config) -> None:
    """A state saved by a policy with lr 1e-3 (Adam, after one step) restored into a
    policy configured with lr 1e-5 (or an lr_schedule at 1e-5): its optimizer's param
    groups hold 1e-5, and the next step moves each weight by 1e-5. (Adam with the same
    gradient at every step moves each weight by exactly lr: the bias-corrected moments are
    g and g^2.)"""
    saved = ActorCriticPolicy(OBS_SPACE, ACTION_SPACE, {"model": SMALL_MODEL, "lr": SAVED_LR,
                                                        "grad_clip": None})
    _step_all_ones(saved)
    state = saved.get_state()

    restored = ActorCriticPolicy(OBS_SPACE, ACTION_SPACE,
                                 {"model": SMALL_MODEL, "grad_clip": None, **config})
    restored.set_state(state)
    assert [group["lr"] for group in restored.optimizer.param_groups] == \
        [NEW_LR] * len(restored.optimizer.param_groups)
    before = _weights(restored)
    _step_all_ones(restored)
    moved = np.concatenate([(b - a).ravel() for a, b in zip(_weights(restored), before)])
    # float32 weights of magnitude <= ~1 round a move to within ~1e-7
    np.testing.assert_allclose(moved, NEW_LR, rtol=0, atol=0.05 * NEW_LR)
