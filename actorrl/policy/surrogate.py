"""The terms PPO and APPO share: the clipped surrogate objective and the adaptive KL
coefficient (RLlib's ``KLCoeffMixin.update_kl``)."""

from __future__ import annotations

import torch


def clipped_surrogate(advantages: torch.Tensor, ratio: torch.Tensor,
                      clip_param: float) -> torch.Tensor:
    """Per row ``min(A * r, A * clip(r, 1 - clip_param, 1 + clip_param))``: the objective to
    maximise (a loss takes minus its mean)."""
    clipped = torch.clamp(ratio, 1.0 - clip_param, 1.0 + clip_param)
    return torch.minimum(advantages * ratio, advantages * clipped)


def updated_kl_coeff(kl_coeff: float, sampled_kl: float, kl_target: float) -> float:
    """The KL coefficient after one adaptation step: x1.5 when the measured KL is above
    twice the target, x0.5 when below half of it, unchanged otherwise (RLlib's rule)."""
    if sampled_kl > 2.0 * kl_target:
        return kl_coeff * 1.5
    if sampled_kl < 0.5 * kl_target:
        return kl_coeff * 0.5
    return kl_coeff
