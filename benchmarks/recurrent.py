"""Recurrent policies: what the LSTM costs in env steps/s, and what it learns.

Prints one JSON object. In the same run, IMPALA with and without ``use_lstm`` on CartPole-v1
and on Pong (``examples/pong-impala.yaml`` and ``examples/pong-impala-lstm.yaml``), each
trained for a fixed time through ``actorrl train`` as a user runs it, twice, alternating
feed-forward and LSTM: mean env steps/s after the first result (start-up excluded),
each round's ratio in ``lstm_over_ff_per_round``, and ``lstm_over_ff_cartpole`` /
``lstm_over_ff_pong``, the LSTM's rate over the feed-forward one (aim: >= 0.7). Then
``examples/stateless-cartpole-impala-lstm.yaml`` trains until a mean return of 150:
``stateless_steps_to_150`` and ``stateless_seconds_to_150`` (null if not reached in the
cap).

    python benchmarks/recurrent.py [--quick]       # --quick: under 5 minutes
    python benchmarks/recurrent.py --quick --only cartpole   # one part (others null)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, str(REPO))

from actorrl.experiment.results import read_results  # noqa: E402
from benchmarks.end_to_end import finite  # noqa: E402

CARTPOLE = ["--env", "CartPole-v1", "--set", "num_envs_per_worker=4",
            "--set", "rollout_fragment_length=20", "--set", "train_batch_size=160",
            "--set", "model={\"fcnet_hiddens\": [64]}"]
CARTPOLE_LSTM = ["--set", "model={\"fcnet_hiddens\": [64], \"use_lstm\": true, "
                 "\"lstm_cell_size\": 64, \"max_seq_len\": 20}"]


PARTS = ("cartpole", "pong", "stateless")
"""The benchmark's parts, in the order they run (``--only`` picks some)."""


def train(args: list[str], seconds: float, workdir: Path, stop_reward: str = "none"
          ) -> list[dict[str, Any]]:
    """``actorrl train impala ARGS`` for ``seconds`` of training; its results."""
    output = Path(tempfile.mkdtemp(dir=workdir))
    command = [sys.executable, "-m", "actorrl.cli.main", "train", "impala", *args,
               "--stop-time", str(seconds), "--stop-reward", stop_reward,
               "--output", str(output), "--progress", "plain", "--checkpoint-every", "0"]
    subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=seconds + 240, check=False)
    [run] = [d for d in output.iterdir() if d.is_dir()]
    return read_results(run)


def steps_per_s(results: list[dict[str, Any]]) -> float | None:
    """Env steps/s from the first result to the last (the start-up left out)."""
    if len(results) < 2:
        return None
    first, last = results[0], results[-1]
    seconds = last["time_total_s"] - first["time_total_s"]
    return (last["timesteps_total"] - first["timesteps_total"]) / seconds if seconds else None


def first_reaching(results: list[dict[str, Any]], threshold: float) -> dict[str, Any] | None:
    """The first result whose mean return reached ``threshold``."""
    for result in results:
        reward = finite(result.get("episode_reward_mean"))
        if reward is not None and reward >= threshold:
            return result
    return None


def interleaved(ff_args: list[str], lstm_args: list[str], seconds: float, work: Path,
                rounds: int = 2) -> tuple[float | None, float | None, list[float | None]]:
    """Feed-forward and LSTM runs of ``seconds`` each, alternated ``rounds`` times (this
    machine's speed drifts from minute to minute; alternating spreads the drift over both):
    the mean env steps/s of each, and each round's LSTM-over-FF ratio."""
    ff_rates, lstm_rates = [], []
    for _ in range(rounds):
        ff_rates.append(steps_per_s(train(ff_args, seconds, work)))
        lstm_rates.append(steps_per_s(train(lstm_args, seconds, work)))

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v]
        return sum(known) / len(known) if len(known) == len(values) else None

    return (mean(ff_rates), mean(lstm_rates),
            [ratio(lstm, ff) for ff, lstm in zip(ff_rates, lstm_rates, strict=True)])


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` rounded, or None when either is missing."""
    return round(numerator / denominator, 3) if numerator and denominator else None


def main() -> None:
    """Run the comparison and print the JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="under 5 minutes")
    parser.add_argument("--only", choices=PARTS, action="append",
                        help="run only this part (repeatable); the others' keys are null")
    args = parser.parse_args()
    parts = set(args.only or PARTS)
    cartpole_s, pong_s, stateless_cap_s = (15, 25, 100) if args.quick else (30, 60, 300)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="recurrent-bench-") as tmp:
        work = Path(tmp)
        rates: dict[str, float | None] = dict.fromkeys(
            ("cartpole_ff", "cartpole_lstm", "pong_ff", "pong_lstm"))
        pair_ratios: dict[str, list[float | None]] = {"cartpole": [], "pong": []}
        if "cartpole" in parts:
            rates["cartpole_ff"], rates["cartpole_lstm"], pair_ratios["cartpole"] = \
                interleaved(CARTPOLE, CARTPOLE + CARTPOLE_LSTM, cartpole_s, work)
        if "pong" in parts:
            rates["pong_ff"], rates["pong_lstm"], pair_ratios["pong"] = interleaved(
                ["--config", "examples/pong-impala.yaml"],
                ["--config", "examples/pong-impala-lstm.yaml"], pong_s, work)
        stateless = train(["--config", "examples/stateless-cartpole-impala-lstm.yaml"],
                          stateless_cap_s, work, stop_reward="150") \
            if "stateless" in parts else []
    reached = first_reaching(stateless, 150.0)
    print(json.dumps({
        "benchmark": "recurrent",
        "quick": args.quick,
        "parts": [part for part in PARTS if part in parts],
        "env_steps_per_s": {k: round(v, 1) if v else None for k, v in rates.items()},
        "lstm_over_ff_cartpole": ratio(rates["cartpole_lstm"], rates["cartpole_ff"]),
        "lstm_over_ff_pong": ratio(rates["pong_lstm"], rates["pong_ff"]),
        "lstm_over_ff_per_round": pair_ratios,
        "target_lstm_over_ff": 0.7,
        "stateless_steps_to_150": reached["timesteps_total"] if reached else None,
        "stateless_seconds_to_150": round(reached["time_total_s"], 1) if reached else None,
        "stateless_best_return": max((r for r in (finite(x.get("episode_reward_mean"))
                                                  for x in stateless) if r is not None),
                                     default=None),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "elapsed_s": round(time.perf_counter() - started, 1),
    }))


if __name__ == "__main__":
    main()
