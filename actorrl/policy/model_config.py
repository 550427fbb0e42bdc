"""The model options (``model`` config key) and their defaults, without torch: configs
validate them where torch is not loaded (the coordinator checking a job submission)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

__all__ = ["MODEL_DEFAULTS", "resolve_model_config"]

MODEL_DEFAULTS: dict[str, Any] = {
    # Hidden layer sizes of the MLP for flat observations.
    "fcnet_hiddens": [256, 256],
    # Activation of those layers: "tanh", "relu", "elu", "swish" or "linear".
    "fcnet_activation": "tanh",
    # Conv layers for rank-3 image observations: [[out_channels, kernel, stride], ...]
    # (kernel an int or [kh, kw]); "same" padding except the last layer ("valid").
    # Or a named stack: "rllib" (RLlib's default for the image size, see
    # default_conv_filters) or "nature" (Nature-DQN: 32x8/4, 64x4/2, 64x3/1, all "valid",
    # then a 512-unit dense layer). None: "rllib".
    "conv_filters": None,
    # Image axis order: True for CHW, False for HWC, None to tell it from the shape (the
    # channel axis is the one outer axis smaller than both others; ambiguous shapes are
    # refused).
    "channels_first": None,
    # Activation of the conv layers (the same choices as fcnet_activation).
    "conv_activation": "relu",
    # Actor-critic: whether the value head shares the policy's encoder (else its own copy).
    "vf_share_layers": False,
    # "pkg.module:Class" of a custom torch.nn.Module (see the module docstring).
    "custom_model": None,
    # Free-form options for the custom model (it reads them from model_config).
    "custom_model_config": {},
}

def resolve_model_config(model_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``MODEL_DEFAULTS`` overridden by ``model_config``; unknown keys raise ``ValueError``
    with close-match suggestions."""
    cfg = dict(model_config or {})
    unknown = sorted(set(cfg) - set(MODEL_DEFAULTS))
    if unknown:
        problems = []
        for key in unknown:
            close = difflib.get_close_matches(key, list(MODEL_DEFAULTS), n=1)
            problems.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"unknown model option(s) {', '.join(problems)}; "
                         f"supported: {', '.join(sorted(MODEL_DEFAULTS))}")
    return {**MODEL_DEFAULTS, **cfg}
