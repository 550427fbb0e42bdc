"""The model options (``model`` config key) and their defaults, without torch: configs
validate them where torch is not loaded (the coordinator checking a job submission)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

__all__ = ["MODEL_DEFAULTS", "MODEL_KEY_DOCS", "RECURRENT_METHODS", "missing_recurrent_methods",
           "model_value_problems", "resolve_model_config"]

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
    # Gaussian policies (Box actions): the log standard deviations are free parameters,
    # one per action dimension, independent of the observation (the network outputs only
    # the means); False: the network outputs means and log standard deviations.
    "free_log_std": False,
    # "pkg.module:Class" of a custom torch.nn.Module (see the module docstring).
    "custom_model": None,
    # Free-form options for the custom model (it reads them from model_config).
    "custom_model_config": {},
    # Recurrent policies (actor-critic: IMPALA, A2C, A3C). Wrap the encoder built above
    # (MLP or conv stack) in an LSTM whose output feeds the policy and value heads (the
    # value branch has its own encoder and LSTM unless vf_share_layers). With
    # custom_model set, that class must itself implement the recurrent interface
    # (actorrl.policy.models.RecurrentModel). Ape-X / DQN: a recurrent Q-network (DQN's
    # heads on the LSTM output), trained from batch_replay only.
    "use_lstm": False,
    # Longest sequence the loss unrolls the LSTM over; fragments are cut into sequences
    # of at most this many steps, each starting from its recorded state.
    "max_seq_len": 20,
    # Size of the LSTM's hidden and cell states.
    "lstm_cell_size": 256,
    # Feed the previous action (one-hot for Discrete) to the LSTM with the features.
    "lstm_use_prev_action": False,
    # Feed the previous reward to the LSTM with the features.
    "lstm_use_prev_reward": False,
    # RLlib's Atari preprocessor keys. On Atari ids they set the DeepMind wrappers
    # (actorrl.envs.atari.model_env_config folds them into env_config): frames of dim x dim
    # (84: RLlib's 84x84 conv stack; 42: its 42x42 one). Elsewhere only dim=84 (a no-op)
    # is accepted.
    "dim": 84,
    # Atari ids: one gray channel per frame (False: RGB, 3 channels per stacked frame).
    # RLlib's default False is its generic preprocessor's; its DeepMind wrappers (and
    # actorrl's) are gray. No effect on other envs.
    "grayscale": True,
    # uint8 image inputs enter the conv stack scaled to [-1, 1] (x/127.5 - 1) instead of
    # [0, 1] (x/255). RLlib's default True belongs to its generic preprocessor, which
    # DeepMind-wrapped Atari frames skip; float images are never scaled.
    "zero_mean": False,
    # How image encoders start and take their pixels. "actorrl": uint8 frames scaled to
    # [0, 1] (or [-1, 1] with zero_mean), layers orthogonal with relu gain (ConvEncoder's
    # docstring says why). "rllib": RLlib's vision net as RLlib builds it: 0-255 values
    # unscaled into layers initialised xavier-uniform with zero biases (its SlimConv2d),
    # which makes features ~20x larger on Atari frames and a head's Adam steps move its
    # outputs that much more; DQN and Ape-X then start their Q heads xavier-uniform too
    # (RLlib's SlimFC). Files in RLlib's layout for DQN and Ape-X take "rllib"
    # (benchmarks/dqn_input_scale.py: RLlib's DQN Breakout release test learns with it).
    "vision_net": "actorrl",
    # Atari ids: stack the last 4 frames (or env_config.frame_stack); False: 1 frame.
    # No effect on other envs.
    "framestack": True,
}

MODEL_KEY_DOCS: dict[str, str] = {
    "fcnet_hiddens": "Hidden layer sizes of the MLP for flat observations.",
    "fcnet_activation": "Activation of those layers: tanh, relu, elu, swish or linear.",
    "conv_filters": "Conv stack for image observations: [[out_channels, kernel, stride], "
                    "...], or rllib (RLlib's stack for the image size, 84x84 or 42x42) or "
                    "nature (Nature-DQN); null: rllib.",
    "channels_first": "Image axis order: true CHW, false HWC, null tells it from the shape.",
    "conv_activation": "Activation of the conv layers.",
    "vf_share_layers": "Actor-critic: the value head shares the policy's encoder.",
    "free_log_std": "Gaussian policies: state-independent log standard deviations (free "
                    "parameters; the network outputs only the means).",
    "custom_model": "pkg.module:Class of a custom torch.nn.Module.",
    "custom_model_config": "Free-form options for the custom model.",
    "use_lstm": "Wrap the encoder in an LSTM (recurrent policy).",
    "max_seq_len": "Longest sequence the loss unrolls the LSTM over.",
    "lstm_cell_size": "Size of the LSTM's hidden and cell states.",
    "lstm_use_prev_action": "Feed the previous action to the LSTM.",
    "lstm_use_prev_reward": "Feed the previous reward to the LSTM.",
    "dim": "Atari ids: frames resized to dim x dim (env_config.frame_size); 42 picks "
           "RLlib's 42x42 conv stack. Other envs: only 84 (no-op).",
    "grayscale": "Atari ids: gray frames (false: RGB, 3 channels per frame; "
                 "env_config.grayscale).",
    "zero_mean": "uint8 image inputs scaled to [-1, 1] (x/127.5 - 1) instead of [0, 1] "
                 "(x/255).",
    "vision_net": "Image encoders: actorrl (pixels scaled, orthogonal init) or rllib "
                  "(RLlib's: raw 0-255 pixels, xavier-uniform init, zero biases; DQN/Ape-X "
                  "Q heads xavier too). RLlib-layout DQN/Ape-X files: rllib.",
    "framestack": "Atari ids: stack the last 4 frames (false: 1 frame; "
                  "env_config.frame_stack).",
}
"""One line per ``model`` key (docs/configuration.md lists them)."""

VISION_NETS = ("actorrl", "rllib")
"""Values of the ``vision_net`` model option."""

_POSITIVE_INT_OPTIONS = ("max_seq_len", "lstm_cell_size", "dim")
_BOOL_OPTIONS = ("use_lstm", "free_log_std", "lstm_use_prev_action", "lstm_use_prev_reward",
                 "grayscale", "zero_mean", "framestack")

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
    resolved = {**MODEL_DEFAULTS, **cfg}
    problems = model_value_problems(resolved)
    if problems:
        raise ValueError("; ".join(f"model option {key!r} {message}"
                                   for key, message in problems))
    return resolved


def model_value_problems(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, problem)`` for values of a resolved model config that cannot work (the
    recurrent options' and ``dim``'s ranges, the flags' types)."""
    problems = []
    for key in _POSITIVE_INT_OPTIONS:
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append((key, f"must be an integer >= 1, got {value!r}"))
    for key in _BOOL_OPTIONS:
        if not isinstance(cfg[key], bool):
            problems.append((key, f"must be true or false, got {cfg[key]!r}"))
    if cfg["vision_net"] not in VISION_NETS:
        problems.append(("vision_net", f"must be one of {', '.join(map(repr, VISION_NETS))}, "
                                       f"got {cfg['vision_net']!r}"))
    elif cfg["vision_net"] == "rllib" and cfg["zero_mean"] is True:
        problems.append(("zero_mean", "scales pixels to [-1, 1], but vision_net 'rllib' feeds "
                                      "them raw (0-255, as RLlib does): drop one of the two"))
    return problems


RECURRENT_METHODS = ("get_initial_state", "forward_rnn")
"""What makes a model recurrent (see ``actorrl.policy.models.RecurrentModel``)."""


def missing_recurrent_methods(model_cls: Any) -> list[str]:
    """The methods of :data:`RECURRENT_METHODS` that ``model_cls`` (a class or instance)
    lacks; empty for a recurrent model."""
    return [name for name in RECURRENT_METHODS if not callable(getattr(model_cls, name, None))]
