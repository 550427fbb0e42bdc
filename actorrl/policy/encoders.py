"""Encoders: observation -> feature vector, shared by every model of the catalog.

:func:`build_encoder` picks one for the observation space: an MLP (:func:`build_mlp`) for
flat observations, a conv stack (:class:`ConvEncoder`, :func:`build_conv_encoder`) for
rank-3 images, and :class:`ComplexEncoder` for structured spaces (``Dict``, ``Tuple``...;
RLlib's ComplexInputNetwork). How images are laid out and scaled is described in
:mod:`actorrl.policy.models`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from actorrl.data.spaces import (
    check_observation_space,
    flat_leaves,
    flat_size,
    needs_flattening,
)
from actorrl.policy.model_config import resolve_model_config

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "swish": nn.SiLU, "linear": nn.Identity,
}


def activation_class(name: str) -> type[nn.Module]:
    """The module class of activation ``name`` (RLlib's: "tanh", "relu", "elu", "swish" or
    "linear")."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; supported: "
                         f"{', '.join(_ACTIVATIONS)}") from None


def normc_init_(layer: nn.Linear, std: float = 1.0) -> nn.Linear:
    """RLlib's normalized-column init: Gaussian weights with each output row scaled to
    norm ``std``; zero bias. Small ``std`` (0.01) for policy logits keeps the initial
    policy near uniform."""
    with torch.no_grad():
        weight = torch.randn_like(layer.weight)
        weight *= std / weight.norm(dim=1, keepdim=True)
        layer.weight.copy_(weight)
        if layer.bias is not None:
            layer.bias.zero_()
    return layer


def relu_orthogonal_init_(layer: nn.Conv2d | nn.Linear) -> nn.Conv2d | nn.Linear:
    """Orthogonal weights with gain sqrt(2) and zero bias, as the OpenAI Baselines and
    stable-baselines Atari networks start: the signal keeps its size through relu layers.
    Used for the image encoder's layers (see :class:`ConvEncoder`)."""
    nn.init.orthogonal_(layer.weight, math.sqrt(2.0))
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def xavier_uniform_init_(layer: nn.Conv2d | nn.Linear) -> nn.Conv2d | nn.Linear:
    """Xavier-uniform weights and zero bias: RLlib's torch layers' default (``SlimConv2d``,
    ``SlimFC``), for the ``vision_net: rllib`` model option."""
    nn.init.xavier_uniform_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def build_mlp(in_dim: int, hiddens: Sequence[int], activation: str,
              out_dim: int | None = None, out_init_std: float = 1.0) -> nn.Sequential:
    """Linear + activation per entry of ``hiddens``, then (if ``out_dim``) a final linear
    layer with no activation, initialized with norm ``out_init_std``."""
    act = activation_class(activation)
    layers: list[nn.Module] = []
    size = in_dim
    for hidden in hiddens:
        layers += [normc_init_(nn.Linear(size, int(hidden)), 1.0), act()]
        size = int(hidden)
    if out_dim is not None:
        layers.append(normc_init_(nn.Linear(size, out_dim), out_init_std))
    return nn.Sequential(*layers)


class Flatten(nn.Module):
    """Casts observations to float32 and flattens all but the batch dimension."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, ...] -> [B, prod(...)] float32."""
        return obs.reshape(obs.shape[0], -1).float()


class OneHot(nn.Module):
    """One-hot encodes ``Discrete(n)`` observations."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[B] integers -> [B, n] float32."""
        return F.one_hot(obs.long().reshape(-1), self.n).float()


def default_conv_filters(height: int, width: int) -> list[list[Any]]:
    """RLlib-like conv stack for an image: two strided layers (8x8/4 then 4x4/2 for images
    of at least 64 pixels a side, else 4x4/2 twice), then 256 channels with a kernel
    covering what is left, so the output is 256 features (RLlib's 84x84 and 42x42 stacks)."""
    first = [16, [8, 8], 4] if min(height, width) >= 64 else [16, [4, 4], 2]
    h, w = height, width
    for _, _, stride in (first, [32, [4, 4], 2]):
        h, w = math.ceil(h / stride), math.ceil(w / stride)
    return [first, [32, [4, 4], 2], [256, [h, w], 1]]


NATURE_CONV_FILTERS: list[list[Any]] = [[32, [8, 8], 4], [64, [4, 4], 2], [64, [3, 3], 1]]
"""The Nature-DQN conv stack (Mnih et al. 2015), all "valid" padding; followed by a
512-unit dense layer (:data:`NATURE_DENSE`)."""


NATURE_DENSE = 512


CONV_STACKS = ("rllib", "nature")
"""Names ``conv_filters`` accepts besides an explicit list."""


def is_channels_first(shape: Sequence[int], channels_first: bool | None) -> bool:
    """Whether a rank-3 image ``shape`` is CHW: ``channels_first`` when set, else told from
    the shape (see the module docstring); ValueError for an ambiguous shape."""
    if len(shape) != 3:
        raise ValueError(f"an image observation has rank 3, got shape {tuple(shape)}")
    if channels_first is not None:
        return bool(channels_first)
    a, b, c = (int(d) for d in shape)
    hwc, chw = c < min(a, b), a < min(b, c)
    if hwc == chw:
        raise ValueError(
            f"cannot tell the channel axis of image shape {tuple(shape)}: set model option "
            "'channels_first' to true (CHW) or false (HWC)")
    return chw


def image_layout(shape: Sequence[int], channels_first: bool | None) -> tuple[int, int, int]:
    """``(height, width, channels)`` of a rank-3 image ``shape`` (see
    :func:`is_channels_first`)."""
    a, b, c = (int(d) for d in shape)
    return (b, c, a) if is_channels_first(shape, channels_first) else (a, b, c)


class FullExtentConv2d(nn.Conv2d):
    """A valid-padding convolution whose kernel covers its whole input (a 1x1 output), such
    as RLlib's last 11x11 layer on 84x84 frames, computed as the matrix product it is. The
    parameters are the Conv2d's own (same names and shapes: checkpoints load either way).
    On CPU, torch's convolution re-laid this ~1M-weight kernel out on every call: as a
    product the layer made a Pong learner step (100 rows, forward and backward, one thread)
    2x faster here (109 -> 55 ms), a worker's 5-row inference ~1.6x."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, kh, kw] -> [B, out_channels, 1, 1]."""
        out = F.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.out_channels, -1),
                       self.bias)
        return out.reshape(x.shape[0], self.out_channels, 1, 1)


class ConvEncoder(nn.Module):
    """Conv net for images (uint8 scaled by 1/255 at the first layer, or to [-1, 1] with
    ``zero_mean``), HWC or CHW: conv
    layers ("same" padding except the last, or all "valid"), then flattened features, then
    an optional dense layer.

    Layers start orthogonal with gain sqrt(2) and zero bias (:func:`relu_orthogonal_init_`),
    not with torch's default init. With inputs scaled to [0, 1], torch's default shrinks the
    signal ~2.4x per relu layer: on Pong frames the 256 features came out ~18x smaller
    (norm 0.4 against 7), so each Adam step moved the policy logits ~18x less (the
    state-dependent part of them, frames differing by a ball and two paddles, ~3.5% of the
    features). RLlib's vision net does not scale its 0-255 inputs, which keeps its features
    large. (docs/learning.md has what else Pong needed.)
    """

    def __init__(self, obs_shape: Sequence[int], filters: Sequence[Sequence[Any]],
                 activation: str, scale_uint8: bool, *, channels_first: bool | None = False,
                 same_padding: bool = True, dense: int | None = None,
                 zero_mean: bool = False, rllib_init: bool = False) -> None:
        """``rllib_init``: layers xavier-uniform with zero bias, as RLlib's vision net
        starts (the ``vision_net: rllib`` model option, which also passes
        ``scale_uint8=False``)."""
        super().__init__()
        init = xavier_uniform_init_ if rllib_init else relu_orthogonal_init_
        self.channels_first = is_channels_first(obs_shape, channels_first)
        height, width, channels = image_layout(obs_shape, self.channels_first)
        # uint8 frames: x/255 in [0, 1], or with zero_mean (model option) x/127.5 - 1 in
        # [-1, 1]; other inputs enter as they are.
        self.scale = (2.0 / 255.0 if zero_mean else 1.0 / 255.0) if scale_uint8 else 1.0
        self.shift = -1.0 if scale_uint8 and zero_mean else 0.0
        act = activation_class(activation)
        layers: list[nn.Module] = []
        h, w, c = height, width, channels
        for index, (out_channels, kernel, stride) in enumerate(filters):
            kh, kw = (kernel, kernel) if isinstance(kernel, int) else (int(k) for k in kernel)
            last = index == len(filters) - 1
            h_in, w_in = h, w
            padding = (0, 0)
            if same_padding and not last:
                pad_h, h = tf_same_padding(h, kh, stride)
                pad_w, w = tf_same_padding(w, kw, stride)
                # The symmetric part is the conv's own padding; only an odd remainder
                # needs a pad op (it cost ~25% of a conv layer's time here).
                padding = (min(pad_h), min(pad_w))
                extra = (pad_w[0] - padding[1], pad_w[1] - padding[1],
                         pad_h[0] - padding[0], pad_h[1] - padding[0])
                if any(extra):
                    layers.append(nn.ZeroPad2d(extra))
            else:
                h, w = (h - kh) // stride + 1, (w - kw) // stride + 1
                if h < 1 or w < 1:
                    raise ValueError(f"conv_filters {list(filters)!r} shrink a "
                                     f"{height}x{width} image to nothing")
            full_extent = not (same_padding and not last) and (kh, kw) == (h_in, w_in)
            conv = (FullExtentConv2d if full_extent else nn.Conv2d)(
                c, int(out_channels), (kh, kw), stride, padding)
            layers += [init(conv), act()]
            c = int(out_channels)
        layers.append(nn.Flatten())
        self.out_dim = c * h * w
        if dense is not None:
            layers += [init(nn.Linear(self.out_dim, dense)), act()]
            self.out_dim = dense
        self.layers = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, H, W, C] or [B, C, H, W] (as built) -> [B, out_dim] float32."""
        x = obs if self.channels_first else obs.permute(0, 3, 1, 2)
        # The cast to float copies anyway, so it also picks the memory layout: channels-last
        # convolutions ran 1.2-1.7x faster than NCHW on CPU here at every batch size, a
        # worker's 5 rows to a learner's 500, forward and backward (once the last layer of
        # RLlib's stack was no convolution, see FullExtentConv2d).
        x = x.to(dtype=torch.float32, memory_format=torch.channels_last)
        if self.scale != 1.0:  # only uint8 frames are scaled: x is the cast's own copy
            x.mul_(self.scale)
            if self.shift:
                x.add_(self.shift)
        return self.layers(x)


def build_conv_encoder(obs_space: gym.spaces.Box, cfg: Mapping[str, Any]) -> ConvEncoder:
    """The :class:`ConvEncoder` a resolved model config asks for (``conv_filters`` list or
    name, ``conv_activation``, ``channels_first``, ``zero_mean``: uint8 inputs scaled to
    [-1, 1] instead of [0, 1]; ``vision_net: rllib``: RLlib's unscaled 0-255 inputs and
    xavier-uniform init). The default stack follows the image size, so Atari frames
    of ``model.dim`` 42 get RLlib's 42x42 stack."""
    channels_first = cfg["channels_first"]
    height, width, _ = image_layout(obs_space.shape, channels_first)
    filters = cfg["conv_filters"]
    rllib = cfg.get("vision_net", "actorrl") == "rllib"
    scale = obs_space.dtype == np.uint8 and not rllib
    zero_mean = bool(cfg.get("zero_mean", False))
    if filters == "nature":
        return ConvEncoder(obs_space.shape, NATURE_CONV_FILTERS, cfg["conv_activation"], scale,
                           channels_first=channels_first, same_padding=False,
                           dense=NATURE_DENSE, zero_mean=zero_mean, rllib_init=rllib)
    if filters is None or filters == "rllib":
        filters = default_conv_filters(height, width)
    elif isinstance(filters, str):
        raise ValueError(f"unknown conv stack {filters!r} in model option 'conv_filters'; "
                         f"use one of {', '.join(map(repr, CONV_STACKS))} or a list of "
                         "[out_channels, kernel, stride]")
    return ConvEncoder(obs_space.shape, filters, cfg["conv_activation"], scale,
                       channels_first=channels_first, zero_mean=zero_mean, rllib_init=rllib)


def tf_same_padding(size: int, kernel: int, stride: int) -> tuple[tuple[int, int], int]:
    """TensorFlow's "same" padding of one dimension: ``((before, after), output_size)``."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return (total // 2, total - total // 2), out


def build_encoder(obs_space: gym.Space, model_config: Mapping[str, Any] | None
                  ) -> tuple[nn.Module, int]:
    """Observation -> feature vector, and the feature size.

    Rank-3 ``Box`` (an image, HWC or CHW): :func:`build_conv_encoder`. Other ``Box``
    shapes: flattened, then an MLP with ``fcnet_hiddens``. ``Discrete``: one-hot, then the
    MLP. ``Dict``, ``Tuple`` and other structured spaces (flattened by the worker):
    :class:`ComplexEncoder`.
    """
    cfg = resolve_model_config(model_config)
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 3:
        conv = build_conv_encoder(obs_space, cfg)
        return conv, conv.out_dim
    if isinstance(obs_space, gym.spaces.Box):
        pre, in_dim = Flatten(), int(math.prod(obs_space.shape))
    elif isinstance(obs_space, gym.spaces.Discrete):
        pre, in_dim = OneHot(int(obs_space.n)), int(obs_space.n)
    elif needs_flattening(obs_space):  # Dict, Tuple...: flat vectors (actorrl.data.spaces)

        return build_complex_encoder(obs_space, cfg)
    else:
        raise ValueError(f"no default model for observation space {obs_space!r}; set "
                         f"model.custom_model")
    hiddens = list(cfg["fcnet_hiddens"])
    mlp = build_mlp(in_dim, hiddens, cfg["fcnet_activation"])
    return nn.Sequential(pre, mlp), (int(hiddens[-1]) if hiddens else in_dim)

class ComplexEncoder(nn.Module):
    """Flat structured observation [B, flat_size] -> features [B, out_dim]."""

    def __init__(self, obs_space: gym.Space, cfg: Mapping[str, Any]) -> None:
        super().__init__()

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
