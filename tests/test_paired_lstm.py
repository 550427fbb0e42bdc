"""The paired acting step of a two-branch LSTM actor-critic (`actorrl/policy/paired_lstm.py`):
both branches run as one block-diagonal network and must give exactly what the branches
give one after the other, before and after the weights change."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorrl.policy.models import make_model
from actorrl.policy.paired_lstm import PairedBranches

BOX = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)


def _model(**model):
    return make_model(BOX, gym.spaces.Discrete(3), 3,
                      {"fcnet_hiddens": [32, 16], "use_lstm": True, "lstm_cell_size": 24,
                       "lstm_use_prev_action": True, "lstm_use_prev_reward": True, **model})


def _separate_step(model, obs, state, prev_actions, prev_rewards):
    """The step with pairing switched off: the branches one after the other."""
    paired, model.paired = model.paired, None
    try:
        return model.forward_step(obs, state, prev_actions, prev_rewards)
    finally:
        model.paired = paired


class _Spy:
    """Wraps the model's paired network and keeps what each of its steps returned."""

    def __init__(self, paired):
        self.paired = paired
        self.returned: list[list[torch.Tensor]] = []

    def step(self, *args):
        out = self.paired.step(*args)
        self.returned.append(out)
        return out


def _assert_steps_agree(model, generator):
    """The acting step runs the paired network (its state comes from it) and equals the
    branches run one after the other."""
    obs = torch.randn(6, 5, generator=generator)
    state = [torch.randn(6, 24, generator=generator) for _ in range(4)]
    prev_actions = torch.randint(0, 3, (6,), generator=generator)
    prev_rewards = torch.randn(6, generator=generator)
    paired = model.paired
    spy = model.paired = _Spy(paired)
    try:
        with torch.inference_mode():
            got = model.forward_step(obs, state, prev_actions, prev_rewards)
    finally:
        model.paired = paired
    assert len(spy.returned) == 1, "forward_step did not run the paired network"
    for got_state, paired_state in zip(got[2], spy.returned[0], strict=True):
        assert got_state is paired_state
    with torch.inference_mode():
        want = _separate_step(model, obs, state, prev_actions, prev_rewards)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    for got_state, want_state in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(got_state, want_state)


def test_the_paired_step_equals_the_branches_one_after_the_other():
    """Two hidden layers, previous action and reward: outputs, values and all four state
    tensors agree, and the pairing is what the model acts with."""
    model = _model()
    assert model.paired is not None
    _assert_steps_agree(model, torch.Generator().manual_seed(0))


def test_the_paired_weights_follow_optimizer_steps_and_loaded_weights():
    """After an optimizer step and after ``load_state_dict`` the paired step still equals
    the separate one (the fused weights are rebuilt, not stale)."""
    model = _model()
    generator = torch.Generator().manual_seed(1)
    _assert_steps_agree(model, generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    outputs, values, _ = model.forward_rnn(
        {"obs": torch.randn(2, 3, 5), "prev_actions": torch.zeros(2, 3, dtype=torch.int64),
         "prev_rewards": torch.zeros(2, 3)},
        [torch.zeros(2, 24) for _ in range(4)], torch.tensor([3, 3]))
    (outputs.square().sum() + values.square().sum()).backward()
    optimizer.step()
    _assert_steps_agree(model, generator)
    other = _model()
    model.load_state_dict(other.state_dict())
    _assert_steps_agree(model, generator)


@pytest.mark.parametrize("model_config", [{"lstm_cell_size": 256},
                                          {"vf_share_layers": True}])
def test_large_cells_and_a_shared_branch_are_not_paired(model_config):
    """Above MAX_PAIRED_CELL the zero blocks would cost more than they save, and a shared
    branch has nothing to pair."""
    model = make_model(BOX, gym.spaces.Discrete(3), 3,
                       {"fcnet_hiddens": [16], "use_lstm": True, **model_config})
    assert model.paired is None


def test_conv_encoders_are_not_paired():
    """Only MLP encoders are paired (a conv stack's step is bound by arithmetic)."""
    model = make_model(gym.spaces.Box(0, 255, (42, 42, 4), np.uint8), gym.spaces.Discrete(3),
                       3, {"use_lstm": True, "lstm_cell_size": 32,
                           "conv_filters": [[8, [5, 5], 3], [16, [14, 14], 1]]})
    assert not PairedBranches.supports(model.encoder, model.value_encoder, model.lstm,
                                       model.value_lstm)
