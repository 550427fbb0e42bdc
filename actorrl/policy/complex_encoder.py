"""Encoder for structured observations (``Dict``, ``Tuple``...; RLlib's ComplexInputNetwork).

The rollout worker hands the policy such observations as one flat float32 vector
(:mod:`actorrl.data.spaces`). :class:`ComplexEncoder` cuts it back into the space's leaves:
each image leaf (rank-3 ``Box``) goes through its own conv encoder
(:func:`~actorrl.policy.models.build_conv_encoder`, with the model's ``conv_filters``);
all other leaves (already flat: ``Box`` values, one-hot ``Discrete``/``MultiDiscrete``)
are concatenated with the image features, and an MLP with ``fcnet_hiddens`` follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from actorrl.data.spaces import check_observation_space, flat_leaves, flat_size


class ComplexEncoder(nn.Module):
    """Flat structured observation [B, flat_size] -> features [B, out_dim]."""

    def __init__(self, obs_space: gym.Space, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        from actorrl.policy.models import build_conv_encoder, build_mlp

        check_observation_space(obs_space)
        self.flat_size = flat_size(obs_space)
        leaves = flat_leaves(obs_space)
        self.image_leaves = [leaf for leaf in leaves if leaf.is_image]
        self.convs = nn.ModuleList(
            build_conv_encoder(leaf.space, cfg) for leaf in self.image_leaves)
        rest = [leaf for leaf in leaves if not leaf.is_image]
        index = np.concatenate([np.arange(leaf.start, leaf.start + leaf.size) for leaf in rest]
                               ) if rest else np.zeros(0, dtype=np.int64)
        self.register_buffer("rest_index", torch.as_tensor(index, dtype=torch.long),
                             persistent=False)
        in_dim = len(index) + sum(conv.out_dim for conv in self.convs)
        hiddens = list(cfg["fcnet_hiddens"])
        self.mlp = build_mlp(in_dim, hiddens, cfg["fcnet_activation"])
        self.out_dim = int(hiddens[-1]) if hiddens else in_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Encode a batch of flat structured observations."""
        x = obs.reshape(obs.shape[0], -1).float()
        parts = [x.index_select(1, self.rest_index)] if len(self.rest_index) else []
        for leaf, conv in zip(self.image_leaves, self.convs):
            # A copy: the conv scales uint8-range images in place (a uint8 leaf's values
            # arrive as floats 0..255 and its conv still scales them by 1/255).
            image = x[:, leaf.start:leaf.start + leaf.size].clone().reshape(
                -1, *leaf.space.shape)
            parts.append(conv(image))
        return self.mlp(torch.cat(parts, dim=1))


def build_complex_encoder(obs_space: gym.Space, cfg: Mapping[str, Any]
                          ) -> tuple[nn.Module, int]:
    """:class:`ComplexEncoder` for ``obs_space`` and its feature size."""
    encoder = ComplexEncoder(obs_space, cfg)
    return encoder, encoder.out_dim
