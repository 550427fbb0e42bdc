"""V-trace against a direct numpy evaluation of the paper's definition (eq. 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actorrl.policy.advantages import vtrace_from_importance_weights


def paper_vtrace(log_rhos: np.ndarray, discounts: np.ndarray, rewards: np.ndarray,
                 values: np.ndarray, bootstrap: np.ndarray, rho_bar: float | None,
                 pg_rho_bar: float | None, c_bar: float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Slow reference: the explicit double sum of eq. 1, one sequence and one s at a time.

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) rho_t delta_t, with
    delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t) and V(x_T) the bootstrap value.
    """
    horizon, batch = values.shape
    ratios = np.exp(log_rhos.astype(np.float64))
    vs = np.zeros((horizon, batch))
    adv = np.zeros((horizon, batch))
    for b in range(batch):
        v_ext = np.append(values[:, b], bootstrap[b]).astype(np.float64)
        for s in range(horizon):
            total = 0.0
            for t in range(s, horizon):
                coef = 1.0
                for i in range(s, t):
                    coef *= discounts[i, b] * min(c_bar, ratios[i, b])
                rho_t = ratios[t, b] if rho_bar is None else min(rho_bar, ratios[t, b])
                delta_t = rewards[t, b] + discounts[t, b] * v_ext[t + 1] - v_ext[t]
                total += coef * rho_t * delta_t
            vs[s, b] = v_ext[s] + total
        for s in range(horizon):
            v_next = vs[s + 1, b] if s + 1 < horizon else bootstrap[b]
            rho_pg = ratios[s, b] if pg_rho_bar is None else min(pg_rho_bar, ratios[s, b])
            adv[s, b] = rho_pg * (rewards[s, b] + discounts[s, b] * v_next - values[s, b])
    return vs, adv


def random_inputs(seed: int, horizon: int = 7, batch: int = 5) -> dict[str, np.ndarray]:
    """Random V-trace inputs with log-ratios spread around 0 and some episode ends."""
    rng = np.random.default_rng(seed)
    terminated = rng.random((horizon, batch)) < 0.2
    return {
        "log_rhos": rng.normal(0.0, 1.0, (horizon, batch)),
        "discounts": 0.9 * (1.0 - terminated),
        "rewards": rng.normal(0.0, 1.0, (horizon, batch)),
        "values": rng.normal(0.0, 1.0, (horizon, batch)),
        "bootstrap": rng.normal(0.0, 1.0, (batch,)),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("rho_bar", "pg_rho_bar"), [(1.0, 1.0), (0.7, 1.3), (None, None), (2.0, 0.5)]
)
def test_matches_paper_recursion(seed: int, rho_bar: float | None,
                                 pg_rho_bar: float | None) -> None:
    """The backward scan equals the explicit sum of eq. 1 for any clipping thresholds and
    with discounts of 0 at episode ends."""
    x = random_inputs(seed)
    assert (x["discounts"] == 0).any(), "the data must contain episode ends"
    expected_vs, expected_adv = paper_vtrace(
        x["log_rhos"], x["discounts"], x["rewards"], x["values"], x["bootstrap"],
        rho_bar, pg_rho_bar,
    )
    out = vtrace_from_importance_weights(
        torch.as_tensor(x["log_rhos"]), torch.as_tensor(x["discounts"]),
        torch.as_tensor(x["rewards"]), torch.as_tensor(x["values"]),
        torch.as_tensor(x["bootstrap"]),
        clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar,
    )
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_reduces_to_n_step_returns() -> None:
    """With pi == mu (log_rhos = 0) v_s is the discounted n-step return bootstrapped from
    V(x_T), independent of the baseline values."""
    rng = np.random.default_rng(3)
    horizon, gamma = 6, 0.95
    rewards = rng.normal(size=(horizon, 2))
    bootstrap = rng.normal(size=(2,))
    out = vtrace_from_importance_weights(
        torch.zeros(horizon, 2, dtype=torch.float64),
        torch.full((horizon, 2), gamma, dtype=torch.float64),
        torch.as_tensor(rewards), torch.as_tensor(rng.normal(size=(horizon, 2))),
        torch.as_tensor(bootstrap),
    )
    expected = np.zeros((horizon, 2))
    ret = bootstrap.copy()
    for t in range(horizon - 1, -1, -1):
        ret = rewards[t] + gamma * ret
        expected[t] = ret
    np.testing.assert_allclose(out.vs.numpy(), expected, rtol=1e-12)


def test_outputs_carry_no_gradient() -> None:
    """Targets are constants for the loss: no graph is attached even if inputs need grad."""
    values = torch.zeros(3, 2, requires_grad=True)
    out = vtrace_from_importance_weights(
        torch.zeros(3, 2), torch.ones(3, 2), torch.ones(3, 2), values, torch.zeros(2)
    )
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


def test_shape_mismatch_is_a_clear_error() -> None:
    """Wrongly shaped inputs name the offending argument."""
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace_from_importance_weights(
            torch.zeros(3, 2), torch.ones(3, 2), torch.ones(3, 2), torch.zeros(3, 2),
            torch.zeros(3),
        )
    with pytest.raises(ValueError, match="rewards"):
        vtrace_from_importance_weights(
            torch.zeros(3, 2), torch.ones(3, 2), torch.ones(2, 3), torch.zeros(3, 2),
            torch.zeros(2),
        )
