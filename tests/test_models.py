"""Default networks, the model catalog (custom models by class path) and action
distributions."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorrl.policy.action_dist import Categorical, DiagGaussian, dist_class_for
from actorrl.policy.encoders import (
    NATURE_CONV_FILTERS,
    ConvEncoder,
    FullExtentConv2d,
    build_encoder,
    build_mlp,
    default_conv_filters,
)
from actorrl.policy.models import ActorCriticModel, make_model, resolve_model_config

torch.set_num_threads(1)

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
DISCRETE2 = gym.spaces.Discrete(2)


class TinyCustomModel(torch.nn.Module):
    """A custom model following the interface: forward(obs) -> (outputs, value)."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.width = model_config["custom_model_config"]["width"]
        self.body = torch.nn.Linear(obs_space.shape[0], self.width)
        self.out = torch.nn.Linear(self.width, num_outputs)
        self.vf = torch.nn.Linear(self.width, 1)

    def forward(self, obs):
        h = torch.relu(self.body(obs.float()))
        return self.out(h), self.vf(h).squeeze(-1)


class NotAModule:
    def __init__(self, *args):
        pass


# ---- MLP and encoders ----------------------------------------------------------------

@pytest.mark.parametrize("activation, cls", [("tanh", torch.nn.Tanh), ("relu", torch.nn.ReLU),
                                             ("linear", torch.nn.Identity)])
def test_build_mlp_layers(activation, cls):
    mlp = build_mlp(3, [8, 5], activation, out_dim=2)
    kinds = [type(m) for m in mlp]
    assert kinds == [torch.nn.Linear, cls, torch.nn.Linear, cls, torch.nn.Linear]
    assert mlp(torch.zeros(7, 3)).shape == (7, 2)


def test_build_mlp_output_init_norm():
    mlp = build_mlp(3, [16], "tanh", out_dim=4, out_init_std=0.01)
    row_norms = mlp[-1].weight.norm(dim=1)
    assert torch.allclose(row_norms, torch.full((4,), 0.01), atol=1e-6)
    assert torch.count_nonzero(mlp[-1].bias) == 0


def test_unknown_activation_is_rejected():
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        build_mlp(3, [4], "gelu")


def test_flat_box_encoder_defaults_to_256_256_tanh():
    encoder, out_dim = build_encoder(BOX4, {})
    assert out_dim == 256
    linears = [m for m in encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(4, 256), (256, 256)]
    assert any(isinstance(m, torch.nn.Tanh) for m in encoder.modules())
    obs = torch.as_tensor(BOX4.sample()[None].astype(np.float64))  # float64 input is cast
    assert encoder(obs).shape == (1, 256)


def test_encoder_without_hidden_layers_passes_flat_obs():
    encoder, out_dim = build_encoder(gym.spaces.Box(0, 1, (2, 3), np.float32),
                                     {"fcnet_hiddens": []})
    assert out_dim == 6
    assert encoder(torch.ones(5, 2, 3)).shape == (5, 6)


def test_discrete_observations_are_one_hot_encoded():
    encoder, out_dim = build_encoder(gym.spaces.Discrete(5),
                                     {"fcnet_hiddens": [], "fcnet_activation": "linear"})
    assert out_dim == 5
    assert encoder(torch.tensor([3, 0])).tolist() == [[0, 0, 0, 1, 0], [1, 0, 0, 0, 0]]


@pytest.mark.parametrize("shape", [(84, 84, 4), (42, 42, 3), (64, 48, 1), (10, 10, 2)])
def test_default_conv_net_outputs_256_features(shape):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    encoder, out_dim = build_encoder(space, {})
    assert isinstance(encoder, ConvEncoder) and out_dim == 256
    obs = torch.as_tensor(np.stack([space.sample(), space.sample()]))
    assert encoder(obs).shape == (2, 256)


def test_default_conv_filters_match_rllib_for_84_and_42():
    assert default_conv_filters(84, 84) == [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]]
    assert default_conv_filters(42, 42) == [[16, [4, 4], 2], [32, [4, 4], 2], [256, [11, 11], 1]]


def test_uint8_images_are_scaled_by_1_over_255():
    uint8_space = gym.spaces.Box(0, 255, (10, 10, 1), np.uint8)
    float_space = gym.spaces.Box(0.0, 1.0, (10, 10, 1), np.float32)
    torch.manual_seed(0)
    uint8_encoder, _ = build_encoder(uint8_space, {})
    torch.manual_seed(0)
    float_encoder, _ = build_encoder(float_space, {})
    image = np.random.default_rng(0).integers(0, 256, (3, 10, 10, 1), dtype=np.uint8)
    expected = float_encoder(torch.as_tensor(image.astype(np.float32) / 255.0))
    assert torch.allclose(uint8_encoder(torch.as_tensor(image)), expected, atol=1e-5)


@pytest.mark.parametrize("filters", ["rllib", "nature"])
def test_conv_encoder_starts_orthogonal_with_zero_bias_and_keeps_the_signal(filters):
    """Layers start as relu-gain orthogonal matrices with zero bias, so [0, 1] frames keep
    their size through the stack (torch's default init shrank them 13-28x, leaving the
    policy head nearly blind on Pong: see ConvEncoder's docstring)."""
    torch.manual_seed(0)
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    encoder, _ = build_encoder(space, {"conv_filters": filters})
    layers = [m for m in encoder.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(layers) >= 3
    for layer in layers:
        w = layer.weight.detach().reshape(layer.weight.shape[0], -1)
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        assert torch.allclose(gram, 2.0 * torch.eye(gram.shape[0]), atol=1e-4)
        assert not layer.bias.detach().any()
    frames = torch.randint(0, 256, (32, 84, 84, 4), dtype=torch.uint8)
    with torch.no_grad():
        features = encoder(frames)
    ratio = features.pow(2).mean().sqrt() / (frames.float() / 255).pow(2).mean().sqrt()
    assert ratio > 0.3, f"features shrank to {float(ratio):.3f} of the input's RMS"


def test_custom_conv_filters():
    space = gym.spaces.Box(0.0, 1.0, (16, 16, 3), np.float32)
    encoder, out_dim = build_encoder(space, {"conv_filters": [[8, 3, 2], [4, [2, 2], 2]]})
    # "same" 16 -> 8, then "valid" 2x2 stride 2 -> 4x4, 4 channels
    assert out_dim == 4 * 4 * 4
    assert encoder(torch.zeros(2, 16, 16, 3)).shape == (2, 64)


def test_conv_filters_that_shrink_to_nothing_are_rejected():
    space = gym.spaces.Box(0.0, 1.0, (4, 4, 1), np.float32)
    with pytest.raises(ValueError, match="shrink a 4x4 image to nothing"):
        build_encoder(space, {"conv_filters": [[8, 5, 1]]})


def test_unsupported_observation_space_asks_for_custom_model():
    space = gym.spaces.Dict({"x": BOX4, "t": gym.spaces.Text(3)})
    with pytest.raises(ValueError, match=r"\['t'\] is Text.*set model.custom_model"):
        build_encoder(space, {})
    encoder, size = build_encoder(gym.spaces.Dict({"x": BOX4}), {"fcnet_hiddens": [8]})
    assert size == 8 and encoder(torch.zeros(2, 4)).shape == (2, 8)  # Dict: flattened


def test_unknown_model_option_is_rejected_with_suggestion():
    with pytest.raises(ValueError, match="'fcnet_hidden' \\(did you mean 'fcnet_hiddens'\\?\\)"):
        resolve_model_config({"fcnet_hidden": [4]})


# ---- actor-critic model and catalog ---------------------------------------------------

def test_actor_critic_model_has_separate_value_branch_by_default():
    model = ActorCriticModel(BOX4, DISCRETE2, 2, {"fcnet_hiddens": [8]})
    outputs, value = model(torch.zeros(3, 4))
    assert outputs.shape == (3, 2) and value.shape == (3,)
    assert model.value_encoder is not None
    # changing the value branch leaves the policy outputs alone
    with torch.no_grad():
        model.value_encoder[1][0].weight.add_(1.0)
    obs = torch.randn(3, 4)
    before = model(obs)[0]
    with torch.no_grad():
        model.value_head.weight.add_(1.0)
    assert torch.equal(model(obs)[0], before)


@pytest.mark.parametrize("share", [False, True])
def test_policy_outputs_equal_the_full_forward_without_running_the_critic(share):
    model = ActorCriticModel(BOX4, DISCRETE2, 2, {"fcnet_hiddens": [8],
                                                  "vf_share_layers": share})
    obs = torch.randn(5, 4)
    calls = []
    if not share:
        model.value_encoder.register_forward_hook(lambda *args: calls.append(1))
    assert torch.equal(model.policy_outputs(obs), model(obs)[0])
    if not share:
        assert len(calls) == 1  # only the full forward ran the critic


def test_shared_value_layers():
    model = ActorCriticModel(BOX4, DISCRETE2, 2, {"fcnet_hiddens": [8],
                                                  "vf_share_layers": True})
    assert model.value_encoder is None
    assert model.value_head.in_features == 8


def test_initial_policy_is_near_uniform():
    model = ActorCriticModel(BOX4, DISCRETE2, 2, {})
    logits, _ = model(torch.as_tensor(np.stack([BOX4.sample() for _ in range(16)])))
    assert logits.abs().max() < 0.1


def test_catalog_loads_custom_model_by_class_path():
    config = {"custom_model": f"{__name__}:TinyCustomModel",
              "custom_model_config": {"width": 5}}
    model = make_model(BOX4, DISCRETE2, 2, config)
    assert isinstance(model, TinyCustomModel) and model.width == 5
    outputs, value = model(torch.zeros(4, 4))
    assert outputs.shape == (4, 2) and value.shape == (4,)


def test_catalog_default_class_is_replaceable():
    model = make_model(BOX4, DISCRETE2, 2, {"custom_model_config": {"width": 3}},
                       default_cls=TinyCustomModel)
    assert isinstance(model, TinyCustomModel)


@pytest.mark.parametrize("path, message", [
    (f"{__name__}:TinyCustomModle", "did you mean TinyCustomModel"),
    ("not_a_module_abc:Model", "cannot import module 'not_a_module_abc'"),
    ("no_colon_here", "must be a 'pkg.module:name' string"),
    (f"{__name__}:NotAModule", "built a NotAModule, expected a torch.nn.Module"),
])
def test_catalog_errors_name_the_problem(path, message):
    with pytest.raises(ValueError, match=message):
        make_model(BOX4, DISCRETE2, 2, {"custom_model": path})


# ---- action distributions ---------------------------------------------------------------

def test_categorical_matches_torch_distributions():
    logits = torch.randn(6, 4)
    actions = torch.randint(0, 4, (6,))
    ours = Categorical(logits)
    ref = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(ours.logp(actions), ref.log_prob(actions), atol=1e-6)
    assert torch.allclose(ours.entropy(), ref.entropy(), atol=1e-6)
    other_logits = torch.randn(6, 4)
    ref_kl = torch.distributions.kl_divergence(
        ref, torch.distributions.Categorical(logits=other_logits))
    assert torch.allclose(ours.kl(Categorical(other_logits)), ref_kl, atol=1e-6)
    assert torch.equal(ours.deterministic_sample(), logits.argmax(-1))


def test_categorical_samples_follow_the_probabilities():
    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.6, 0.3])
    dist = Categorical(probs.log().expand(40000, 3))
    freq = torch.bincount(dist.sample(), minlength=3).float() / 40000
    assert torch.allclose(freq, probs, atol=0.01)


def test_diag_gaussian_matches_torch_distributions():
    mean, log_std = torch.randn(5, 3), torch.randn(5, 3) * 0.3
    dist = DiagGaussian(torch.cat([mean, log_std], dim=-1))
    ref = torch.distributions.Normal(mean, log_std.exp())
    actions = torch.randn(5, 3)
    assert torch.allclose(dist.logp(actions), ref.log_prob(actions).sum(-1), atol=1e-5)
    assert torch.allclose(dist.entropy(), ref.entropy().sum(-1), atol=1e-5)
    other_mean, other_log_std = torch.randn(5, 3), torch.randn(5, 3) * 0.3
    other = DiagGaussian(torch.cat([other_mean, other_log_std], dim=-1))
    ref_kl = torch.distributions.kl_divergence(
        ref, torch.distributions.Normal(other_mean, other_log_std.exp())).sum(-1)
    assert torch.allclose(dist.kl(other), ref_kl, atol=1e-5)
    assert torch.equal(dist.deterministic_sample(), mean)


def test_dist_class_for_spaces():
    assert dist_class_for(DISCRETE2) is Categorical
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    assert dist_class_for(box) is DiagGaussian
    assert DiagGaussian.required_outputs(box) == 6
    assert Categorical.required_outputs(DISCRETE2) == 2
    with pytest.raises(ValueError, match="no action distribution"):
        dist_class_for(gym.spaces.MultiBinary(3))
    with pytest.raises(ValueError, match="must start at 0"):
        dist_class_for(gym.spaces.Discrete(3, start=1))
    assert math.isclose(float(DiagGaussian(torch.zeros(1, 2)).entropy()),
                        0.5 * math.log(2 * math.pi * math.e), rel_tol=1e-6)


def test_hwc_and_chw_frames_give_the_same_features():
    """The same weights on a CHW copy of an HWC batch give the same features: the encoder
    reads the channel axis where it is, never an 84-channel 4x84 "image"."""
    torch.manual_seed(0)
    hwc, _ = build_encoder(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), {})
    torch.manual_seed(0)
    chw, _ = build_encoder(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), {})
    assert not hwc.channels_first and chw.channels_first
    first = [next(m for m in e.layers if isinstance(m, torch.nn.Conv2d)) for e in (hwc, chw)]
    assert first[0].in_channels == first[1].in_channels == 4
    frames = np.random.default_rng(1).integers(0, 256, (2, 84, 84, 4), dtype=np.uint8)
    expected = hwc(torch.as_tensor(frames))
    got = chw(torch.as_tensor(np.ascontiguousarray(frames.transpose(0, 3, 1, 2))))
    assert torch.allclose(got, expected, atol=1e-5)


def test_small_and_large_batches_give_the_same_features():
    """A learner-sized batch and the same rows in worker-sized batches give the same
    features, HWC frames and frames rebuilt from a pack (NCHW memory behind an HWC view)
    alike."""
    torch.manual_seed(0)
    encoder, _ = build_encoder(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), {})
    rows = 70
    frames = np.random.default_rng(2).integers(0, 256, (rows, 84, 84, 4), dtype=np.uint8)
    packed_view = np.ascontiguousarray(frames.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
    with torch.no_grad():
        for batch in (frames, packed_view):
            whole = encoder(torch.as_tensor(batch))
            pieces = torch.cat([encoder(torch.as_tensor(batch[i:i + 5]))
                                for i in range(0, rows, 5)])
            assert torch.allclose(whole, pieces, atol=1e-4)


@pytest.mark.parametrize("shape", [(84, 84, 84), (10, 3, 10), (4, 4, 4)])
def test_ambiguous_image_shapes_are_refused(shape):
    """A shape whose channel axis cannot be told apart names the shape and the key."""
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    with pytest.raises(ValueError, match=r"channels_first") as info:
        build_encoder(space, {})
    assert str(shape) in str(info.value)
    encoder, _ = build_encoder(space, {"channels_first": True})  # told: accepted
    assert encoder(torch.zeros((1, *shape), dtype=torch.uint8)).shape[0] == 1


def test_channels_first_key_overrides_the_shape_rule():
    """(6, 84, 84) read as HWC when told so: 84 channels of a 6x84 image."""
    encoder, _ = build_encoder(gym.spaces.Box(0, 1, (6, 84, 84), np.float32),
                               {"channels_first": False, "conv_filters": [[8, 3, 2]]})
    assert encoder.layers[0].in_channels == 84


def test_named_conv_stacks():
    """"nature" is the Nature-DQN stack (3136 conv features, then 512 dense); "rllib" is
    RLlib's default; an unknown name lists the valid ones."""
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    nature, out_dim = build_encoder(space, {"conv_filters": "nature"})
    convs = [m for m in nature.layers if isinstance(m, torch.nn.Conv2d)]
    assert [[c.out_channels, list(c.kernel_size), c.stride[0]] for c in convs] == \
        NATURE_CONV_FILTERS
    assert out_dim == 512
    dense = [m for m in nature.layers if isinstance(m, torch.nn.Linear)]
    assert [d.in_features for d in dense] == [64 * 7 * 7]
    assert nature(torch.zeros(3, 4, 84, 84, dtype=torch.uint8)).shape == (3, 512)
    rllib, out_dim = build_encoder(space, {"conv_filters": "rllib"})
    assert out_dim == 256
    with pytest.raises(ValueError, match="'nature'"):
        build_encoder(space, {"conv_filters": "resnet"})


def test_same_padding_matches_explicit_tf_padding():
    """Convs padding their symmetric part themselves (plus a pad op for an odd
    remainder) compute exactly TF/RLlib "same" padding: pad (lo, hi), then convolve."""
    import torch.nn.functional as F

    from actorrl.policy.encoders import tf_same_padding

    torch.manual_seed(0)
    encoder, _ = build_encoder(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), {})
    frames = torch.randint(0, 256, (3, 84, 84, 4), dtype=torch.uint8)
    x = frames.permute(0, 3, 1, 2).float() / 255.0
    convs = [m for m in encoder.layers if isinstance(m, torch.nn.Conv2d)]
    for index, conv in enumerate(convs):
        if index < len(convs) - 1:
            (top, bottom), _ = tf_same_padding(x.shape[2], conv.kernel_size[0], conv.stride[0])
            (left, right), _ = tf_same_padding(x.shape[3], conv.kernel_size[1], conv.stride[1])
            x = F.pad(x, (left, right, top, bottom))
        x = torch.relu(F.conv2d(x, conv.weight, conv.bias, conv.stride))
    assert torch.allclose(encoder(frames), x.reshape(3, -1), atol=1e-5)


def test_a_kernel_covering_its_whole_input_is_computed_as_a_product():
    """RLlib's last layer on 84x84 frames (256 filters of 11x11 on an 11x11 input) is a
    :class:`FullExtentConv2d`: the same parameters (names and shapes, so checkpoints of a
    plain Conv2d load), the same outputs and the same gradients as ``nn.Conv2d``, in both
    memory layouts; a kernel smaller than its input stays a convolution."""
    torch.manual_seed(0)
    encoder = ConvEncoder((84, 84, 4), default_conv_filters(84, 84), "relu", True)
    convs = [m for m in encoder.layers if isinstance(m, torch.nn.Conv2d)]
    assert [type(m) for m in convs] == [torch.nn.Conv2d, torch.nn.Conv2d, FullExtentConv2d]
    nature = ConvEncoder((84, 84, 4), NATURE_CONV_FILTERS, "relu", True, same_padding=False)
    assert not any(isinstance(m, FullExtentConv2d) for m in nature.layers)
    full = convs[-1]
    plain = torch.nn.Conv2d(32, 256, 11)
    plain.load_state_dict(full.state_dict())
    for layout in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(6, 32, 11, 11).contiguous(memory_format=layout).requires_grad_()
        y = torch.randn(6, 32, 11, 11).copy_(x.detach()).requires_grad_()
        out_full, out_plain = full(x), plain(y)
        assert out_full.shape == out_plain.shape == (6, 256, 1, 1)
        torch.testing.assert_close(out_full, out_plain, rtol=1e-4, atol=1e-4)
        out_full.square().sum().backward()
        out_plain.square().sum().backward()
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(full.weight.grad, plain.weight.grad, rtol=1e-3, atol=1e-3)
        full.zero_grad()
        plain.zero_grad()
