"""Advantage estimators: V-trace (off-policy, torch) and GAE (on-policy, numpy).

GAE (Schulman et al. 2016): :func:`compute_advantages` gives the advantages and value
targets of one trajectory fragment with RLlib's semantics (``use_gae``, ``use_critic``);
:func:`discount_cumsum` is its discounted suffix sum.

V-trace (Espeholt et al. 2018, "IMPALA"), as pure torch functions.

All tensors are time-major: ``[T, B]`` (time first, then independent sequences). The
targets are computed with one backward scan over time; nothing here loops over the batch.

For a sequence ``x_0 .. x_{T-1}`` with bootstrap state ``x_T`` the paper defines

    v_s = V(x_s) + sum_{t >= s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
    delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))

with truncated importance weights ``rho_t = min(rho_bar, pi/mu)`` and
``c_i = min(c_bar, pi/mu)``, which gives the recursion used here:

    v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})).

``gamma_t`` is a per-step discount, so ``discounts = gamma * (1 - terminated)`` ends the
trace at episode ends.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class VTraceReturns(NamedTuple):
    """V-trace outputs, both ``[T, B]`` and without gradient.

    ``vs``: the value targets ``v_s``. ``pg_advantages``: the policy-gradient advantages
    ``rho^pg_s (r_s + gamma_s v_{s+1} - V(x_s))``.
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor


@torch.no_grad()
def vtrace_from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace value targets and policy-gradient advantages.

    Args:
        log_rhos: ``[T, B]`` log importance ratios ``log pi(a_t|x_t) - log mu(a_t|x_t)``.
        discounts: ``[T, B]`` per-step discounts (0 where the episode terminated at ``t``).
        rewards: ``[T, B]`` rewards.
        values: ``[T, B]`` baseline values ``V(x_t)``.
        bootstrap_value: ``[B]`` value of the state after the last step, ``V(x_T)``.
        clip_rho_threshold: ``rho_bar`` for the value targets; ``None`` disables clipping.
        clip_pg_rho_threshold: clip of the importance weight in the policy-gradient
            advantage; ``None`` disables clipping.
        clip_c_threshold: ``c_bar`` for the trace coefficients (1.0 in the paper and RLlib).

    Returns:
        ``VTraceReturns(vs, pg_advantages)``, both ``[T, B]``, detached from the graph.
    """
    _check_shapes(log_rhos, discounts, rewards, values, bootstrap_value)
    rhos = torch.exp(log_rhos)
    clipped_rhos = _clip(rhos, clip_rho_threshold)
    cs = _clip(rhos, clip_c_threshold)

    values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_next - values)
    decay = discounts * cs

    vs = values + discounted_suffix_sums(deltas, decay)

    vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_rhos = _clip(rhos, clip_pg_rho_threshold)
    pg_advantages = pg_rhos * (rewards + discounts * vs_next - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def discounted_suffix_sums(deltas: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """``acc_t = deltas_t + decay_t * acc_{t+1}`` (``acc_T = 0``) over time-major inputs,
    without a Python loop over time.

    Unrolled, ``acc_t = sum_{k >= t} (prod_{i=t}^{k-1} decay_i) deltas_k``. The products
    form a ``[T, T, ...]`` upper-triangular matrix built with one ``cumprod``: row ``t``
    multiplies ``decay`` from ``t`` on (ones before ``t``). Zeros in ``decay`` (episode ends)
    just zero the products past them; nothing is divided. Memory is ``T^2 * B`` floats,
    small for the sequence lengths V-trace uses.
    """
    horizon = deltas.shape[0]
    with torch.no_grad():
        steps = torch.arange(horizon, device=deltas.device)
        before = (steps.view(-1, 1) > steps.view(1, -1))  # [t, i]: i < t
        shape = (horizon, horizon) + (1,) * (decay.dim() - 1)
        factors = decay.unsqueeze(0).expand(horizon, *decay.shape).clone()
        factors[before.view(shape).expand_as(factors)] = 1.0
        # prods[t, k] = prod_{i=t}^{k} decay_i for k >= t; shift so weights[t, k] holds the
        # product up to k - 1 (1 on the diagonal), and zero everything below it.
        prods = torch.cumprod(factors, dim=1)
        weights = torch.ones_like(prods)
        weights[:, 1:] = prods[:, :-1]
        weights[before.view(shape).expand_as(weights)] = 0.0
        return torch.einsum("tk...,k...->t...", weights, deltas)


def _clip(rhos: torch.Tensor, threshold: float | None) -> torch.Tensor:
    return rhos if threshold is None else torch.clamp(rhos, max=float(threshold))


def _check_shapes(log_rhos: torch.Tensor, discounts: torch.Tensor, rewards: torch.Tensor,
                  values: torch.Tensor, bootstrap_value: torch.Tensor) -> None:
    if values.dim() < 1:
        raise ValueError("values must be time-major with at least one dimension [T, ...]")
    for name, tensor in (("log_rhos", log_rhos), ("discounts", discounts),
                         ("rewards", rewards)):
        if tensor.shape != values.shape:
            raise ValueError(
                f"{name} must have the shape of values {tuple(values.shape)}, "
                f"got {tuple(tensor.shape)}"
            )
    if bootstrap_value.shape != values.shape[1:]:
        raise ValueError(
            f"bootstrap_value must have shape {tuple(values.shape[1:])} (values without the "
            f"time dimension), got {tuple(bootstrap_value.shape)}"
        )


def discount_cumsum(values: np.ndarray, discount: float) -> np.ndarray:
    """``out[t] = sum_k discount**k * values[t + k]`` (float32), by a reverse recursion."""
    out = np.empty(len(values), dtype=np.float64)
    running = 0.0
    for t, value in zip(range(len(values) - 1, -1, -1), values[::-1].tolist()):
        running = value + discount * running
        out[t] = running
    return out.astype(np.float32)


def compute_advantages(rewards: np.ndarray, vf_preds: np.ndarray | None, last_value: float,
                       gamma: float, lambda_: float, use_gae: bool = True,
                       use_critic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets of one trajectory fragment (RLlib's semantics).

    ``last_value`` is the bootstrap value after the last step (0 when it terminated).
    GAE: ``delta_t = r_t + gamma V_{t+1} - V_t``, advantages the (gamma lambda)-discounted
    sum of deltas, targets advantages + V. Without GAE: discounted returns R (with the
    bootstrap) minus V, targets R. Without a critic: advantages R, targets 0.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if use_gae:
        if not use_critic or vf_preds is None:
            raise ValueError("use_gae=True needs use_critic=True and vf_preds")
        values = np.append(np.asarray(vf_preds, dtype=np.float64), last_value)
        deltas = rewards + gamma * values[1:] - values[:-1]
        advantages = discount_cumsum(deltas, gamma * lambda_)
        return advantages, (advantages + values[:-1]).astype(np.float32)
    returns = discount_cumsum(np.append(rewards, last_value), gamma)[:-1]
    if use_critic:
        if vf_preds is None:
            raise ValueError("use_critic=True needs vf_preds")
        return (returns - np.asarray(vf_preds, dtype=np.float32)).astype(np.float32), returns
    return returns, np.zeros_like(returns)
