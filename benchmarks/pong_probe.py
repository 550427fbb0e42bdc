"""What a Pong checkpoint's actor-critic has learned, beyond its score.

    python benchmarks/pong_probe.py CHECKPOINT_OR_RESULTS_DIR [--rounds N]

Plays ``N`` x 50 steps in 10 envs with the checkpoint's policy (sampling, as a worker does),
reading the ball and paddle positions from the Atari RAM (ball x 49, ball y 54, the agent's
paddle y 51; its centre is about 9 below that), and prints one JSON object:

- ``units_alive``: per activation of the policy (and value) encoder, how many channels are
  positive for at least one of the first round's 500 frames: a relu unit that is never
  positive passes no gradient and stays dead;
- ``log_prob_std_across_states``: per action, the standard deviation of the policy's log
  probability over the rows played: near zero means the policy ignores the screen;
- ``by_ball_offset``: for frames where the ball comes toward the agent's half, binned by the
  ball's height minus the paddle centre: ``p_up_minus_p_down`` (a policy that tracks the
  ball is positive for a ball above, negative below) and ``adv_up_minus_adv_down``, the
  mean V-trace policy-gradient advantage of up actions minus down actions, computed by the
  IMPALA loss itself on the rounds played (the signal the policy is trained on);
- ``state_dependence``: max - min of ``p_up_minus_p_down`` over the bins.

It is how issue 21's diagnosis was measured (see docs/learning.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import actorrl.policy.impala as impala  # noqa: E402
from actorrl.envs.atari import make_atari  # noqa: E402
from actorrl.experiment.evaluate import load_checkpoint_policy  # noqa: E402

NUM_ENVS, HORIZON = 10, 50
UP, DOWN = [2, 4], [3, 5]  # RIGHT(FIRE) moves Pong's paddle up, LEFT(FIRE) down
BINS = ((-200, -40), (-40, -15), (-15, 0), (0, 15), (15, 40), (40, 200))
PADDLE_CENTRE = 9


def units_alive(encoder: nn.Module, frames: torch.Tensor) -> list[str]:
    """``alive/total`` channels after each activation of a ConvEncoder."""
    x = frames if encoder.channels_first else frames.permute(0, 3, 1, 2)
    x = x.float() * encoder.scale
    out = []
    for layer in encoder.layers:
        x = layer(x)
        if isinstance(layer, (nn.ReLU, nn.ELU, nn.SiLU, nn.Tanh)):
            positive = (x > 0).flatten(2).any(-1) if x.dim() == 4 else x > 0
            alive = positive.any(0)
            out.append(f"{int(alive.sum())}/{alive.numel()}")
    return out


def play(policy: Any, env_id: str, env_config: dict[str, Any], rounds: int
         ) -> dict[str, np.ndarray]:
    """Rounds of ``HORIZON`` steps in ``NUM_ENVS`` envs; per row the RAM positions, the
    action, the policy's probabilities and the loss's pg advantage; and the first round's
    frames."""
    envs = [make_atari(env_id, env_config) for _ in range(NUM_ENVS)]
    captured: dict[str, torch.Tensor] = {}
    original = impala.vtrace_from_importance_weights

    def spy(**kwargs: Any) -> Any:
        result = original(**kwargs)
        captured["pg"] = result.pg_advantages
        return result

    impala.vtrace_from_importance_weights = spy
    obs = [np.asarray(e.reset(seed=i)[0]) for i, e in enumerate(envs)]
    episode, step_in_episode, previous_x = list(range(NUM_ENVS)), [0] * NUM_ENVS, [0] * NUM_ENVS
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("ram", "actions", "probs", "adv")}
    frames: list[np.ndarray] = []
    try:
        for _ in range(rounds):
            cols: dict[str, list[list[Any]]] = {k: [[] for _ in range(NUM_ENVS)] for k in (
                "obs", "new_obs", "actions", "rewards", "terminateds", "truncateds",
                "action_logp", "eps_id", "t", "ram", "probs")}
            for _ in range(HORIZON):
                actions, extra = policy.compute_actions(np.stack(obs))
                probs = torch.softmax(torch.as_tensor(extra["action_dist_inputs"]), -1).numpy()
                for i, env in enumerate(envs):
                    ram = env.unwrapped.ale.getRAM()
                    cols["ram"][i].append((int(ram[49]), int(ram[54]), int(ram[51]),
                                           previous_x[i]))
                    previous_x[i] = int(ram[49])
                    new_obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
                    for key, value in (("obs", obs[i]), ("new_obs", np.asarray(new_obs)),
                                       ("actions", actions[i]), ("rewards", reward),
                                       ("terminateds", terminated), ("truncateds", truncated),
                                       ("action_logp", extra["action_logp"][i]),
                                       ("eps_id", episode[i]), ("t", step_in_episode[i]),
                                       ("probs", probs[i])):
                        cols[key][i].append(value)
                    step_in_episode[i] += 1
                    if terminated or truncated:
                        new_obs, _ = env.reset()
                        episode[i] += NUM_ENVS
                        step_in_episode[i], previous_x[i] = 0, 0
                    obs[i] = np.asarray(new_obs)
            joined = {k: np.concatenate([np.asarray(c) for c in v]) for k, v in cols.items()}
            batch = {k: torch.as_tensor(v) for k, v in joined.items()
                     if k not in ("ram", "probs")}
            batch["rewards"] = batch["rewards"].float()
            with torch.no_grad():
                policy.loss(policy.model, batch)
            rows["adv"].append(impala.from_time_major(captured["pg"], len(joined["actions"]))
                               .numpy())
            for key in ("ram", "actions", "probs"):
                rows[key].append(joined[key])
            if not frames:
                frames.append(joined["obs"])
    finally:
        impala.vtrace_from_importance_weights = original
        for env in envs:
            env.close()
    return {"frames": frames[0], **{k: np.concatenate(v) for k, v in rows.items()}}


def main() -> None:
    """Probe the checkpoint and print the JSON object described in the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_checkpoint_policy(args.checkpoint)
    played = play(loaded.policy, loaded.env, loaded.env_config, args.rounds)
    ball_x, ball_y, paddle_y, previous_x = played["ram"].T
    offset = ball_y - paddle_y - PADDLE_CENTRE
    coming = (ball_y > 0) & (previous_x > 0) & (ball_x > previous_x) & (ball_x > 120)
    p_up = played["probs"][:, UP].sum(1) - played["probs"][:, DOWN].sum(1)
    up, down = np.isin(played["actions"], UP), np.isin(played["actions"], DOWN)
    bins = []
    for low, high in BINS:
        sel = coming & (offset >= low) & (offset < high)
        adv = (float(played["adv"][sel & up].mean() - played["adv"][sel & down].mean())
               if (sel & up).any() and (sel & down).any() else None)
        bins.append({"ball_minus_paddle": [low, high], "rows": int(sel.sum()),
                     "p_up_minus_p_down": float(p_up[sel].mean()) if sel.any() else None,
                     "adv_up_minus_adv_down": adv})
    model = loaded.policy.model
    frames = torch.as_tensor(played["frames"])
    with torch.no_grad():
        alive = {"policy": units_alive(model.encoder, frames)}
        if getattr(model, "value_encoder", None) is not None:
            alive["value"] = units_alive(model.value_encoder, frames)
    probes = [b["p_up_minus_p_down"] for b in bins if b["p_up_minus_p_down"] is not None]
    print(json.dumps({
        "checkpoint": loaded.checkpoint,
        "timesteps_total": loaded.timesteps_total,
        "rows": int(len(played["actions"])),
        "units_alive": alive,
        "log_prob_std_across_states": [round(float(s), 6) for s in np.log(
            played["probs"] + 1e-12).std(0)],
        "by_ball_offset": bins,
        "state_dependence": (max(probes) - min(probes)) if probes else None,
    }, indent=2))


if __name__ == "__main__":
    main()
