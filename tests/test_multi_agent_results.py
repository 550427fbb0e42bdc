"""The published connect-four results (docs/results, made by
benchmarks/multiagent_learning.py) read back whole and say what the docs quote: the
learner's threshold, its evaluated win rate far above a random first player's, and the
same figures in docs/learning.md and docs/multi-agent.md."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STEMS = ("ppo-pettingzoo.classic.connect_four_v3", "apex-pettingzoo.classic.connect_four_v3")


@pytest.mark.parametrize("stem", STEMS)
def test_the_connect_four_result_reads_back_and_matches_the_docs(stem):
    def _result_file(suffix: str) -> Path:
        return REPO / "docs" / "results" / f"{stem}{suffix}"

    result = json.loads(_result_file(".json").read_text())
    assert result["env"] == "pettingzoo.classic.connect_four_v3"
    assert result["config"] == f"examples/connect-four-{result['algorithm']}.yaml"
    assert (REPO / result["config"]).is_file()
    reached = result["thresholds"]["0.9"]
    assert reached is not None and result["final_return"] >= 0.9
    evaluation, baseline = result["evaluation"], result["baseline"]
    assert evaluation["games"] == baseline["games"] == 1000
    for outcome in (evaluation, baseline):
        total = outcome["win_rate"] + outcome["draw_rate"] + outcome["loss_rate"]
        assert abs(total - 1.0) < 1e-3
    assert evaluation["win_rate"] > 0.9 > 0.6 > baseline["win_rate"] > 0.5
    with open(_result_file(".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert int(rows[-1]["env_steps"]) == reached["env_steps"] == result["env_steps"]
    assert _result_file(".png").stat().st_size > 1000
    win, random_win = f"{evaluation['win_rate']:.1%}", f"{baseline['win_rate']:.1%}"
    steps = f"{round(reached['env_steps'] / 1000)}k"
    for page in ("learning.md", "multi-agent.md"):
        text = (REPO / "docs" / page).read_text()
        assert win in text and random_win in text and steps in text, page
